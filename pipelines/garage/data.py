"""GaRAGe records (SPEC §5), validated with clear errors; the data file itself is not shipped.

Fields: sample_id (the record's id), question, question_date, grounding [{text, age, date,
provider}], evidence_relevant (per passage: YES/NO, bool, 0-1 or "relevant"-"irrelevant"),
evidence_correct (per passage: ANSWER-THE-QUESTION / RELATED-INFORMATION / OUTDATED / UNKNOWN),
evidence_cited (per passage YES/NO tags as published, or the cited passage numbers, 1-based),
answer_generate (human answer with [n] markers), and the question dimensions as published
(question_sensitive + question_type for time-sensitivity, question_complexity,
question_popularity, question_category, question_tag for web vs enterprise).
A question expects a deflection when no passage is relevant, unless `deflection` says otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipelines.config import RecordId, UserError, describe_validation, iter_jsonl

QUALITY_LABELS = ("ANSWER-THE-QUESTION", "RELATED-INFORMATION", "OUTDATED", "UNKNOWN")
DIMENSIONS = {  # breakdown name -> accepted field names, first present wins
    "time_sensitivity": ("time_sensitivity", "temporal", "recency", "question_type"),
    "complexity": ("complexity", "question_complexity"),
    "popularity": ("popularity", "question_popularity"),
    "domain": ("domain", "category", "question_category"),
    "source": ("source", "grounding_source", "question_tag"),
}
_YES = ("yes", "true", "1", "relevant", "cited")
_NO = ("no", "false", "0", "irrelevant", "not cited", "")
_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]|【(\d+)】")


class Passage(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str
    age: str | int | float | None = None
    date: str | None = None
    provider: str | None = None


def _relevant(value: Any, what: str = "relevance label") -> bool:
    """A per-passage YES/NO tag (also bool, 0/1, relevant/irrelevant)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in _YES + _NO:
        return value.strip().lower() in _YES
    raise ValueError(f"{what} {value!r} is not YES/NO (relevant/irrelevant)")


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: RecordId
    question: str = Field(min_length=1)
    question_date: str | None = None
    grounding: list[Passage]
    evidence_relevant: list[bool]
    evidence_correct: list[str] = Field(default_factory=list)
    evidence_cited: list[int] | None = None
    answer_generate: str = ""
    deflection: bool | None = None

    @field_validator("evidence_relevant", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> list[bool]:
        if not isinstance(value, list):
            raise ValueError("must be a list with one label per grounding passage")
        return [_relevant(v) for v in value]

    @model_validator(mode="before")
    @classmethod
    def _published(cls, row: Any) -> Any:
        if isinstance(row, dict) and "evidence_cited" in row:
            cited = row["evidence_cited"]
            if isinstance(cited, list) and any(isinstance(v, (str, bool)) for v in cited):
                passages = len(row.get("grounding") or [])
                if len(cited) != passages:
                    raise ValueError(
                        f"evidence_cited has {len(cited)} tags for {passages} grounding passages"
                    )
                numbers = [n for n, tag in enumerate(cited, 1) if _relevant(tag, "citation tag")]
                row = row | {"evidence_cited": numbers}
        return row

    @field_validator("evidence_correct", mode="before")
    @classmethod
    def _quality(cls, value: Any) -> list[str]:
        value = value or []
        for v in value:
            if str(v).upper() not in QUALITY_LABELS:
                raise ValueError(f"unknown label {v!r}; use one of {QUALITY_LABELS}")
        return [str(v).upper() for v in value]

    @model_validator(mode="after")
    def _aligned(self) -> Record:
        n = len(self.grounding)
        if len(self.evidence_relevant) != n:
            raise ValueError(f"evidence_relevant has {len(self.evidence_relevant)} labels for "
                             f"{n} grounding passages")  # fmt: skip
        if self.evidence_correct and len(self.evidence_correct) != n:
            raise ValueError(f"evidence_correct has {len(self.evidence_correct)} labels for "
                             f"{n} grounding passages")  # fmt: skip
        for i in self.evidence_cited or []:
            if not 1 <= i <= n:
                raise ValueError(f"evidence_cited names passage {i}, outside 1..{n}")
        return self

    @property
    def expects_deflection(self) -> bool:
        return self.deflection if self.deflection is not None else not any(self.evidence_relevant)

    @property
    def human_citations(self) -> set[int]:
        if self.evidence_cited is not None:
            return set(self.evidence_cited)
        return citations(self.answer_generate, len(self.grounding))

    @property
    def relevant_share(self) -> float:
        return sum(self.evidence_relevant) / len(self.grounding) if self.grounding else 0.0

    def dimension(self, name: str) -> str | None:
        extra: dict[str, Any] = self.model_extra or {}
        found = extra.get("dimensions")
        nested: dict[str, Any] = found if isinstance(found, dict) else {}
        sensitive = extra.get("question_sensitive")
        if name == "time_sensitivity" and str(sensitive).strip().lower() in ("no", "false", "0"):
            return "Static"  # published: question_type is set for time-sensitive ones only
        for key in DIMENSIONS[name]:
            for source in (extra, nested):
                if source.get(key) not in (None, ""):
                    return str(source[key])
        if name == "source":  # private vs web from the passages' providers
            providers = {str(p.provider).lower() for p in self.grounding if p.provider}
            private = any("private" in p or p == "ent" for p in providers)
            return "private" if private else "web"
        return None


def load_answers(path: Path, records: list[Record]) -> dict[str, str]:
    """Answers made elsewhere: JSONL ``{"sample_id", "answer"}`` with the benchmark's citation
    markers. An answer for no record of ours is not scored; none matching is an error."""
    answers: dict[str, str] = {}
    for lineno, row in iter_jsonl(path):
        sample = row.get("sample_id")
        record = f"{path}:{lineno}: record {sample!r}"
        if isinstance(sample, int) and not isinstance(sample, bool):
            sample = str(sample)
        if not isinstance(sample, str) or not sample:
            raise UserError(f"{record}: field sample_id: missing or not a string")
        if not isinstance(row.get("answer"), str):
            raise UserError(f"{record}: field answer: missing or not a string")
        if sample in answers:
            raise UserError(f"{record}: field sample_id: duplicate")
        answers[sample] = row["answer"]
    if not answers:
        raise UserError(f"{path}: no answers")
    if records and not set(answers) & {r.id for r in records}:
        raise UserError(f"{path}: no sample_id is a record of the benchmark file")
    return answers


def citations(text: str, n_passages: int | None = None) -> set[int]:
    """Cited passage numbers from markers like [1], [2, 5], [3][4] or 【2】; out-of-range numbers
    are kept out (they cite nothing that exists)."""
    found: set[int] = set()
    for group, fullwidth in _MARKER.findall(text or ""):
        for number in (group or fullwidth).split(","):
            value = int(number)
            if n_passages is None or 1 <= value <= n_passages:
                found.add(value)
    return found


def quality_band(share: float) -> str:
    """Grounding quality: share of relevant passages, <33%, 33-66%, >66%."""
    return "<33%" if share < 1 / 3 else "33-66%" if share <= 2 / 3 else ">66%"


def load_records(path: Path, limit: int | None = None) -> list[Record]:
    out, seen = [], set()
    for lineno, row in iter_jsonl(path, limit):
        row.setdefault("id", row.get("sample_id", str(lineno)))
        try:
            record = Record.model_validate(row)
        except ValidationError as exc:
            raise UserError(
                f"{path}:{lineno}: record {row.get('id')!r}: {describe_validation(exc)}"
            ) from exc
        if record.id in seen:
            raise UserError(f"{path}:{lineno}: record {record.id!r}: duplicate id")
        seen.add(record.id)
        out.append(record)
    if not out:
        raise UserError(f"{path}: no records")
    return out
