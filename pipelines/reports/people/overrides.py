"""A person's correction of one item's verdict, kept as a layer over the records.

``labels/overrides.jsonl`` in the run directory: one line per override or its withdrawal,
appended and never rewritten: ``{"id", "score", "reason", "annotator", "time", "judge"}``
(``judge``: the score the record holds, so an override says what it corrected), or
``{"id", "withdrawn": true, ...}``. The latest line for an item counts: an override is
reversible, and the history stays. ``results.jsonl`` is never rewritten: ``report``, the HTML
headline and ``compare`` show the judge's mean, the overridden mean and how many items were
overridden, apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....serving.files import UnsafePath, check_within
from ...runtime.contract.errors import UserError
from ...runtime.contract.results import ItemResult
from ...runtime.store.labels import TEXT_LIMIT
from .labels import append_labels_to, labels_dir

OVERRIDES = "overrides.jsonl"


@dataclass(frozen=True)
class Override:
    id: str
    score: float | None  # None: the item is overridden to "no score"
    reason: str
    annotator: str
    judge: float | None


def read_overrides(run_dir: Path) -> dict[str, Override]:
    """id -> the override in force (withdrawn ones are gone)."""
    path = labels_dir(run_dir) / OVERRIDES
    if not path.is_file():
        return {}
    try:  # a run from elsewhere may link the file, or labels/, to any file of the reader's
        check_within(path, run_dir)
    except UnsafePath as exc:
        raise UserError(str(exc)) from None
    from ...runtime.contract.readers import iter_jsonl

    found: dict[str, Override] = {}
    for lineno, row in iter_jsonl(path):
        item = str(row.get("id", ""))
        if not item:
            raise UserError(f"{path}:{lineno}: field id: missing")
        if row.get("withdrawn"):
            found.pop(item, None)
            continue
        score = row.get("score")
        if score is not None and not _in_scale(score):
            raise UserError(f"{path}:{lineno}: record {item!r}: field score: {score!r}")
        reason = str(row.get("reason", ""))[:TEXT_LIMIT]  # a sent run's reasons: capped too
        found[item] = Override(item, score, reason, str(row.get("annotator", "")), row.get("judge"))
    return found


def add_override(
    run_dir: Path,
    records: dict[str, ItemResult],
    item: str,
    score: float | None,
    reason: str,
    annotator: str,
) -> Override:
    """Record one override (a reason is required: an override nobody can explain is noise)."""
    if item not in records:
        raise UserError(f"{item!r}: not an item of {run_dir}")
    reason = reason.strip()[:TEXT_LIMIT]  # capped as a note is
    if not reason:
        raise UserError("an override needs a reason (--reason)")
    if score is not None and not _in_scale(score):
        raise UserError(f"--score must be a number from 0 to 1, got {score!r}")
    judge = records[item].score
    line = {"id": item, "score": score, "reason": reason, "annotator": annotator, "judge": judge}
    append_labels_to(run_dir, OVERRIDES, [line])
    return Override(item, score, reason, annotator, judge)


def withdraw_override(run_dir: Path, item: str, annotator: str) -> None:
    if item not in read_overrides(run_dir):
        raise UserError(f"{item!r} has no override in force in {run_dir}")
    append_labels_to(run_dir, OVERRIDES, [{"id": item, "withdrawn": True, "annotator": annotator}])


def overridden(records: Iterable[ItemResult], overrides: dict[str, Override]) -> dict[str, Any]:
    """The judge's mean, the mean with the overrides in force, and how many there are."""
    judge, corrected = [], []
    applied = 0
    for record in records:
        if record.score is not None:
            judge.append(record.score)
        found = overrides.get(record.id)
        if found is not None:
            applied += 1
            if found.score is not None:
                corrected.append(found.score)
        elif record.score is not None:
            corrected.append(record.score)
    return {
        "overrides": applied,
        "judge_mean": sum(judge) / len(judge) if judge else None,
        "overridden_mean": sum(corrected) / len(corrected) if corrected else None,
        "overridden_scored": len(corrected),
    }


def _in_scale(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0.0 <= value <= 1.0
    )


def override_summary(run_dir: Path, records: Iterable[ItemResult]) -> dict[str, Any] | None:
    """``overridden`` for a run with overrides in force (None without any)."""
    found = read_overrides(run_dir)
    return overridden(records, found) if found else None


def override_line(summary: dict[str, Any]) -> str:
    """One line for a terminal or a page: the two means apart, and how many overrides."""
    judge, corrected = summary["judge_mean"], summary["overridden_mean"]
    shown = [f"{v:.4f}" if v is not None else "-" for v in (judge, corrected)]
    return (
        f"overridden by people: {summary['overrides']} items; judge's mean {shown[0]}, "
        f"with the overrides {shown[1]} (labels/overrides.jsonl; the records are unchanged)"
    )
