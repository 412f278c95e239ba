"""Which items people label when the judge says where it is unsure (``agreement --sample N
--strategy active``): each item's inclusion probability from the judge's own confidence.

The prediction-powered mean corrects the judge's mean by the labelled items' errors, each
weighted by the inverse of its inclusion probability. Its variance grows with E[(person -
judge)^2 / pi(x)]: for a budget of n labels it is least with pi(x) proportional to the root of
the judge's expected squared error on x (Zrnic and Candes, "Active Statistical Inference", ICML
2024). The judge's expected error on an item is read from its confidence: 1 - the least
confidence among the item's recorded judgements (a panel's share, a lone judge's label
probability, the confidence of the cascade tier that kept it); an item with none recorded is
read from its score s in [0, 1] as s (1 - s) (a score as the probability of a positive
verdict). A share ``MIX`` of the budget is spread evenly, as Zrnic and Candes mix their rule
with the uniform one, so no item's probability is near 0 where the judge is wrongly sure.

Given what a judge's call and a person's label cost (``--judge-cost``, ``--label-cost``), the
share labelled is the cost-optimal one of Angelopoulos et al. ("Cost-Optimal Active AI Model
Evaluation", 2025): per unit of budget, each item costs c_judge + pi(x) c_person and adds
var(H) - E[u] + E[u / pi] to the variance (u(x): the judge's expected squared error), whose
product is least at pi(x) = min(1, sqrt(c_judge u(x) / (c_person a))), with a = var(H) - E[u],
estimated by the variance of the judge's scores (the person's variance less the judge's error,
the two taken as uncorrelated); ``--sample N`` then caps the expected number of labels.

The items are drawn by randomised systematic sampling: in a random order, their probabilities laid
end to end on a line, the items holding the points u, u + 1, u + 2, ... (u uniform) are labelled,
each with exactly its probability, their number the sum of the probabilities (rounded up or
down). Each is recorded with its probability and weight 1 / pi in the queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MIX = 0.1  # the share of the budget spread evenly over the items


@dataclass(frozen=True)
class Costs:
    """What one judgement of the cheap rater (the judge) and one person's label cost."""

    judge: float
    person: float

    def __post_init__(self) -> None:
        if not all(0 < cost < math.inf for cost in (self.judge, self.person)):
            raise ValueError(
                f"costs: positive numbers, got judge {self.judge}, person {self.person}"
            )


def uncertainty(record: Any, run: Any = "run") -> tuple[float, str]:
    """The judge's expected squared error on an item's score, and where it was read: from its
    least confident recorded judgement (``confidence``), else from its score (``score``). A
    recorded confidence that is no probability (NaN, 1.65) is refused in one line naming the
    ``run``, the item and the stage, as ``cascade calibrate`` refuses it."""
    from ...runtime.contract.cascade import checked_confidence

    found: list[float] = []
    details = record.details or {}
    for entry in details.get("confidence") or []:
        if entry.get("confidence") is not None:  # a label given no probability says nothing
            stage = entry.get("stage")
            found.append(checked_confidence(entry["confidence"], run, record.id, stage))
    for entry in details.get("panel") or []:
        members = [m for m in entry.get("members") or [] if m is not None]
        if members and entry.get("value") is not None:
            found.append(sum(m == entry["value"] for m in members) / len(members))
    for entry in details.get("cascade") or []:
        kept, steps = entry.get("kept"), entry.get("tiers") or []
        if isinstance(kept, int) and not isinstance(kept, bool) and 0 < kept <= len(steps):
            confidence = steps[kept - 1].get("confidence")
            if confidence is not None:
                stage = entry.get("stage")
                found.append(checked_confidence(confidence, run, record.id, stage))
    if found:
        return float(min(1.0, max(0.0, 1.0 - min(found)))), "confidence"
    score = float(record.score)
    return score * (1.0 - score), "score"


def inclusion(
    uncertain: Sequence[float],
    size: int | None,
    spread: float,
    costs: Costs | None = None,
    mix: float = MIX,
) -> np.ndarray:
    """Each item's inclusion probability: proportional to the root of its uncertainty with
    ``size`` labels expected, or, with ``costs``, the cost-optimal probabilities (``spread``:
    the variance of the judge's scores) capped at ``size``; ``mix`` of the expected labels
    spread evenly; none above 1 (what a capped item leaves is shared by the others)."""
    root = np.sqrt(np.clip(np.asarray(uncertain, dtype=float), 0.0, None))
    items = root.size
    if costs is not None:
        wanted = (
            np.minimum(1.0, np.sqrt(costs.judge / (costs.person * spread)) * root)
            if spread > 0
            else np.ones(items)  # a judge that says one thing throughout: ask people for all
        )
        total = float(wanted.sum())
        if size is not None:
            total = min(total, float(size))
    else:
        total = float(min(size or 0, items))
        wanted = root
    shares = wanted / wanted.sum() if wanted.sum() > 0 else np.full(items, 1.0 / items)
    shares = (1 - mix) * shares + mix / items
    return capped(shares, total)


def capped(shares: np.ndarray, total: float) -> np.ndarray:
    """``total`` expected labels shared in proportion to ``shares``, none above 1: an item that
    would pass 1 is labelled surely and the rest shared by the others, until none passes."""
    out = np.zeros_like(shares)
    sure = np.zeros(shares.size, dtype=bool)
    while True:
        left = total - sure.sum()
        weight = shares[~sure].sum()
        out[~sure] = shares[~sure] * left / weight if weight > 0 else 0.0
        over = ~sure & (out > 1.0)
        if not over.any():
            out[sure] = 1.0
            return out
        sure |= over


def systematic(probabilities: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The indexes of a sample in which item i is drawn with probability exactly pi_i (each at
    most 1): the items in a random order, their probabilities laid end to end, and the ones
    holding a random start u and u + 1, u + 2, ... (randomised systematic sampling; the size is
    the sum of the probabilities, rounded up or down)."""
    order = rng.permutation(probabilities.size)
    ends = np.cumsum(probabilities[order])
    starts = ends - probabilities[order]
    points = rng.random() + np.arange(int(np.ceil(ends[-1])) if ends.size else 0)
    held = np.searchsorted(ends, points, side="right")
    held = held[(held < order.size)]
    held = held[points[: held.size] >= starts[held]]
    return np.sort(order[np.unique(held)])
