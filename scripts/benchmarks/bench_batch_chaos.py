"""The batch transport against a chaos Batch API, over more seeded schedules than CI runs: each
schedule has 20% of calls answered 503 or 429, 30% of creates made but their answer lost, 10%
of batches expired, a failing line and shuffled output, and a kill at one step (after the
upload, after the create before its record, during a poll, during a download), then a resume
to the end. Printed: how many schedules ended with every answer right and every custom id
paid exactly once (by the stub's own count), per kill point, and the median time and batches
of a schedule.

With ``--faults N``: the named schedules of a provider that is slow, forgetful or odd
(``tests.support.batch_chaos.SCHEDULES``: a lagging listing, a cursor that does not move, creates
made after the gateway gave up, cut and garbled files, odd lines, a stuck batch, the
enqueued-token limit, files 404 before they appear, all at once), each over N seeds with 10% of
the calls 503 / 429 and a kill at one step by the seed; printed per schedule: the run's lines
billed once, twice (or more) and lost (never billed, or answered wrong). All zero but once.

    python scripts/benchmarks/bench_batch_chaos.py --schedules 200
    python scripts/benchmarks/bench_batch_chaos.py --faults 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.support, from a checkout

from tests.support.batch_chaos import (  # noqa: E402
    KILL_POINTS,
    SCHEDULES,
    run_schedule,
    seeded_schedule,
)


def faults(seeds: int, first: int) -> int:
    """Each named schedule over ``seeds`` seeds (a kill at one step by the seed, or none):
    lines billed once, twice and lost, summed; the schedules with any line not billed once."""
    header = ("schedule", "runs", "lines", "once", "twice", "lost", "batches", "s/run")
    print(f"{header[0]:<18} " + " ".join(f"{h:>7}" for h in header[1:]))
    bad = 0
    for name in SCHEDULES:
        rows, seconds = [], []
        for seed in range(first, first + seeds):
            kill_at = (*KILL_POINTS, None)[seed % (len(KILL_POINTS) + 1)]
            with tempfile.TemporaryDirectory() as folder:
                began = time.perf_counter()
                rows.append(run_schedule(Path(folder) / "batches" / "judge-x", name, seed, kill_at))
                seconds.append(time.perf_counter() - began)
        once, twice, lost = (sum(r[k] for r in rows) for k in ("once", "twice", "lost"))
        bad += sum(r["twice"] > 0 or r["lost"] > 0 for r in rows)
        batches = statistics.median(r["batches"] for r in rows)
        cells = (len(rows), 16 * len(rows), once, twice, lost, batches)
        print(
            f"{name:<18} "
            + " ".join(f"{v:>7}" for v in cells)
            + f" {statistics.median(seconds):>7.2f}"
        )
    print(f"{bad} runs with a line billed twice or lost")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=1000, help="past CI's seeds 0-19")
    parser.add_argument("--faults", type=int, default=0, help="seeds per named schedule")
    args = parser.parse_args()
    if args.faults:
        return faults(args.faults, args.first_seed)
    by_point: dict[str, list[dict]] = defaultdict(list)
    seconds = []
    for seed in range(args.first_seed, args.first_seed + args.schedules):
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            done = seeded_schedule(Path(folder) / "batches" / "judge-x", seed)
            seconds.append(time.perf_counter() - began)
        by_point[done["kill_at"]].append(done)
    header = ("kill at", "schedules", "killed", "right", "paid once", "batches")
    print(f"{header[0]:<10} " + " ".join(f"{h:>9}" for h in header[1:]))
    bad = 0
    for point in KILL_POINTS:
        rows = by_point[point]
        right = sum(r["right"] for r in rows)
        once = sum(r["paid_once"] for r in rows)
        bad += len(rows) - min(right, once)
        batches = statistics.median(r["batches"] for r in rows) if rows else 0
        killed = sum(r["killed"] for r in rows)
        print(
            f"{point:<10} " + " ".join(f"{v:>9}" for v in (len(rows), killed, right, once, batches))
        )
    print(f"median {statistics.median(seconds):.2f} s a schedule; {bad} schedules not paid once")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
