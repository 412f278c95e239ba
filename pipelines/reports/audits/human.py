"""``--human FILE`` of ``agreement`` and ``cascade calibrate``: people's labels given beside the
runs, JSON Lines ``{"id", "stage", "label"[, "key"]}`` (``key``: the unit's number within the
item's stage, from 0, default 0; stage ``score`` labels an item's score, from 0 to 1).

Each line is checked against the runs it is read for, as ``labels import`` and the labelling
page check a label (``people.choices``): its id an item of a run; for a stage a run judges, its
key one of the item's units of that stage and its label one the stage takes (one of its labels,
a number in its range, a set "1, 3"), kept as the stage takes it. One line names the file, the
line, the record and the field that is wrong, and nothing is read on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...runtime.contract.errors import UserError
from ...runtime.contract.readers import iter_jsonl
from ...runtime.store.labels import checked_label_row
from ..people.choices import SCORE, checked_label, score_choices, stage_choices, written_label
from .units import judged_units

Place = tuple[str, str, int]  # (item id, stage, key)


class HumanLabels(dict[Place, Any]):
    """(item id, stage, key) -> the label, with the file and each label's line in it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.lines: dict[Place, int] = {}

    def where(self, place: Place) -> str:
        return f"{self.path}:{self.lines[place]}: record {place[0]!r}"


def read_human(path: Path, runs: Sequence[Path] | None = None) -> HumanLabels:
    """``--human FILE``: (item id, stage, key) -> label; with ``runs``, each label checked
    against them (``check_human``). A bad line stops with one error naming it."""
    labels = HumanLabels(path)
    for lineno, row in iter_jsonl(path):
        where = f"{path}:{lineno}"
        _, _, key = checked_label_row(row, where)
        label, named = row["label"], f"{where}: record {str(row['id'])!r}: field label"
        if row["stage"] == SCORE and not _number(label):
            raise UserError(f"{named}: a score label is a number, got {label!r}")
        if row["stage"] == SCORE:
            label = _checked(named, label, score_choices())
        place = (str(row["id"]), row["stage"], key)
        if place in labels:
            raise UserError(f"{where}: record: id {row['id']!r} stage {row['stage']!r} twice")
        labels[place], labels.lines[place] = label, lineno
    if not labels:
        raise UserError(f"{path}: no human labels")
    if runs is not None:
        check_human(labels, runs)
    return labels


@dataclass
class RunJudged:
    """What a run says a label may be: its items, and per stage it judges what a person labels
    it with and the units (item, key) it judged."""

    run: Path
    items: set[str]
    choices: dict[str, dict[str, Any]]
    units: dict[str, set[tuple[str, int]]]


def run_judged(run_dir: Path) -> RunJudged:
    from ...runtime.contract.plugins import run_framework
    from ...runtime.store.run_dir import MANIFEST, RESULTS, read_manifest, results_by_id

    manifest = read_manifest(run_dir / MANIFEST)
    fw = run_framework(manifest, run_dir)
    records = list(results_by_id(run_dir / RESULTS))
    stages = judged_units(records)
    return RunJudged(
        run_dir,
        {r.id for r in records},
        {stage: stage_choices(fw.panel_rule(stage), units) for stage, units in stages.items()},
        {stage: {(u.item, u.key) for u in units} for stage, units in stages.items()},
    )


def check_human(labels: HumanLabels, runs: Sequence[Path]) -> None:
    """Each label, in the file's order, against the runs: its id an item of one of them; for
    a stage the runs with the item judge, its key a unit of the item's stage and its label one
    the stage takes (kept as it takes it: "3,1" as "1, 3", "1" as the label 1) in one of them
    (tiers over the same items: a label one tier's judges never gave, another's did). The
    first that is not stops with one line naming it."""
    judged = [run_judged(run) for run in runs]
    named = str(runs[0]) if len(runs) == 1 else "any run given"
    for place in sorted(labels, key=labels.lines.__getitem__):
        item, stage, key = place
        where = labels.where(place)
        having = [run for run in judged if item in run.items]
        if not having:
            raise UserError(f"{where}: field id: not an item of {named}")
        judging = [run for run in having if stage in run.choices]
        if not judging:
            continue  # no run here judges the stage: nothing says what its label may be
        if not any((item, key) in run.units[stage] for run in judging):
            raise UserError(f"{where}: field key: item {item!r} has no unit {key} of {stage}")
        hows = [run.choices[stage] for run in judging]
        labels[place] = _taken(f"{where}: field label", labels[place], hows)


def _taken(named: str, label: Any, hows: Sequence[dict[str, Any]]) -> Any:
    """``label`` as the first of ``hows`` that takes it takes it, else the first's refusal."""
    refusals = []
    for how in hows:
        try:
            return _checked(named, label, how)
        except UserError as exc:
            refusals.append(exc)
    raise refusals[0]


def _checked(named: str, label: Any, how: dict[str, Any]) -> Any:
    """``label`` as the stage takes it, or one line (``named``: the file, line, record and
    field) saying why not."""
    try:
        return checked_label(written_label(label, how), how)
    except UserError as exc:
        raise UserError(f"{named}: {str(exc).removeprefix('label: ')}") from None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
