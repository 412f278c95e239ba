"""Metric helpers shared by the frameworks' tables and ``compare``: precision / recall / F1
from counts, intervals and paired tests (scipy, imported when first used: every command imports
this module, few compute an interval)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def precision_recall_f1(
    matched_predicted: int, predicted: int, matched_gold: int, gold: int
) -> dict[str, float | None]:
    """Precision, recall and their harmonic mean from counts. A quantity whose denominator is
    empty is None, never a silent 0; F1 is 0 when both are defined and either is 0."""
    precision = matched_predicted / predicted if predicted else None
    recall = matched_gold / gold if gold else None
    if precision is None or recall is None:
        f1 = None
    else:
        f1 = 2 * precision * recall / (precision + recall) if precision and recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


@dataclass
class Interval:
    low: float
    high: float
    method: str

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "method": self.method}


def bca_interval(values: Sequence[float], resamples: int = 10_000, seed: int = 0) -> Interval:
    """95% BCa bootstrap interval of the mean (scipy). Constant data has a zero-width interval."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    if np.all(data == data[0]):  # BCa is undefined without variance
        return Interval(float(data[0]), float(data[0]), "degenerate (all values equal)")
    from scipy import stats

    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=0.95,
        n_resamples=resamples,
        method="BCa",
        random_state=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Interval(float(ci.low), float(ci.high), f"BCa, {resamples} resamples")


def percentile_interval(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> Interval:
    """95% percentile bootstrap interval of the mean: linear in the items (for large runs)."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = np.array([data[rng.integers(0, data.size, data.size)].mean() for _ in range(resamples)])
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(float(low), float(high), f"percentile, {resamples} resamples")


@dataclass
class PairedTest:
    """Two systems' scores on the same items: the mean difference a - b with its paired BCa
    interval (resampling items, so the pairs stay together), win / tie / loss, and two tests."""

    n: int
    mean_difference: float
    interval: Interval | None  # None below two pairs
    wins: int
    ties: int
    losses: int
    sign_p: float | None  # exact two-sided binomial test on wins vs losses; None: no untied pair
    wilcoxon_p: float | None  # Wilcoxon signed-rank, zero differences dropped; None: no untied

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["interval"] = self.interval.as_dict() if self.interval else None
        return out


def paired_test(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = 10_000,
    seed: int = 0,
    tie: float = 1e-9,
) -> PairedTest:
    """``a[k]`` and ``b[k]`` score the same item. Differences within ``tie`` count as ties."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_test needs two equally long, non-empty score lists")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    d[np.abs(d) <= tie] = 0.0
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    untied = wins + losses
    from scipy import stats

    sign_p = float(stats.binomtest(wins, untied, 0.5).pvalue) if untied else None
    wilcoxon_p = float(stats.wilcoxon(d[d != 0]).pvalue) if untied else None
    return PairedTest(
        n=len(d),
        mean_difference=float(d.mean()),
        interval=bca_interval(d, resamples, seed) if len(d) > 1 else None,
        wins=wins,
        ties=len(d) - untied,
        losses=losses,
        sign_p=sign_p,
        wilcoxon_p=wilcoxon_p,
    )
