"""People's labels of a run as the runtime reads them: ``labels/labels.jsonl`` (written by
``view``, ``labels import`` and ``reports.people.labels``), each unit's label combined over its
annotators. The runtime reads them where a judge cascade abstained: a judgement people decided
is theirs on a resume (``runtime.contract.cascade``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ....serving import files
from ....serving.files import UnsafePath, make_dirs
from ..contract.errors import UserError

LABELS_DIR = "labels"
LABELS = "labels.jsonl"
TEXT_LIMIT = 2000  # characters of a person's note or an override's reason that are kept


def labels_dir(run_dir: Path) -> Path:
    return run_dir / LABELS_DIR


def open_unlinked(path: Path, flags: int) -> int:
    """``labels/NAME`` of a run opened without following a link (``serving.files``): a run
    directory from elsewhere may hold ``labels/`` or a label file as a symbolic link to any file
    of the reader's (a shell's rc file, say), which an append would then write to. An append
    makes ``labels/`` first, as a real folder."""
    run_dir = path.parent.parent
    try:
        if flags & os.O_CREAT:
            make_dirs(path.parent, within=run_dir)
        return files.open_unlinked(path, flags, within=run_dir)
    except UnsafePath as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror}") from None


def read_unlinked(path: Path) -> str:
    """The text of a label file, opened without following a link (``open_unlinked``)."""
    with os.fdopen(open_unlinked(path, os.O_RDONLY), encoding="utf-8") as handle:
        return handle.read()


def label_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of ``labels.jsonl`` in order, each checked for ``id``, ``stage``, ``label``;
    a last line still being written by another browser is left for the next read."""
    path = labels_dir(run_dir) / LABELS
    if not path.is_file():
        return []
    lines = read_unlinked(path).split("\n")
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):  # no newline yet: an append in progress
                break
            raise UserError(f"{path}:{lineno}: not JSON") from None
        except RecursionError:  # a file from elsewhere: one line, not a traceback
            raise UserError(f"{path}:{lineno}: JSON nested too deeply") from None
        checked_label_row(row, f"{path}:{lineno}")
        rows.append(row)
    return rows


def checked_label_row(row: Any, where: str) -> tuple[str, str, int]:
    """(id, stage, key) of one label line (``labels.jsonl``, a ``--human`` file), or one line
    naming ``where`` (``file:line``), the record and the field."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: a JSON object is expected")
    for name in ("id", "stage", "label"):
        if name not in row:
            raise UserError(f"{where}: record {row.get('id')!r}: field {name}: missing")
    record = f"{where}: record {row['id']!r}"
    key = row.get("key", 0)
    if isinstance(key, bool) or not isinstance(key, int) or key < 0:
        raise UserError(f"{record}: field key: a whole number from 0")
    if not isinstance(row["stage"], str):
        raise UserError(f"{record}: field stage: text expected")
    if isinstance(row["label"], float) and not math.isfinite(row["label"]):
        # a file from elsewhere: NaN is no label, and would reach the queue's JSON
        raise UserError(f"{record}: field label: not finite")
    return str(row["id"]), row["stage"], key


def run_labels(run_dir: Path) -> dict[tuple[str, str, int], Any]:
    """(id, stage, key) -> the label people gave, from ``labels.jsonl``: each annotator's
    latest line counts; several annotators' numbers are averaged, their labels the most
    frequent (ties: the earliest given)."""
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for row in label_rows(run_dir):
        unit = (str(row["id"]), str(row["stage"]), int(row.get("key", 0)))
        latest.setdefault(unit, {})[str(row.get("annotator", ""))] = row["label"]
    return {unit: _combined(list(given.values())) for unit, given in latest.items()}


def _combined(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(values):
        return sum(numbers) / len(numbers)
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=lambda v: counts[v])
