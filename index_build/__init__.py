"""Corpora in, chunks, embeddings and index files out.

Not built yet (issue 4); the package exists so the layout matches the design.
"""
