"""How much a cascade tier keeps at the same guarantee: the thresholds tested (``--grid``) on
simulated judges of known calibration. Each judge's confidence c has a known distribution and
the judge agrees with people with probability exactly c (smoothly calibrated), so every
threshold's true coverage and disagreement are known. Per judge and alpha, over seeded draws of
a labelled calibration set: each grid's mean coverage (of the judge's judgements, the true
share at or above the chosen threshold; 0 where none is found), how often a threshold is found,
and how often the guarantee fails (the chosen threshold's true disagreement above alpha; allowed
in delta of the draws). Beside them the oracle threshold's coverage (the lowest threshold whose
true disagreement is alpha) and about the best any method could do: how often one exact test
passes at the count of labels kept, known in advance, where it passes most often.

    python scripts/benchmarks/bench_cascade_grid.py --draws 1000 --labels 500
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from groundcover.pipelines.reports.audits.cascade import (  # noqa: E402
    GRIDS,
    Guarantee,
    calibrate,
)

# each judge's confidence from a uniform u (agreeing with people with probability c)
JUDGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "U(1/6, 1)": lambda u: 1 / 6 + 5 / 6 * u,
    "U(0.5, 1)": lambda u: 0.5 + 0.5 * u,
    "0.5 + 0.5 sqrt(u)": lambda u: 0.5 + 0.5 * np.sqrt(u),
}
REFERENCE = 1_000_000  # judgements whose confidences give each threshold's true numbers


class Truth:
    """A judge's true coverage and disagreement at any threshold, from a large sample of its
    confidences (its disagreement at c is 1 - c exactly)."""

    def __init__(self, confidence: Callable[[np.ndarray], np.ndarray]):
        ranked = np.sort(confidence(np.random.default_rng(2**31).random(REFERENCE)))[::-1]
        self.ranked = ranked
        self.risk = np.cumsum(1 - ranked) / np.arange(1, REFERENCE + 1)

    def at(self, threshold: float) -> tuple[float, float]:
        """(coverage, disagreement) of the judgements at or above ``threshold``."""
        kept = int(np.searchsorted(-self.ranked, -threshold, side="right"))
        return kept / REFERENCE, float(self.risk[kept - 1]) if kept else 0.0

    def oracle_coverage(self, alpha: float) -> float:
        return float(np.flatnonzero(self.risk <= alpha).max() + 1) / REFERENCE

    def best_single_test(self, labels: int, guarantee: Guarantee) -> tuple[float, float]:
        """(how often the exact test passes, the share kept) for one test at the k-th highest
        labelled confidence, with the k where it passes most often known in advance (the top
        k of the labels disagreeing as the top k / labels of the judge's judgements do):
        about as often as any valid method can find a threshold."""
        from scipy.stats import binom

        best = (0.0, 0.0)
        for kept in range(1, labels + 1):
            allowed = int(binom.ppf(guarantee.delta, kept, guarantee.alpha))
            if binom.cdf(allowed, kept, guarantee.alpha) > guarantee.delta:
                allowed -= 1
            if allowed < 0:
                continue
            risk = float(self.risk[int(kept / labels * REFERENCE) - 1])
            found = float(binom.cdf(allowed, kept, risk))
            if found > best[0]:
                best = (found, kept / labels)
        return best


def one_judge(name: str, alpha: float, delta: float, labels: int, draws: int) -> dict:
    confidence = JUDGES[name]
    truth = Truth(confidence)
    guarantee = Guarantee(alpha, delta)
    out: dict = {"judge": name, "alpha": alpha, "oracle": truth.oracle_coverage(alpha)}
    for grid_name, grid in GRIDS.items():
        covered, found, failed = [], 0, 0
        for seed in range(draws):
            rng = np.random.default_rng(seed)
            c = confidence(rng.random(labels))
            agrees = rng.random(labels) < c
            chosen = calibrate(c.tolist(), agrees.tolist(), guarantee, grid).threshold
            if chosen is None:
                covered.append(0.0)
                continue
            coverage, risk = truth.at(chosen)
            covered.append(coverage)
            found += 1
            failed += risk > alpha
        out[grid_name] = {
            "coverage": float(np.mean(covered)),
            "found": found / draws,
            "failed": failed / draws,
        }
    out["best_single"] = truth.best_single_test(labels, guarantee)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--labels", type=int, default=500)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--alpha", type=float, nargs="+", default=[0.1, 0.05])
    args = parser.parse_args()
    print(
        f"{args.draws} draws of {args.labels} labels, delta {args.delta}; a judge agrees "
        "with people with probability equal to its confidence c"
    )
    print(
        "| judge: c = | alpha | every: coverage, found, failed | steps: coverage, found, "
        "failed | steps / every | oracle coverage | best single test: found (share kept) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for alpha in args.alpha:
        for name in JUDGES:
            r = one_judge(name, alpha, args.delta, args.labels, args.draws)
            every, steps = r["every"], r["steps"]
            ratio = steps["coverage"] / every["coverage"] if every["coverage"] else float("inf")
            cells = [
                f"{g['coverage']:.1%}, {g['found']:.0%}, {g['failed']:.1%}" for g in (every, steps)
            ]
            found, share = r["best_single"]
            print(
                f"| {name} | {alpha} | {cells[0]} | {cells[1]} | {ratio:.2f}x | "
                f"{r['oracle']:.1%} | {found:.0%} ({share:.1%}) |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
