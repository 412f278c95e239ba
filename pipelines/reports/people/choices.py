"""What a person labels a judging stage's unit with, and a label checked against it.

The labelling page (``view``), ``labels import`` and the ``--human`` file of ``agreement`` and
``cascade calibrate`` check every label here, so a label one of them refuses none of them takes.
Nothing here reads a run: a stage's rule (``Framework.panel_rule``) and its judged units come in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...runtime.contract.errors import UserError
from ...runtime.contract.panels import NOTHING_COVERED, Cover, Vote, cover_items, cover_label

SCORE = "score"  # the item's score: the stage a label of the whole item names
SCALE = (0.0, 0.25, 0.5, 0.75, 1.0)  # the score scale's buttons, keys 1-5


def score_choices() -> dict[str, Any]:
    """An item's score: a number from 0 to 1, the scale's usual values as buttons."""
    return {"kind": "number", "choices": list(SCALE), "low": 0.0, "high": 1.0}


def stage_choices(rule: Any, units: Sequence[Any]) -> dict[str, Any]:
    """What a person labels a judging stage with, from its rule and its judged units (each with
    ``values`` and ``combined``): ``labels`` (one of the stage's labels: those its rule declares,
    else those its judges gave and its tie), ``number`` (buttons for the usual values, any
    number accepted) or ``set`` (the numbers of the items it covers: "1, 3", or "none")."""
    if isinstance(rule, Cover):
        return {"kind": "set", "choices": [NOTHING_COVERED]}
    declared = getattr(rule, "choices", None)
    if declared:
        return {"kind": "labels", "choices": list(declared)}
    seen = {v for u in units for v in (*u.values, u.combined) if v is not None}
    if isinstance(rule, Vote):
        return {"kind": "labels", "choices": sorted(seen | {rule.tie}, key=str)}
    numbers = sorted(v for v in seen if isinstance(v, int | float))
    return {"kind": "number", "choices": numbers[:9], "low": None, "high": None}


def checked_label(label: Any, how: dict[str, Any]) -> Any:
    """A label as the stage takes it: one of its labels, a number in its range, or a set
    (written as its label: "1, 3"); anything else refused as ``label: ...``."""
    if how["kind"] == "set":
        try:
            return cover_label(cover_items(label))
        except ValueError as exc:
            raise UserError(f"label: {exc}") from None
    if how["kind"] == "labels":
        if label not in how["choices"]:
            raise UserError(f"label: one of {how['choices']}, got {label!r}")
        return label
    if not isinstance(label, int | float) or isinstance(label, bool) or not math.isfinite(label):
        raise UserError(f"label: a finite number, got {label!r}")
    low, high = how.get("low"), how.get("high")
    if (low is not None and label < low) or (high is not None and label > high):
        raise UserError(f"label: a score from {low} to {high}, got {label!r}")
    return float(label)


def written_label(label: Any, how: dict[str, Any]) -> Any:
    """A label as a file writes it (a spreadsheet's cell, a tool's choice, a line of JSON) in
    the stage's terms: a number written as text read as the number, a stage's label named by
    its text ("1" for the label 1) as that label; ``checked_label`` then checks it."""
    if how["kind"] == "number" and isinstance(label, str):
        try:
            label = float(label)
        except ValueError:
            raise UserError(f"label: a number, got {label!r}") from None
    if how["kind"] == "labels":
        label = {str(c): c for c in how["choices"]}.get(str(label), label)
    return label
