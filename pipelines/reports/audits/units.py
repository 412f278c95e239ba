"""What every trust report reads a run's judgements as: a unit per judged answer, the panel's,
the judge cascade's and a lone judge's with its confidence. ``agreement`` and ``cascade`` both
read them here, so neither imports the other for them (``agreement`` shows what ``cascade``
reports of a run; nothing goes back)."""

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


def lone_units(records: Sequence[Any]) -> dict[str, list[Unit]]:
    """Per stage, each judgement a lone judge gave with ``--confidence logprobs``, or an NLI
    model scored in a judge's place (``details["confidence"]``): one rater, its label, in record
    order; whether the endpoint gave a probability or not, people label the judgement."""
    out: dict[str, list[Unit]] = defaultdict(list)
    for record in records:
        for key, entry in numbered(record.details.get("confidence") or []):
            stage, value = entry["stage"], entry.get("value")
            out[stage].append(Unit(record.id, stage, key, [value], value))
    return dict(out)


def judged_units(records: Sequence[Any]) -> dict[str, list[Unit]]:
    """Per stage, every unit a panel, a judge cascade, a lone judge with a confidence or an NLI
    model in a judge's place decided (in record order): what people label. A cascade's unit
    holds the members of the last tier it asked, and its verdict, None where every tier
    abstained (runtime.contract.cascade)."""
    out = {stage: list(units) for stage, units in panel_units(records).items()}
    for stage, units in lone_units(records).items():
        out.setdefault(stage, []).extend(units)
    for record in records:
        for key, entry in numbered(record.details.get("cascade") or []):
            stage, last = entry["stage"], (entry.get("tiers") or [{}])[-1]
            values = list(last.get("members") or [])
            judged = None if entry.get("kept") == PEOPLE else entry.get("value")  # theirs
            out.setdefault(stage, []).append(Unit(record.id, stage, key, values, judged))
    return out
