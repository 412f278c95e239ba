"""Regular expressions of each stage's output format, for constrained decoding on vLLM.

They spell out the same text formats the parsers read (the papers' formats), with bounded line
lengths and item counts, so even a weak model produces parseable, finite output. Endpoints that
cannot constrain decoding get the same prompts and the tolerant parsers with re-asks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .parsers import RELATIONS, UNIT_TYPES

_TYPES = "|".join(t.title() for t in UNIT_TYPES)
_SCORE = r"[1-5]"


@dataclass(frozen=True)
class Formats:
    items: int = 25  # most list items a stage may produce
    chars: int = 200  # longest line

    @property
    def line(self) -> str:
        return rf"[^\n\[\]]{{1,{self.chars}}}"

    @property
    def units(self) -> str:
        return rf"(- [^\n:\[\]]{{1,{self.chars}}}: ({_TYPES})\n){{1,{self.items}}}"

    @property
    def statements(self) -> str:
        return rf"(\* {self.line}\n){{1,{self.items}}}"

    @property
    def questions(self) -> str:
        return rf"(\* [^\n\[\]?]{{1,{self.chars}}}\?\n){{1,{self.items}}}"

    @property
    def refined(self) -> str:
        return rf"(\* {self.line} \[Relevance: {_SCORE}\]\n){{1,{self.items}}}"

    def rated(self, statements: list[str]) -> str:
        """Every statement copied in order, each with its relevance."""
        return "".join(rf"\* {_escape(s)} \[Relevance: {_SCORE}\]\n" for s in statements)

    @property
    def relation(self) -> str:
        return rf"[^\n\[\]]{{1,{self.chars}}}\n{self.line} \[({'|'.join(RELATIONS)})\]"

    def answers(self, questions: list[str]) -> str:
        """Every question in order, each followed by one to five answers."""
        answer = rf"A: [^\n\[\]|]{{1,{self.chars}}} \[Confidence: {_SCORE}\]"
        return "".join(rf"\* {_escape(q)}\n{answer}( \| {answer}){{0,4}}\n" for q in questions)

    def coverage(self, n_texts: int) -> str:
        ids = f"[1-{n_texts}]" if n_texts < 10 else r"[1-9][0-9]?"
        item = rf"- {self.line} \[{ids}(, {ids}){{0,9}}\]\n"
        return (
            rf"[^\[\]]{{0,{2 * self.chars}}}\n\[Covered statements\]\n"
            rf"({item}){{0,{self.items}}}\[Uncovered statements\]\n({item}){{0,{self.items}}}"
        )


def _escape(text: str) -> str:
    # re.escape covers the regex metacharacters; newlines inside a question become spaces.
    return re.escape(" ".join(text.split()))
