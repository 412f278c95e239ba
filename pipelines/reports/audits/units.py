"""What every trust report reads a run's judgements as: a unit per judged answer, the panel's
and the judge cascade's. ``agreement`` and ``cascade`` both read them here, so neither imports
the other for them (``agreement`` shows what ``cascade`` reports of a run; nothing goes back)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...runtime.contract.cascade import PEOPLE
from ...runtime.contract.panels import numbered


@dataclass
class Unit:
    """One judged answer: the item, the stage, its number within the item's stage, and each
    rater's value (None: that rater gave none)."""

    item: str
    stage: str
    key: int
    values: list[Any]
    combined: Any = None


def panel_units(records: Sequence[Any]) -> dict[str, list[Unit]]:
    """Per stage, the panel's units of the recorded items (in record order)."""
    out: dict[str, list[Unit]] = defaultdict(list)
    for record in records:
        for key, entry in numbered(record.details.get("panel") or []):
            stage = entry["stage"]
            out[stage].append(
                Unit(record.id, stage, key, list(entry["members"]), entry.get("value"))
            )
    return dict(out)


def judged_units(records: Sequence[Any]) -> dict[str, list[Unit]]:
    """Per stage, every unit a panel or a judge cascade decided (in record order): what people
    label. A cascade's unit holds the members of the last tier it asked, and its verdict, None
    where every tier abstained (runtime.contract.cascade)."""
    out = {stage: list(units) for stage, units in panel_units(records).items()}
    for record in records:
        for key, entry in numbered(record.details.get("cascade") or []):
            stage, last = entry["stage"], (entry.get("tiers") or [{}])[-1]
            values = list(last.get("members") or [])
            judged = None if entry.get("kept") == PEOPLE else entry.get("value")  # theirs
            out.setdefault(stage, []).append(Unit(record.id, stage, key, values, judged))
    return out
