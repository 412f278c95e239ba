"""GaRAGe records as the authors publish them (``data/GaRAGe_benchmark.jsonl``), validated with
one clear error per bad field.

A published row: ``sample_id`` (UUID, the record's id), ``question``, ``question_date``,
``grounding`` (per passage exactly ``age``, ``date``, ``provider`` -- ``web`` or ``ent`` -- and
``cite_N`` holding the passage text, N its 1-based position), ``evidence_relevant`` (per passage
``YES`` / ``NO`` / ``""`` not annotated), ``evidence_correct`` (``ANSWER-THE-QUESTION`` /
``RELATED-INFORMATION`` / ``OUTDATED`` / ``UNKNOWN`` / ``""``), ``evidence_cited`` (per passage
``YES`` / ``NO``), ``answer_generate`` (the human answer, citing with ``[cite_N]``), and the
question's labels: ``question_sensitive`` YES/NO with ``question_type`` FAST-CHANGING /
SLOW-CHANGING (``""`` exactly when not time-sensitive: the paper's Static),
``question_complexity``, ``question_popularity``, ``question_category``, and ``question_tag`` /
``topic_tag`` (``web``, or an enterprise source: ``arxiv``, ``sec``, ``devops``, ``enron``).

How an unannotated passage (``""``) counts: it is not relevant (never shown relevant), so it is
left out of the relevant passages uRAF/RAF judge against, does not keep a question out of the
deflection set, and counts in the grounding-quality share's denominator. The numbers are kept per
record (``unannotated``) and per file (``counts``).

The deflection set: a question expects a deflection when none of its passages is annotated
relevant (``YES``) -- the paper's "427 questions ... due to the irrelevant nature of the
grounding".

An alternative shape of our own is still read (passages with ``text``, boolean relevance labels,
``evidence_cited`` as passage numbers, ``id``, an explicit ``deflection``); the published one is
the default and the one documented.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from groundcover import UserError
from groundcover.inputs import RecordId, describe_validation, iter_jsonl

QUALITY_LABELS = ("ANSWER-THE-QUESTION", "RELATED-INFORMATION", "OUTDATED", "UNKNOWN")
RELEVANCE = {"YES": True, "NO": False, "": None}  # "" = not annotated
CITED = {"YES": True, "NO": False}
TIME_TYPES = {"FAST-CHANGING": "Fast-Changing", "SLOW-CHANGING": "Slow-Changing"}
STATIC = "Static"
WEB_TAG = "web"
PRIVATE_TAGS = ("arxiv", "sec", "devops", "enron")  # the paper's "Private" (enterprise) sources
COMPLEXITIES = (
    "Simple",
    "Simple w. condition",
    "Set",
    "Comparison",
    "Aggregation",
    "Multi-hop",
    "Post-processing heavy",
)
POPULARITIES = ("Head", "Torso", "Tail")
# published label fields and their domains (compared case-insensitively; kept as published)
DOMAINS: dict[str, tuple[str, ...]] = {
    "question_sensitive": ("YES", "NO"),
    "question_type": (*TIME_TYPES, ""),
    "question_complexity": COMPLEXITIES,
    "question_popularity": POPULARITIES,
    "question_tag": (WEB_TAG, *PRIVATE_TAGS),
    "topic_tag": (WEB_TAG, *PRIVATE_TAGS),
}
DIMENSIONS = {  # breakdown name -> accepted field names, first present wins
    "time_sensitivity": ("question_type", "time_sensitivity"),
    "complexity": ("question_complexity", "complexity"),
    "popularity": ("question_popularity", "popularity"),
    "domain": ("question_category", "category", "domain"),
    "source": ("question_tag", "source"),
    "source_tag": ("question_tag",),
}
_CITE_KEY = re.compile(r"^cite_(\d+)$")
# [cite_3], [1], [2, 5], [cite_1, cite_4] and full-width 【2】
_MARKER = re.compile(r"\[((?:cite_)?\d+(?:\s*,\s*(?:cite_)?\d+)*)\]|【(\d+)】")


class Passage(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str
    age: str | int | float | None = None
    date: str | None = None
    provider: str | None = None


def _published_passage(position: int, passage: Any) -> Any:
    """A published passage {age, date, provider, cite_N: text} as a Passage's fields; N must be
    the passage's 1-based position (the number the answers cite it by)."""
    if not isinstance(passage, dict):
        return passage
    keys = [k for k in passage if _CITE_KEY.match(k)]
    if not keys:
        return passage
    if len(keys) > 1:
        raise ValueError(f"passage {position} has {len(keys)} cite_N keys ({', '.join(keys)})")
    [key] = keys
    if int(key.removeprefix("cite_")) != position:
        raise ValueError(f"passage {position}: key {key} out of order (expected cite_{position})")
    if not isinstance(passage[key], str):
        raise ValueError(f"passage {position}: {key} is not a string")
    rest = {k: v for k, v in passage.items() if k != key}
    return rest | {"text": passage[key], "cite": position}


def _label(value: Any, domain: dict[str, Any], what: str) -> Any:
    """A published per-passage tag mapped through ``domain`` (booleans: the alternative shape)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().upper() in domain:
        return domain[value.strip().upper()]
    shown = " / ".join(repr(k) for k in domain)
    raise ValueError(f"{what} {value!r} is not one of {shown}")


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: RecordId
    question: str = Field(min_length=1)
    question_date: str | None = None
    grounding: list[Passage]
    evidence_relevant: list[bool | None]  # None: not annotated
    evidence_correct: list[str | None] = Field(default_factory=list)  # None: not annotated
    evidence_cited: list[int] | None = None
    answer_generate: str = ""
    deflection: bool | None = None

    @field_validator("grounding", mode="before")
    @classmethod
    def _passages(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [_published_passage(n, p) for n, p in enumerate(value, 1)]

    @field_validator("evidence_relevant", mode="before")
    @classmethod
    def _relevance(cls, value: Any) -> list[bool | None]:
        if not isinstance(value, list):
            raise ValueError("must be a list with one label per grounding passage")
        return [_label(v, RELEVANCE, "relevance label") for v in value]

    @field_validator("evidence_correct", mode="before")
    @classmethod
    def _quality(cls, value: Any) -> list[str | None]:
        if not isinstance(value, list):
            raise ValueError("must be a list with one label per grounding passage")
        domain: dict[str, str | None] = {q: q for q in QUALITY_LABELS} | {"": None}
        return [_label(v, domain, "label") for v in value]

    @field_validator("evidence_cited", mode="before")
    @classmethod
    def _cited(cls, value: Any, info: ValidationInfo) -> Any:
        """Per-passage YES/NO tags as published, or passage numbers (1-based)."""
        if isinstance(value, list) and any(isinstance(v, (str, bool)) for v in value):
            passages = len(info.data.get("grounding") or [])
            if len(value) != passages:
                raise ValueError(f"{len(value)} tags for {passages} grounding passages")
            tags = [_label(tag, CITED, "citation tag") for tag in value]
            return [n for n, tag in enumerate(tags, 1) if tag]
        return value

    @model_validator(mode="after")
    def _aligned(self) -> Record:
        n = len(self.grounding)
        if len(self.evidence_relevant) != n:
            raise ValueError(
                f"evidence_relevant has {len(self.evidence_relevant)} labels for "
                f"{n} grounding passages"
            )
        if self.evidence_correct and len(self.evidence_correct) != n:
            raise ValueError(
                f"evidence_correct has {len(self.evidence_correct)} labels for "
                f"{n} grounding passages"
            )
        for i in self.evidence_cited or []:
            if not 1 <= i <= n:
                raise ValueError(f"evidence_cited names passage {i}, outside 1..{n}")
        return self

    @property
    def expects_deflection(self) -> bool:
        """No passage annotated relevant (an explicit ``deflection`` field overrides)."""
        return self.deflection if self.deflection is not None else not any(self.evidence_relevant)

    @property
    def relevant(self) -> list[bool]:
        """Per passage: annotated relevant (an unannotated passage is not)."""
        return [label is True for label in self.evidence_relevant]

    @property
    def unannotated(self) -> int:
        return sum(label is None for label in self.evidence_relevant)

    @property
    def human_citations(self) -> set[int]:
        if self.evidence_cited is not None:
            return set(self.evidence_cited)
        return citations(self.answer_generate, len(self.grounding))

    @property
    def relevant_share(self) -> float:
        return sum(self.relevant) / len(self.grounding) if self.grounding else 0.0

    def _field(self, key: str) -> Any:
        extra: dict[str, Any] = self.model_extra or {}
        nested = extra.get("dimensions")
        for source in (extra, nested if isinstance(nested, dict) else {}):
            if source.get(key) not in (None, ""):
                return source[key]
        return None

    def dimension(self, name: str) -> str | None:
        """The breakdown label, as the paper's figures name it: time-sensitivity Fast-Changing /
        Slow-Changing / Static; source Web / Private (``source_tag``: the raw tag)."""
        if name == "time_sensitivity":
            return self._time_sensitivity()
        if name == "source":
            return self._source()
        found = next((self._field(k) for k in DIMENSIONS[name] if self._field(k) is not None), None)
        return None if found is None else str(found)

    def _time_sensitivity(self) -> str | None:
        extra: dict[str, Any] = self.model_extra or {}
        if "question_sensitive" in extra or "question_type" in extra:
            kind = str(extra.get("question_type") or "").strip().upper()
            sensitive = str(extra.get("question_sensitive") or "").strip().upper() != "NO"
            return TIME_TYPES[kind] if sensitive and kind in TIME_TYPES else STATIC
        found = self._field("time_sensitivity")
        return None if found is None else str(found)

    def _source(self) -> str:
        tag = self._field("question_tag") or self._field("source")
        if tag is not None:
            return "Web" if str(tag).strip().lower() == WEB_TAG else "Private"
        providers = {str(p.provider).lower() for p in self.grounding if p.provider}
        private = any("private" in p or p == "ent" for p in providers)
        return "Private" if private else "Web"


def outside_domain(row: dict[str, Any]) -> str | None:
    """The first published question label outside its domain, as ``field F: ...``."""
    for field, domain in DOMAINS.items():
        value = row.get(field)
        if value is None:
            continue
        if not isinstance(value, str) or value.strip().lower() not in {d.lower() for d in domain}:
            shown = " / ".join(repr(d) for d in domain)
            return f"field {field}: {value!r} is not one of {shown}"
    return None


def counts(records: list[Record]) -> dict[str, Any]:
    """What a reader of the file should compare with the paper: questions, passages, the
    deflection set, and the time-sensitivity and source shares (the paper: 2,366 / 35,351 / 427;
    Fast-Changing 17.5%, Slow-Changing 49.6%; Web 86.6%)."""
    n = len(records)

    def shares(name: str) -> dict[str, float]:
        found = Counter(r.dimension(name) or "unlabelled" for r in records)
        return {k: round(v / n, 4) for k, v in sorted(found.items())} if n else {}

    return {
        "questions": n,
        "passages": sum(len(r.grounding) for r in records),
        "deflection_expected": sum(r.expects_deflection for r in records),
        "unannotated_relevance_labels": sum(r.unannotated for r in records),
        "time_sensitivity": shares("time_sensitivity"),
        "source": shares("source"),
    }


def citations(text: str, n_passages: int | None = None) -> set[int]:
    """Cited passage numbers from markers like [cite_1], [1], [2, 5], [3][4] or 【2】; out-of-range
    numbers are kept out (they cite nothing that exists)."""
    found: set[int] = set()
    for group, fullwidth in _MARKER.findall(text or ""):
        for number in (group or fullwidth).split(","):
            value = int(number.strip().removeprefix("cite_"))
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
        where = f"{path}:{lineno}: record {row.get('id')!r}"
        if (wrong := outside_domain(row)) is not None:
            raise UserError(f"{where}: {wrong}")
        try:
            record = Record.model_validate(row)
        except ValidationError as exc:
            raise UserError(f"{where}: {describe_validation(exc)}") from exc
        if record.id in seen:
            raise UserError(f"{path}:{lineno}: record {record.id!r}: duplicate id")
        seen.add(record.id)
        out.append(record)
    if not out:
        raise UserError(f"{path}: no records")
    return out
