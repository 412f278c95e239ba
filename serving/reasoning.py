"""How an evaluator model reasons before it answers, and what that means for each request.

Reasoning models served by vLLM (gpt-oss, Qwen3, DeepSeek-R1 distills) write their reasoning
first -- returned in the message's ``reasoning`` field (``reasoning_content`` in older vLLM)
-- and the answer after it, in ``content``. ``max_tokens`` bounds both. A stage asks for the
tokens its answer needs; for a reasoning model the request gets that plus a reasoning budget.
A response cut inside its reasoning (``finish_reason == "length"`` and no content) is asked again
with twice the budget, up to a cap; still cut, the stage raises ``ReasoningCut``, which the
runtime records as its own status and never as a score.

Three ways a model reasons:

- ``effort``: gpt-oss. Effort is low, medium or high, sent as ``reasoning_effort``. It cannot be
  turned off.
- ``toggle``: Qwen3. Thinking is switched on or off with
  ``chat_template_kwargs: {"enable_thinking": ...}``.
- ``always``: DeepSeek-R1 distills. Always on; ``effort`` only sizes the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Style = Literal["effort", "toggle", "always"]
Setting = Literal["off", "low", "medium", "high"]

# Reasoning tokens added to each request's answer budget. These are defaults, not measurements:
# roughly 2-4 times the reasoning gpt-oss writes per judging call at that effort on long-form
# evaluation prompts, so most calls fit the first time. A cut response is asked again with twice
# the budget, up to CAP_FACTOR times the budget.
BUDGETS: dict[str, int] = {"low": 1024, "medium": 4096, "high": 16384}
CAP_FACTOR = 4


class ReasoningCut(Exception):
    """A response still cut inside its reasoning at the largest budget: no answer to read."""

    def __init__(self, stage: str, max_tokens: int):
        super().__init__(
            f"stage {stage!r}: the model's reasoning used all of max_tokens={max_tokens} "
            "and left no answer (raise --reasoning-tokens)"
        )
        self.stage = stage
        self.max_tokens = max_tokens


@dataclass(frozen=True)
class Reasoning:
    style: Style
    setting: Setting
    budget: int  # reasoning tokens added to every request's answer budget

    @classmethod
    def make(cls, style: Style, setting: Setting, budget: int | None = None) -> Reasoning:
        if setting == "off" and style != "toggle":
            cannot = "gpt-oss always reasons" if style == "effort" else "it always reasons"
            raise ValueError(f"reasoning off: this model cannot turn reasoning off ({cannot})")
        if budget is not None and budget < 1:
            raise ValueError(f"reasoning tokens must be positive, got {budget}")
        default = 0 if setting == "off" else BUDGETS[setting]
        return cls(style, setting, default if budget is None else budget)

    @classmethod
    def detected(cls) -> Reasoning:
        """A model not known to reason whose response carried reasoning: always on, medium."""
        return cls("always", "medium", BUDGETS["medium"])

    @property
    def on(self) -> bool:
        return self.setting != "off"

    def budgets(self) -> list[int]:
        """The reasoning budget of each try: the budget, then doubled after each cut, up to
        ``CAP_FACTOR`` times it (one try when reasoning is off)."""
        if not self.on:
            return [0]
        tries, budget = [], self.budget
        while budget <= self.budget * CAP_FACTOR:
            tries.append(budget)
            budget *= 2
        return tries

    def params(self) -> dict[str, Any]:
        """What each request carries to set the reasoning."""
        if self.style == "effort":
            return {"reasoning_effort": self.setting}
        if self.style == "toggle":
            return {"chat_template_kwargs": {"enable_thinking": self.on}}
        return {}


def reasoning_text(message: dict[str, Any]) -> str:
    """The reasoning a response carries, under either field name vLLM has used."""
    return message.get("reasoning") or message.get("reasoning_content") or ""


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_inline(content: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply's content from a server without a reasoning parser,
    where the reasoning stays in the content between <think> and </think> (R1 templates open
    the answer with <think>, so only the closing tag may be there). Content with no </think>
    that opens with <think> is all reasoning (cut before its answer); content with neither
    tag is all answer."""
    head, closed, tail = content.partition(THINK_CLOSE)
    if closed:
        return head.strip().removeprefix(THINK_OPEN).strip(), tail.strip()
    if content.lstrip().startswith(THINK_OPEN):
        return content.lstrip().removeprefix(THINK_OPEN).strip(), ""
    return "", content
