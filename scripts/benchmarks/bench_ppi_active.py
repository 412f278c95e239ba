"""The prediction-powered mean's interval per label, by how the labelled items are drawn, on the
same simulated runs: a judge gives each of N items a verdict (score 0 or 1) with a confidence c
~ U(0.5, 1), and a person agrees with it with probability c (a judge of known calibration). For
each run and label budget n, the queue is drawn as ``agreement --sample n --strategy S`` draws
it (``random``, ``stratified`` by verdict, ``active``: each item's probability from the judge's
confidence) and the mean estimated as ``agreement`` does (PPI++ through ppi_py, each label
weighted by 1 / its inclusion probability). Per strategy and n: the median 95% half-width, the
half-width times sqrt(n) (what one label is worth: smaller is better), and how often the interval
held the people's true mean over the N items.

    python scripts/benchmarks/bench_ppi_active.py --items 2000 --runs 300 --sizes 50 100 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from groundcover.pipelines.reports.audits.agreement import design_ppi  # noqa: E402
from groundcover.pipelines.reports.people.labels import draw  # noqa: E402
from groundcover.pipelines.runtime.contract.results import ItemResult  # noqa: E402

STRATEGIES = ("random", "stratified", "active")


JUDGES = {
    "c ~ U(0.5, 1)": lambda v: 0.5 + 0.5 * v,
    "c = 1 - 0.5 v^3 (mostly sure)": lambda v: 1 - 0.5 * v**3,
}


def simulated_run(seed: int, items: int, judge: str) -> tuple[list[ItemResult], dict[str, float]]:
    """The judge's records (verdict and confidence) and what people would say of each item."""
    rng = np.random.default_rng(seed)
    verdict = (rng.random(items) < 0.6).astype(float)
    confidence = JUDGES[judge](rng.random(items))
    agrees = rng.random(items) < confidence
    person = np.where(agrees, verdict, 1 - verdict)
    records = [
        ItemResult(
            id=f"i{k:05d}",
            status="ok",
            score=float(verdict[k]),
            explanation="simulated",
            details={
                "confidence": [
                    {"stage": "judge", "value": int(verdict[k]), "confidence": float(confidence[k])}
                ]
            },
        )
        for k in range(items)
    ]
    return records, {r.id: float(person[k]) for k, r in enumerate(records)}


def one(records: list[ItemResult], person: dict[str, float], n: int, strategy: str, seed: int):
    queue = draw(records, n, strategy, seed)
    weights = {d.id: d.weight for d in queue.items}
    scores = {r.id: float(r.score) for r in records}  # type: ignore[arg-type]
    labelled = sorted(weights)
    estimate, low, high = design_ppi(  # as agreement does it
        scores,
        {i: person[i] for i in labelled},
        [weights[i] for i in labelled],
    )
    return (high - low) / 2, low <= float(np.mean(list(person.values()))) <= high, len(labelled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    args = parser.parse_args()
    print(
        f"{args.runs} simulated runs of {args.items} items per judge (verdict 0/1 with "
        "confidence c, people agree with probability c); the same runs for every strategy"
    )
    print(
        "| judge | labels | strategy | median 95% half-width | half-width x sqrt(labels) | "
        "coverage |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for judge in JUDGES:
        runs = [simulated_run(seed, args.items, judge) for seed in range(args.runs)]
        for n in args.sizes:
            for strategy in STRATEGIES:
                found = [one(r, p, n, strategy, seed) for seed, (r, p) in enumerate(runs)]
                half = statistics.median(h for h, _, _ in found)
                labels = statistics.median(m for _, _, m in found)
                held = sum(c for _, c, _ in found) / len(found)
                print(
                    f"| {judge} | {n} | {strategy} | {half:.4f} | "
                    f"{half * np.sqrt(labels):.3f} | {held:.1%} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
