"""Searching what index_build/ wrote: BM25, FAISS, hybrid fusion, MMR, rerankers, NLI grounding.

Not built yet (issue 4); the package exists so the layout matches the design.
"""
