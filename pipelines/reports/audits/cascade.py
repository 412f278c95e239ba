"""Trust or escalate: a threshold on each judge's confidence, calibrated on human labels, under
which its judgements agree with people at least 1 - alpha of the time with probability at least
1 - delta (Jung, Brahman and Choi, "Trust or Escalate: LLM Judges with Provable Guarantees for
Human Agreement", ICLR 2025).

The threshold is chosen by fixed-sequence testing over a descending grid (the calibration
set's own confidences, highest first): at each threshold the judgements kept (confidence at or
above it) are tested for H0 "their disagreement with people is at least alpha" by the exact
binomial test, p = P[Binomial(n, alpha) <= errors]; the threshold is lowered while H0 is
rejected at level delta, and the last one rejected is kept. The grid starts where at least
ln(delta) / ln(1 - alpha) judgements are kept: above it no labels could reject, and skipping by
the count alone, never by the labels, leaves the sequence fixed. (p <= delta is the same as the
Clopper-Pearson upper (1 - delta) bound on the disagreement lying below alpha.) Testing in a
fixed order spends no level on multiplicity: the guarantee holds at delta for the chosen one.

A cascade of judges, cheapest first, keeps a judgement at the first tier whose confidence clears
that tier's threshold, escalates it otherwise, and abstains after the last. Each tier is
calibrated on the labelled judgements that reach it, at delta / K for K tiers, so that every
tier's kept judgements hold their guarantee together (a union bound) and so the cascade's: the
kept set's disagreement is a mixture of the tiers' at most alpha each.

With zero disagreements among n kept judgements, p = (1 - alpha)^n: the guarantee needs at least
ln(delta) / ln(1 - alpha) labelled judgements above the threshold (22 at alpha = delta = 0.1);
fewer, and it cannot be given at all (``labels_needed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Guarantee:
    """Agreement with people of at least 1 - alpha, with probability at least 1 - delta."""

    alpha: float
    delta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "delta"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} {value}: want a number strictly between 0 and 1")

    def fewest_labels(self) -> int:
        """The fewest kept judgements with which the guarantee can hold (all of them agreeing)."""
        return math.ceil(math.log(self.delta) / math.log(1 - self.alpha))


def binomial_p_value(errors: int, kept: int, alpha: float) -> float:
    """P[Binomial(kept, alpha) <= errors]: the exact test of a disagreement of alpha or more."""
    from scipy.stats import binom

    return float(binom.cdf(errors, kept, alpha))


def clopper_pearson_upper(errors: int, kept: int, delta: float) -> float:
    """The one-sided upper (1 - delta) Clopper-Pearson bound on a disagreement rate."""
    from scipy.stats import beta

    if errors >= kept:
        return 1.0
    return float(beta.ppf(1 - delta, errors + 1, kept - errors))


@dataclass
class Threshold:
    """One tier's calibration: the threshold (None: no threshold holds the guarantee), and what
    it keeps of the calibration set."""

    threshold: float | None
    kept: int
    errors: int
    labelled: int
    coverage: float
    upper_bound: float | None  # Clopper-Pearson's on the kept judgements' disagreement
    p_value: float | None
    attainable: bool
    labels_needed: int  # more kept labels that would make the guarantee attainable (0: it is)
    tested: list[dict[str, float]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def calibrate(
    confidences: Sequence[float], agrees: Sequence[bool], guarantee: Guarantee
) -> Threshold:
    """Fixed-sequence testing over the descending grid of the confidences seen (the p-values of
    every level at once; the sequence is read until its first failure)."""
    import numpy as np
    from scipy.stats import binom

    if len(confidences) != len(agrees):
        raise ValueError("one agreement per confidence")
    labelled = len(confidences)
    if not labelled:
        return _unattainable(0, [], guarantee, (0, 0))
    order = np.argsort(-np.asarray(confidences, dtype=float), kind="stable")
    ranked = np.asarray(confidences, dtype=float)[order]
    wrong = np.cumsum(~np.asarray(agrees, dtype=bool)[order])
    # each level's kept judgements: all with a confidence at or above it (ties kept together)
    last = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True))
    kept = last + 1
    # no labels could reject where fewer than `fewest` are kept: skipped by the count alone
    # (never by the labels), so the sequence stays fixed before any label is read
    top = (int(kept[0]), int(wrong[last][0]))  # the highest level's judgements
    usable = (kept >= guarantee.fewest_labels()) | (kept == labelled)
    levels, kept, errors = ranked[last][usable], kept[usable], wrong[last][usable]
    p_values = binom.cdf(errors, kept, guarantee.alpha)
    failing = np.flatnonzero(p_values > guarantee.delta)
    stop = int(failing[0]) if failing.size else len(levels)
    tested = [
        {
            "threshold": float(levels[k]),
            "kept": int(kept[k]),
            "errors": int(errors[k]),
            "p_value": float(p_values[k]),
        }
        for k in range(min(stop + 1, len(levels)))
    ]
    if stop == 0:
        return _unattainable(labelled, tested, guarantee, top)
    k = stop - 1
    return Threshold(
        threshold=float(levels[k]),
        kept=int(kept[k]),
        errors=int(errors[k]),
        labelled=labelled,
        coverage=int(kept[k]) / labelled,
        upper_bound=clopper_pearson_upper(int(errors[k]), int(kept[k]), guarantee.delta),
        p_value=float(p_values[k]),
        attainable=True,
        labels_needed=0,
        tested=tested,
    )


def _unattainable(
    labelled: int, tested: list[dict[str, float]], guarantee: Guarantee, top: tuple[int, int]
) -> Threshold:
    return Threshold(
        threshold=None,
        kept=0,
        errors=0,
        labelled=labelled,
        coverage=0.0,
        upper_bound=None,
        p_value=tested[0]["p_value"] if tested else None,
        attainable=False,
        labels_needed=more_labels_needed(*top, guarantee),
        tested=tested,
    )


def more_labels_needed(kept: int, errors: int, guarantee: Guarantee) -> int:
    """How many more labelled judgements at the highest confidence, all agreeing with people,
    would let that level hold the guarantee (``kept`` there now, ``errors`` among them)."""
    more = 1
    while binomial_p_value(errors, kept + more, guarantee.alpha) > guarantee.delta:
        more += 1
    return more


@dataclass
class TierUnits:
    """A tier's view of the calibration units: its confidence and whether its verdict agrees
    with the human label, unit by unit (the same units, in the same order, for every tier)."""

    name: str
    confidences: list[float]
    agrees: list[bool]


def calibrate_cascade(tiers: Sequence[TierUnits], guarantee: Guarantee) -> dict[str, Any]:
    """Each tier calibrated on the labelled units that reach it (those no earlier tier kept), at
    delta / K; the cascade's coverage, abstentions and disagreement on the calibration set."""
    if not tiers:
        raise ValueError("a cascade needs at least one tier")
    count = len(tiers[0].confidences)
    each = Guarantee(guarantee.alpha, guarantee.delta / len(tiers))
    reaching = list(range(count))
    out: list[dict[str, Any]] = []
    kept_errors = kept_total = 0
    for tier in tiers:
        if len(tier.confidences) != count or len(tier.agrees) != count:
            raise ValueError(f"tier {tier.name}: one confidence and agreement per unit")
        found = calibrate(
            [tier.confidences[u] for u in reaching], [tier.agrees[u] for u in reaching], each
        )
        keeps = [
            u
            for u in reaching
            if found.threshold is not None and tier.confidences[u] >= found.threshold
        ]
        kept_total += len(keeps)
        kept_errors += sum(not tier.agrees[u] for u in keeps)
        out.append(
            {"tier": tier.name, "reached": len(reaching), "kept": len(keeps)} | found.as_json()
        )
        kept = set(keeps)
        reaching = [u for u in reaching if u not in kept]
    return {
        "alpha": guarantee.alpha,
        "delta": guarantee.delta,
        "delta_per_tier": each.delta,
        "units": count,
        "tiers": out,
        "kept": kept_total,
        "abstained": len(reaching),
        "coverage": kept_total / count if count else 0.0,
        "disagreement_kept": kept_errors / kept_total if kept_total else None,
    }


def route(confidences: Sequence[float | None], thresholds: Sequence[float | None]) -> int | None:
    """The tier that keeps a judgement (its index), or None: abstained. A tier without a
    threshold, or without a confidence for the judgement, escalates it."""
    for k, (confidence, threshold) in enumerate(zip(confidences, thresholds, strict=True)):
        if confidence is not None and threshold is not None and confidence >= threshold:
            return k
    return None
