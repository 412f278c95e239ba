"""What every framework records per item, and the one way a model stage gives up.

An ``ItemResult`` is one line of a run's results.jsonl: a status, a score (or None), an
explanation a person can read, the framework's details, and the model usage of the item. The run
store validates every record on append, so a framework cannot write a NaN score, an unknown
status, or an unparseable item without saying which stage failed and what it said.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ....serving.client import Parsed
from ....serving.redact import redact

# cut_in_reasoning: a reasoning model used its whole token budget on reasoning and gave no answer,
# even at the largest budget (``serving.reasoning``): counted apart, never scored as a 0
# unjudged: a judge cascade (--cascade) abstained on one of the item's judgements: no tier was
# confident enough; never scored, offered for labelling instead (runtime.contract.cascade)
Status = Literal[
    "ok", "unparseable", "abstained", "undefined", "error", "cut_in_reasoning", "unjudged"
]
STATUSES: tuple[str, ...] = get_args(Status)
# Statuses that carry no score by definition; "ok" and "abstained" may (an abstention can score 0).
UNSCORED = ("unparseable", "undefined", "error", "cut_in_reasoning", "unjudged")
# each names the stage that failed (or, unjudged, that the cascade abstained on)
FAILED = ("unparseable", "error", "cut_in_reasoning", "unjudged")


# statuses a rerun asks again: the item failed (a rejected request, a defect, reasoning that used
# every token); a run that ends with them is not a clean run (exit code 4)
FAILED_STATUSES = ("error", "cut_in_reasoning")


class StageFailure(BaseModel):
    """Why an item has no score: the stage, the last parse or request error, every raw output."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    error: str
    outputs: list[str] = Field(default_factory=list)

    @field_validator("error")
    @classmethod
    def _no_secrets(cls, error: str) -> str:
        return redact(error)  # a server's error body may echo the key it was sent


class ItemResult(BaseModel):
    """One item's record: its ``status`` (``ok``, ``abstained``, ``undefined``, ``failed``...),
    ``score`` (None where there is none, never a silent 0), a one-line ``explanation``, the
    framework's ``details``, per-stage ``usage`` and, for a failed item, its ``failure``.
    Build it with ``ctx.result(...)`` or ``ctx.failed(...)``."""

    model_config = ConfigDict(extra="forbid")

    id: str
    status: Status
    score: float | None = None
    explanation: str = Field(min_length=1)
    details: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = Field(default_factory=dict)
    failure: StageFailure | None = None
    # each request's reasoning, with --keep-reasoning only (it is large): [{stage, template,
    # tokens, reasoning}]; absent from the record otherwise
    reasoning: list[dict[str, Any]] | None = Field(None, exclude_if=lambda kept: kept is None)

    @model_validator(mode="after")
    def _consistent(self) -> ItemResult:
        if self.score is not None and not math.isfinite(self.score):
            raise ValueError(f"item {self.id!r}: score must be finite, got {self.score}")
        if self.status in UNSCORED and self.score is not None:
            raise ValueError(f"item {self.id!r}: a {self.status} item has no score")
        if self.status in FAILED and self.failure is None:
            raise ValueError(f"item {self.id!r}: a {self.status} item names its failing stage")
        return self


def not_scored(
    records: Iterable[ItemResult], score: Callable[[ItemResult], float | None] | None = None
) -> dict[str, int]:
    """The one definition of "not scored" in every framework's tables: per status, how many
    records the table gives no score (``score(record)``, by default the record's own, is
    None). Statuses without such a record are left out. They stay counted, never dropped."""
    counts: dict[str, int] = {}
    for record in records:
        if (record.score if score is None else score(record)) is None:
            counts[record.status] = counts.get(record.status, 0) + 1
    return counts


@dataclass(frozen=True)
class ItemText:
    """What a person reads of one item beside its score (exports, inspect_ai logs, trackers):
    what was asked, the answer under judgement, and the reference where the framework has one."""

    input: str
    answer: str | None = None
    reference: str | None = None


@dataclass(frozen=True)
class SwapPair:
    """One recorded judgement whose prompt held two texts of one kind (two answers compared),
    as ``agreement --swap-audit`` asks it again with the texts swapped: the stage, a key unique
    within the item, the verdict the run recorded, and what the framework needs to ask again
    (the two texts, the question)."""

    stage: str
    key: str
    verdict: Any
    texts: dict[str, Any]


@dataclass(frozen=True)
class Judgement:
    """One recorded judgement a model decided, as the reliability audits ask it again
    (``agreement --rerun`` asks it once more, ``--paraphrase`` with each declared variant of
    its prompt): the stage, a key unique within the item, the verdict the run recorded, and the
    values its prompt was rendered with (exactly those the stage was asked with: a panel's
    members' own answers are found by them)."""

    stage: str
    key: str
    verdict: Any
    values: dict[str, Any]


# the item fields ``Framework.item_text`` reads by default, first found wins
INPUT_FIELDS = ("query", "question", "prompt", "input", "paragraph", "topic")
ANSWER_FIELDS = ("response",)
REFERENCE_FIELDS = ("reference", "answer_generate", "gold", "target")


def item_fields(item: Any, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that the item (a model or a mapping) has as non-empty text."""
    for name in names:
        value = item.get(name) if isinstance(item, dict) else getattr(item, name, None)
        if isinstance(value, str) and value:
            return value
    return None


class StageFailed(Exception):
    """A stage's output stayed unparseable after the re-asks: the item is recorded as such."""

    def __init__(self, stage: str, parsed: Parsed | None = None, error: str | None = None):
        self.stage = stage
        self.error = error or (parsed.error if parsed else None) or "unparseable"
        self.outputs = list(parsed.outputs) if parsed else []
        super().__init__(f"{stage}: {self.error}")

    def failure(self) -> StageFailure:
        return StageFailure(stage=self.stage, error=self.error, outputs=self.outputs)
