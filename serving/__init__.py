"""Serving layer: model registry, vLLM launcher, the evaluator client.

Depends on nothing else of ours.
"""
