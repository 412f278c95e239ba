"""Where a framework's NLI cross-encoder runs: here, on a Ray Serve app, or on Ray actors of its own
(the options and flags every framework with one shares)."""

from __future__ import annotations

from .pipelines.runtime.contract.commands import NLI_PLACEMENT
from .pipelines.runtime.execution.nli_placement import PLACEMENT_FIELDS, NliPlacement, placement_of

__all__ = [
    "NLI_PLACEMENT",
    "NliPlacement",
    "PLACEMENT_FIELDS",
    "placement_of",
]
