"""Parsers for every model output format of the comprehensiveness metrics.

Each parser either returns structured values or raises ``ParseError`` with a reason short enough
to be sent back to the model in a re-ask. None of them guesses: an output that does not follow
the format is an error, not an empty result (except where emptiness is a legal answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...serving.parsing import BULLET, ParseError, bullets

UNIT_TYPES = ("fact", "claim", "instruction", "data format", "meta statement", "question", "other")
FACTUAL_TYPES = ("fact", "claim")  # only these become atoms (SPEC §1)
NLI_LABELS = ("entailment", "contradiction", "neutral")
RELATIONS = (
    "equivalent",
    "first implies second",
    "second implies first",
    "contradictory",
    "neutral",
)

_NONE = {"none", "none.", "n/a", "no units", "no statements"}


@dataclass(frozen=True)
class Unit:
    text: str
    type: str


def parse_units(text: str) -> list[Unit]:
    """Atom extraction output: one bullet per unit, ``<unit>: <Type>``."""
    if (text or "").strip().lower() in _NONE:
        return []
    units = []
    for item in bullets(text):
        body, sep, kind = item.rpartition(":")
        kind = kind.strip().strip("*[]().").lower()
        if not sep or kind not in UNIT_TYPES or not body.strip():
            continue
        units.append(Unit(body.strip().strip("[]"), kind))
    units = list(dict.fromkeys(units))  # repeated lines are one unit
    if not units:
        raise ParseError("expected bullet lines of the form '- <unit>: <Type>'")
    return units


def parse_statements(text: str) -> list[str]:
    """Revised statements (or mined questions): one bullet per item, duplicates dropped."""
    if (text or "").strip().lower() in _NONE:
        return []
    seen: dict[str, None] = {}
    for item in bullets(text):
        seen.setdefault(item.strip(), None)
    if not seen:
        raise ParseError("expected one item per line, each starting with '* '")
    return list(seen)


_SCORE = re.compile(r"\[\s*(Relevance|Confidence)\s*:\s*([1-5])\s*\]", re.IGNORECASE)


def parse_scored_items(text: str, marker: str) -> list[tuple[str, int]]:
    """Bulleted items each ending with ``[<marker>: n]``, n in 1..5."""
    out = []
    for item in bullets(text):
        match = _SCORE.search(item)
        if match and match.group(1).lower() == marker.lower():
            out.append((item[: match.start()].strip(), int(match.group(2))))
    if not out and (text or "").strip().lower() not in _NONE:
        raise ParseError(f"expected items of the form '* <text> [{marker}: <1-5>]'")
    return out


def parse_rated(text: str, statements: list[str]) -> list[int]:
    """Relevance of each statement, in order, from '* <statement> [Relevance: n]' lines: one line
    per statement (the statement text is the model's copy and is not compared)."""
    rated = parse_scored_items(text, "Relevance")
    if len(rated) != len(statements):
        raise ParseError(f"expected {len(statements)} rated statements, got {len(rated)}")
    return [score for _, score in rated]


@dataclass(frozen=True)
class Answer:
    text: str
    confidence: int
    position: int  # index of its "[Confidence: n]" among all in the output (logprob alignment)

    @property
    def unknown(self) -> bool:
        return self.text.strip().strip(".").lower() == "unknown"


@dataclass(frozen=True)
class AnswerSheet:
    by_question: dict[int, list[Answer]]
    markers: int  # all "A: ... [Confidence: n]" occurrences in the output


_ANSWER = re.compile(r"A:\s*(.*?)\s*\[\s*Confidence\s*:\s*([1-5])\s*\]", re.IGNORECASE)


def parse_answers(text: str, questions: list[str], require_all: bool = True) -> AnswerSheet:
    """Answers per question index: a question line, then ``A: x [Confidence: n] | A: ...``.

    Questions are matched by text (case- and punctuation-insensitive). "unknown" answers (the
    source is silent) are kept and flagged. Every question must have an answer line, unless not
    ``require_all`` (the reference skips a missing question; an output answering none fails).
    """
    keys = {_norm(q): i for i, q in enumerate(questions)}
    result: dict[int, list[Answer]] = {}
    current: int | None = None
    position = 0
    for line in (text or "").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        answers = _ANSWER.findall(stripped)
        if not answers:
            body = BULLET.match(stripped)
            current = keys.get(_norm(body.group(1) if body else stripped))
            continue
        for answer_text, confidence in answers:
            if current is not None:
                result.setdefault(current, []).append(
                    Answer(answer_text.strip(), int(confidence), position)
                )
            position += 1
    missing = [questions[i] for i in range(len(questions)) if i not in result]
    if missing and (require_all or not result):
        raise ParseError(f"no answer line for {len(missing)} question(s), e.g. {missing[0]!r}")
    return AnswerSheet(result, position)


def parse_relation(text: str) -> str:
    """Answer comparison: the last bracketed classification among the five relation types."""
    found = re.findall(r"\[\s*([a-z ]+?)\s*\]", (text or "").lower())
    for label in reversed(found):
        if label in RELATIONS:
            return label
    raise ParseError("expected a final line '<answer 1> - <answer 2> [<relation>]'")


def parse_nli(text: str) -> str:
    words = re.findall(r"[a-z]+", (text or "").lower())
    labels = [w for w in words if w in NLI_LABELS]
    if not labels or len(set(labels)) > 1:
        raise ParseError("expected exactly one of: entailment, contradiction, neutral")
    return labels[0]


@dataclass(frozen=True)
class CoverageStatement:
    text: str
    sources: tuple[int, ...]


_SOURCES = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]\s*\.?\s*$")


def parse_coverage(
    text: str, n_texts: int, keep_duplicates: bool = False
) -> tuple[list[CoverageStatement], list[CoverageStatement]]:
    """End-to-end output: '[Covered statements]' and '[Uncovered statements]' bullet lists, each
    statement tagged with the ids of its background texts. Ids outside 1..n are an error. A
    repeated statement is one statement, unless ``keep_duplicates`` (the reference counts it
    as listed)."""
    lower = (text or "").lower()
    start_c = lower.rfind("[covered statements]")
    start_u = lower.rfind("[uncovered statements]")
    if start_c < 0 or start_u < 0:
        raise ParseError("expected both '[Covered statements]' and '[Uncovered statements]'")
    if start_c < start_u:
        covered_part, uncovered_part = text[start_c:start_u], text[start_u:]
    else:
        uncovered_part, covered_part = text[start_u:start_c], text[start_c:]

    def section(part: str) -> list[CoverageStatement]:
        out: dict[str, CoverageStatement] = {}
        for n, item in enumerate(bullets(part)):
            match = _SOURCES.search(item)
            if not match:
                raise ParseError(f"statement without source ids like [1, 3]: {item[:60]!r}")
            ids = tuple(int(x) for x in match.group(1).split(","))
            if any(not 1 <= i <= n_texts for i in ids):
                raise ParseError(f"source id out of range 1..{n_texts} in {item[:60]!r}")
            statement = item[: match.start()].strip()
            key = f"{n}:{statement}" if keep_duplicates else _norm(statement)
            out.setdefault(key, CoverageStatement(statement, ids))
        return list(out.values())

    return section(covered_part), section(uncovered_part)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()
