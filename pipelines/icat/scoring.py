"""ICAT's scores (SPEC §2), as pure functions of what the stages found.

S_fact = |grounded claims| / |claims|; S_cov = |aspects covered| / |aspects|;
ICAT_β = (1 + β²) · S_fact · S_cov / (β² · S_fact + S_cov). Per-query values are macro-averaged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from groundcover import ParseError

THRESHOLD = 0.5  # grounded iff P(entailment) > 0.5 (strictly) for some snippet


def first_entailing(probabilities: Sequence[float], threshold: float = THRESHOLD) -> int | None:
    """Rank of the first snippet whose P(entailment) is strictly above the threshold."""
    return next((i for i, p in enumerate(probabilities) if p > threshold), None)


def ratio(part: int, whole: int) -> float | None:
    """part / whole; None (undefined, never 0) when there is nothing to divide by."""
    return part / whole if whole else None


def icat_beta(s_fact: float, s_cov: float, beta: float = 1.0) -> float:
    """The weighted harmonic mean; 0 when both scores are 0 (nothing to weigh)."""
    b2 = beta * beta
    denominator = b2 * s_fact + s_cov
    return (1 + b2) * s_fact * s_cov / denominator if denominator else 0.0


def covered_by_qrels(
    supporting_docs: Iterable[str | None], qrels: Mapping[str, set[str]]
) -> set[str]:
    """ICAT-M: the subtopics the qrels of this query mark relevant for the document of each
    grounded claim's first entailing snippet (None: the claim is not grounded)."""
    covered: set[str] = set()
    for doc in supporting_docs:
        if doc is not None:
            covered |= qrels.get(doc, set())
    return covered


_OBJECT = re.compile(r"\{[^{}]*\}")


@dataclass(frozen=True)
class Alignment:
    """What an alignment found (a ``Covering``: a panel or a cascade combines it aspect by aspect
    with ``Cover``, and a person's set of covered aspects is one with no evidence)."""

    covered: list[int]  # aspect numbers (1..n) counted, in order of first mention
    evidence: dict[int, list[int]]  # aspect number -> its valid claim numbers
    ignored: list[str]  # lines that were read but did not count, and why

    def covers(self) -> dict[int, list[int]]:
        return {n: self.evidence.get(n, []) for n in self.covered}

    @classmethod
    def from_covers(cls, found: dict[int, list[int]]) -> Alignment:
        return cls(list(found), {n: list(claims) for n, claims in found.items()}, [])


def parse_alignment(text: str, n_aspects: int, n_claims: int) -> Alignment:
    """ICAT-S/A alignment output: one JSON object per line, {"topic_id": j, "evidence": [i, ...]}
    with aspects numbered 1..n_aspects and claims 1..n_claims. An aspect counts once (its first
    line decides) and only if that line cites at least one valid claim number. Output with no
    JSON object at all is unreadable unless it is empty (nothing covered)."""
    objects = _OBJECT.findall(text or "")
    if not objects and (text or "").strip() and (text or "").strip().lower() not in {"none", "[]"}:
        raise ParseError('expected lines {"topic_id": <aspect number>, "evidence": [<claims>]}')
    covered: list[int] = []
    evidence: dict[int, list[int]] = {}
    seen: set[int] = set()
    ignored: list[str] = []
    for raw in objects:
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            ignored.append(f"not JSON: {raw[:60]}")
            continue
        topic = _as_int(entry.get("topic_id"))
        if topic is None or not 1 <= topic <= n_aspects:
            ignored.append(f"no aspect {entry.get('topic_id')!r}")
            continue
        if topic in seen:
            ignored.append(f"aspect {topic} again")
            continue
        seen.add(topic)
        cited = entry.get("evidence")
        numbers = [_as_int(c) for c in cited] if isinstance(cited, list) else []
        valid = sorted({n for n in numbers if n is not None and 1 <= n <= n_claims})
        if not valid:
            ignored.append(f"aspect {topic} without a valid claim")
            continue
        covered.append(topic)
        evidence[topic] = valid
    return Alignment(covered, evidence, ignored)


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def macro_average(values: Iterable[float | None]) -> tuple[float | None, int, int]:
    """(mean of the defined values, how many, how many undefined)."""
    values = list(values)
    defined = [v for v in values if v is not None]
    mean = sum(defined) / len(defined) if defined else None
    return mean, len(defined), len(values) - len(defined)
