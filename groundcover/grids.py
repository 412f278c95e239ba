"""A paper's table as a grid of runs (one per model) with the published values beside ours."""

from __future__ import annotations

from .pipelines.runtime.execution.grid import ModelGrid, Published, cell_text, published_row

__all__ = [
    "ModelGrid",
    "Published",
    "cell_text",
    "published_row",
]
