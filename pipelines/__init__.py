"""Evaluation pipelines, run store, configuration and the groundcover CLI."""
