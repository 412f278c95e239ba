"""Answers made elsewhere (``--answers``): the runtime reads the file and supplies each item's
answer in place of the answering role, for every framework with an answering stage. The file
is the framework's own layout (JSON Lines or a JSON list), an inspect_ai eval log or an
lm-evaluation-harness samples file (``harness_answers``), told apart by content. A
framework states only how a record of the file maps to its items (``AnswerFile``); reading,
one-line errors, duplicates, the run's identity (the file's SHA-256) and the per-item lookup
(``ItemContext.given_answer``) are the runtime's.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..store.harness_answers import harness_layout, harness_records
from ..store.provenance import InputFile
from .errors import UserError
from .readers import iter_jsonl


@dataclass(frozen=True)
class AnswerFile:
    """The layout of a framework's answers file, as its authors publish submissions."""

    id_field: str = "id"  # the field naming the item ("sample_id", "topic")
    answer_field: str = "answer"
    # the layout the authors publish (said in --help); either is read, decided by the content
    layout: Literal["jsonl", "json-list"] = "jsonl"
    unknown: Literal["ignore", "error"] = "ignore"  # an answer for no item: not scored, or refused
    missing: str = "not scored"  # what an item without an answer becomes (said in --help)

    @property
    def shape(self) -> str:
        record = f'{{"{self.id_field}", "{self.answer_field}"}}'
        listed, lines = f"a JSON list [{record}, ...]", f"JSON Lines of {record}"
        return f"{listed} or {lines}" if self.layout == "json-list" else f"{lines} or a JSON list"


class GivenAnswers(BaseModel):
    """The options of a framework whose answering role a file can stand in for."""

    answers: InputFile | None = Field(
        None, description="score answers made elsewhere (no answering model is asked)"
    )


def _records(path: Path, spec: AnswerFile) -> Iterator[tuple[str, Any]]:
    """(where, row) per record, the layout decided by the content (whatever ``spec.layout``, the
    one its authors publish): an inspect_ai log or an lm-evaluation-harness samples file
    (``harness_answers``), a JSON list (``file: answer #n``) when the first character is
    ``[``, else JSON Lines (``file:line``); anything else is one line naming file and line."""
    first = _first_character(path)
    harness = harness_layout(path)
    if harness is not None:
        yield from harness_records(path, harness, spec.id_field, spec.answer_field)
        return
    if first != "[":
        for lineno, row in iter_jsonl(path):
            yield f"{path}:{lineno}", row
        return
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except RecursionError:  # deeper than the parser's stack: bad input, not a crash
        raise UserError(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}:{exc.lineno}: neither a JSON list nor JSON Lines: {exc.msg} "
            f"(column {exc.colno})"
        ) from None
    if not isinstance(rows, list):  # unreachable for text that starts with "[", kept for types
        record = f'{{"{spec.id_field}", "{spec.answer_field}"}}'
        raise UserError(f"{path}: expected a JSON list of {record} objects")
    for n, row in enumerate(rows):
        yield f"{path}: answer #{n}", row


def _first_character(path: Path) -> str:
    """The file's first character that is not white space or a byte-order mark ("" if none)."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="ignore")
    except OSError as exc:
        raise UserError(f"{path}: cannot be read: {exc.strerror}") from None
    return head.lstrip("\ufeff \t\r\n")[:1]


def read_answers(
    path: Path, spec: AnswerFile, item_ids: Collection[str] | None = None
) -> dict[str, str]:
    """id -> answer. Each record an object with a string (or integer) id and a string answer;
    a duplicate id, an empty file, an unknown id where ``spec.unknown`` is "error", and a file
    whose ids match none of ``item_ids`` are refused in one line."""
    answers: dict[str, str] = {}
    for where, row in _records(path, spec):
        if not isinstance(row, dict):
            raise UserError(f"{where}: not a JSON object")
        key = row.get(spec.id_field)
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        record = f"{where} ({key!r})" if "answer #" in where else f"{where}: record {key!r}"
        if not isinstance(key, str) or not key:
            raise UserError(f"{record}: field {spec.id_field}: missing or not a string")
        if not isinstance(row.get(spec.answer_field), str):
            raise UserError(f"{record}: field {spec.answer_field}: missing or not a string")
        if key in answers:
            raise UserError(f"{record}: field {spec.id_field}: duplicate")
        if spec.unknown == "error" and item_ids is not None and key not in item_ids:
            raise UserError(f"{record}: field {spec.id_field}: unknown {spec.id_field}")
        answers[key] = row[spec.answer_field]
    if not answers:
        raise UserError(f"{path}: no answers")
    if item_ids is not None and not set(answers) & set(item_ids):
        raise UserError(f"{path}: no answer's {spec.id_field} is an item of the data file")
    return answers
