"""Regular expressions of each stage's output format, for constrained decoding on vLLM.

They spell out the same text formats the parsers read (the papers' formats), with bounded line
lengths and item counts, so even a weak model produces parseable, finite output. Endpoints that
cannot constrain decoding get the same prompts and the tolerant parsers with re-asks.
"""

from __future__ import annotations

import re

from pipelines.comprehensiveness.parsers import RELATIONS, UNIT_TYPES

LINE = r"[^\n\[\]]{1,200}"
MAX_ITEMS = 25
_TYPES = "|".join(t.title() for t in UNIT_TYPES)
_SCORE = r"[1-5]"

UNITS = rf"(- [^\n:\[\]]{{1,200}}: ({_TYPES})\n){{1,{MAX_ITEMS}}}"
STATEMENTS = rf"(\* {LINE}\n){{1,{MAX_ITEMS}}}"
QUESTIONS = rf"(\* [^\n\[\]?]{{1,200}}\?\n){{1,{MAX_ITEMS}}}"
REFINED = rf"(\* [^\n\[\]]{{1,200}} \[Relevance: {_SCORE}\]\n){{1,{MAX_ITEMS}}}"
RELATION = rf"[^\n\[\]]{{1,300}}\n[^\n\[\]]{{1,150}} \[({'|'.join(RELATIONS)})\]"
_ANSWER = rf"A: [^\n\[\]|]{{1,120}} \[Confidence: {_SCORE}\]"


def answers(questions: list[str]) -> str:
    """Every question in order, each followed by one to five answers."""
    return "".join(rf"\* {_escape(q)}\n{_ANSWER}( \| {_ANSWER}){{0,4}}\n" for q in questions)


def coverage(n_texts: int) -> str:
    ids = f"[1-{n_texts}]" if n_texts < 10 else r"[1-9][0-9]?"
    item = rf"- {LINE} \[{ids}(, {ids}){{0,9}}\]\n"
    return (
        r"[^\[\]]{0,400}\n\[Covered statements\]\n"
        rf"({item}){{0,{MAX_ITEMS}}}\[Uncovered statements\]\n({item}){{0,{MAX_ITEMS}}}"
    )


def _escape(text: str) -> str:
    # re.escape covers the regex metacharacters; newlines inside a question become spaces.
    return re.escape(" ".join(text.split()))
