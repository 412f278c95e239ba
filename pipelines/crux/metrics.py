"""CRUX's rules and metrics (SPEC §3), as pure functions of ratings.

A rating says how well a text answers a sub-question, 0..5 (−1: unreadable, counted as 0). For a
topic: ``ratings[passage_id][q]`` for its sub-questions q = 0..n−1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

ETA = 3  # answerable iff rating >= eta
ALPHA = 0.5
DENSITY_WEIGHT = 0.5

Ratings = Mapping[str, Sequence[int]]  # passage id -> rating per sub-question


def parse_rating(text: str) -> int:
    """The authors' parsing: the first digit in the output ("10" -> 1, "Rating: 4/5" -> 4);
    no digit -> −1 (counted as 0 wherever ratings are compared)."""
    match = re.search(r"\d", text or "")
    return int(match.group()) if match else -1


def read_rating(text: str) -> int:
    """``parse_rating`` for a live judge: no digit, or a first digit above 5, is a parse error
    (re-asked before it becomes the authors' -1)."""
    value = parse_rating(text)
    if not 0 <= value <= 5:
        raise ValueError("no rating 0-5 (the first digit of the answer is the rating)")
    return value


def answerable(ratings: Ratings, n_questions: int, eta: int = ETA) -> list[int]:
    """Sub-questions some passage answers (rating >= eta): the only ones kept."""
    return [q for q in range(n_questions) if any(r[q] >= eta for r in ratings.values())]


def oracle(
    ratings: Ratings, order: Sequence[str], questions: Sequence[int], eta: int = ETA
) -> list[str]:
    """P** by greedy set cover: repeatedly the passage answering the most still-uncovered
    answerable sub-questions at >= eta, plus 0.1 if it has any rating > 0; ties -> the lowest
    index in ``order``; stops when everything is covered or no passage adds any."""
    uncovered = set(questions)
    chosen: list[str] = []
    while uncovered:
        best, best_gain = None, 0.0
        for pid in order:
            if pid in chosen:
                continue
            hits = sum(1 for q in uncovered if ratings[pid][q] >= eta)
            if not hits:
                continue
            gain = hits + (0.1 if any(r > 0 for r in ratings[pid]) else 0.0)
            if gain > best_gain:  # strictly greater: the earlier passage wins a tie
                best, best_gain = pid, gain
        if best is None:
            break
        chosen.append(best)
        uncovered -= {q for q in uncovered if ratings[best][q] >= eta}
    return chosen


def graded_qrels(ratings: Ratings, oracle_ids: Sequence[str], questions: Sequence[int]) -> dict:
    """3 = in P**; 1 = rated strictly below P**'s maximum on every (kept) sub-question; 2 = rest."""
    top = {q: max((max(ratings[p][q], 0) for p in oracle_ids), default=0) for q in questions}
    grades = {}
    for pid, row in ratings.items():
        if pid in oracle_ids:
            grades[pid] = 3
        elif all(max(row[q], 0) < top[q] for q in questions):
            grades[pid] = 1
        else:
            grades[pid] = 2
    return grades


def coverage(
    context: Sequence[str], ratings: Ratings, questions: Sequence[int], eta: int = ETA
) -> float | None:
    """Cov(Z): share of answerable sub-questions some passage of Z answers at >= eta; a passage
    without a rating counts 0. None (undefined) when the topic has no answerable question."""
    if not questions:
        return None
    covered = sum(
        1 for q in questions if any(p in ratings and ratings[p][q] >= eta for p in context)
    )
    return covered / len(questions)


def density(
    cov: float | None,
    tokens: int,
    oracle_cov: float | None,
    oracle_tokens: int,
    weight: float = DENSITY_WEIGHT,
) -> float | None:
    """Den(Z) = ((Cov(Z)/tokens(Z)) / (Cov(Z*)/tokens(Z*)))^w; None where a part is undefined."""
    if cov is None or not oracle_cov or not tokens or not oracle_tokens:
        return None
    return ((cov / tokens) / (oracle_cov / oracle_tokens)) ** weight


def alpha_ndcg(
    ranked: Mapping[str, Sequence[str]],
    ratings: Mapping[str, Ratings],
    questions: Mapping[str, Sequence[int]],
    depth: Mapping[str, int],
    eta: int = ETA,
    alpha: float = ALPHA,
) -> dict[str, float]:
    """α-nDCG per topic with ir-measures (pyndeval): sub-questions are the subtopics, "rating >=
    eta" is relevance, and the run's order is kept by scoring each passage by its rank."""
    import ir_measures
    from ir_measures import alpha_nDCG

    out: dict[str, float] = {}
    for topic, passages in ranked.items():
        qrels = [
            ir_measures.Qrel(topic, pid, 1, str(q))  # iteration field = subtopic
            for pid, row in ratings[topic].items()
            for q in questions[topic]
            if row[q] >= eta
        ]
        if not qrels:
            continue
        run = [
            ir_measures.ScoredDoc(topic, pid, float(len(passages) - rank))
            for rank, pid in enumerate(passages)
        ]
        measure = alpha_nDCG(alpha=alpha, judged_only=False) @ max(1, min(depth[topic], 20))
        values = list(ir_measures.iter_calc([measure], qrels, run))
        out[topic] = float(values[0].value) if values else 0.0
    return out


def token_counter(name: str | None) -> Callable[[str], int]:
    """Tokens of a text with a Hugging Face tokenizer (name or path); whitespace words if None."""
    if name is None:
        return lambda text: len(text.split())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
