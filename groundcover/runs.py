"""Run directories, read and written as the runtime does: the manifest and results files
(``MANIFEST``, ``RESULTS``, ``read_manifest``, ``results_by_id``), an atomic write, and one item
solved outside a run (``solve_item``)."""

from __future__ import annotations

from .pipelines.runtime.execution.solve import solve_item
from .pipelines.runtime.store.run_dir import (
    MANIFEST,
    RESULTS,
    atomic_write_json,
    read_manifest,
    results_by_id,
)

__all__ = [
    "MANIFEST",
    "RESULTS",
    "atomic_write_json",
    "read_manifest",
    "results_by_id",
    "solve_item",
]
