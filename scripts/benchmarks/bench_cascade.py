"""Trust or escalate on a simulated meta-evaluation: two judges of known calibration, a cheap one
(its confidence c ~ U(0.5, 1), right with probability c) and a strong one (c ~ U(0.7, 1)), each
calibrated on the same human-labelled set, then run on fresh judgements. For each alpha: the
cascade's coverage, its agreement with people on the fresh judgements, how often that agreement
fell below 1 - alpha (the guarantee allows delta of the draws), the strong judge's calls saved
against asking it for everything, and the strong judge alone, calibrated the same way.

    python scripts/benchmarks/bench_cascade.py --draws 200 --labels 1000 --judgements 20000
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from groundcover.pipelines.reports.audits.cascade import (  # noqa: E402
    Guarantee,
    TierUnits,
    calibrate,
    calibrate_cascade,
    route,
)

LOWS = {"cheap": 0.5, "strong": 0.7}


def judge(rng: np.random.Generator, n: int, low: float) -> tuple[np.ndarray, np.ndarray]:
    confidence = rng.uniform(low, 1.0, n)
    return confidence, rng.random(n) < confidence


def one_draw(seed: int, alpha: float, delta: float, labels: int, judgements: int) -> dict:
    rng = np.random.default_rng(seed)
    cal = {name: judge(rng, labels, low) for name, low in LOWS.items()}
    new = {name: judge(rng, judgements, low) for name, low in LOWS.items()}
    tiers = [TierUnits(n, cal[n][0].tolist(), cal[n][1].tolist()) for n in LOWS]
    made = calibrate_cascade(tiers, Guarantee(alpha, delta))
    thresholds = [t["threshold"] for t in made["tiers"]]
    # route() for every judgement at once: the cheap tier keeps what clears its threshold,
    # the strong one what it then clears, the rest is abstained on
    (c0, r0), (c1, r1) = new["cheap"], new["strong"]
    t0, t1 = thresholds
    first = c0 >= t0 if t0 is not None else np.zeros(judgements, bool)
    second = ~first & (c1 >= t1) if t1 is not None else np.zeros(judgements, bool)
    kept = int(first.sum() + second.sum())
    right = int((first & r0).sum() + (second & r1).sum())
    strong_asked = int((~first).sum())
    k = int(rng.integers(judgements))  # one judgement through route() itself, as a check
    expected = 0 if first[k] else (1 if second[k] else None)
    assert route([float(c0[k]), float(c1[k])], thresholds) == expected
    alone = calibrate(cal["strong"][0].tolist(), cal["strong"][1].tolist(), Guarantee(alpha, delta))
    alone_kept = (
        int((new["strong"][0] >= alone.threshold).sum()) if alone.threshold is not None else 0
    )
    return {
        "coverage": kept / judgements,
        "agreement": right / kept if kept else None,
        "saved": 1 - strong_asked / judgements,
        "alone_coverage": alone_kept / judgements,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--judgements", type=int, default=20000)
    parser.add_argument("--delta", type=float, default=0.1)
    args = parser.parse_args()
    print(
        f"{args.draws} draws, {args.labels} labels to calibrate, {args.judgements} judgements "
        f"each, delta {args.delta}"
    )
    print(
        "| alpha | cascade coverage | agreement (median) | draws below 1 - alpha | "
        "strong calls saved | strong judge alone: coverage |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for alpha in (0.05, 0.1, 0.2):
        draws = [
            one_draw(seed, alpha, args.delta, args.labels, args.judgements)
            for seed in range(args.draws)
        ]
        agreements = [d["agreement"] for d in draws if d["agreement"] is not None]
        below = sum(a < 1 - alpha for a in agreements)
        print(
            f"| {alpha} | {statistics.median(d['coverage'] for d in draws):.1%} | "
            f"{statistics.median(agreements):.1%} | {below} of {args.draws} | "
            f"{statistics.median(d['saved'] for d in draws):.1%} | "
            f"{statistics.median(d['alone_coverage'] for d in draws):.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
