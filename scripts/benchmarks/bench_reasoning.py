"""What a reasoning judge costs over a plain one on the same items, and that it scores the same.

Every framework's fault-replay case (tests/support/faults.py: comprehensiveness x 6, ICAT,
GaRAGe, FanOutQA, CRUX, teacher data) with well-formed answers, judged twice: by a plain judge,
and over HTTP by a loopback server shaped like vLLM serving gpt-oss (``--reasons`` reasoning
tokens before every answer, returned apart by its reasoning parser, cut at max_tokens). Two
reasoning clients: one that finds the model reasons from its first reply (the default budget
then covers the reasoning), and one told to reason with a budget below what the model writes
(``--short-budget``), so every first try is cut and asked again at twice the budget.

Printed per case: items; requests and completion tokens per item, plain and reasoning; the
reasoning's share; cut replies asked again per call; items cut for good; whether every record
and table equals the plain judge's. The token counts are the loopback judge's by construction;
what a real gpt-oss writes per call must be measured on a GPU (docs/reasoning.md).

    python scripts/benchmarks/bench_reasoning.py --reasons 300 --short-budget 200
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from groundcover.serving.reasoning import Reasoning  # noqa: E402
from tests.support.faults import cases  # noqa: E402
from tests.support.loopback import replay_judged  # noqa: E402


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def scores(outcomes: dict) -> dict:
    return {
        key: (
            [(r.id, r.status, r.score, _timeless(r.details)) for r in o.results],
            _timeless(o.tables),
        )
        for key, o in outcomes.items()
    }


def totals(outcomes: dict) -> dict[str, float]:
    """Items, and requests / completion / reasoning tokens over all of them (from the
    records' usage, so as a user's report counts them)."""
    out = {"items": 0.0, "requests": 0.0, "completion": 0.0, "reasoning": 0.0, "cut": 0.0}
    for outcome in outcomes.values():
        for record in outcome.results:
            out["items"] += 1
            out["cut"] += record.status == "cut_in_reasoning"
            for usage in record.usage.values():
                out["requests"] += usage.get("requests", 0)
                out["completion"] += usage.get("completion_tokens", 0)
                out["reasoning"] += usage.get("reasoning_tokens", 0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reasons", type=int, default=300, help="reasoning tokens per answer")
    parser.add_argument(
        "--short-budget", type=int, default=200, help="a told budget below --reasons"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    short = Reasoning.make("always", "low", args.short_budget)
    print(
        f"| case | items | requests/item plain | reasoning (found) | reasoning (budget "
        f"{args.short_budget}) | completion tokens/item plain | reasoning | of which reasoning "
        "| retries per call (budget) | cut | equal |"
    )
    print("| --- " * 11 + "|")
    sums: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as quiet:
        for case in cases():
            work = Path(tmp) / case.name
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                plain, _ = replay_judged(case, 0, work / "plain")
                found, _ = replay_judged(case, args.reasons, work / "found")
                told, _ = replay_judged(case, args.reasons, work / "told", reasoning=short)
            p, f, t = totals(plain), totals(found), totals(told)
            equal = scores(found) == scores(plain) == scores(told)
            items = p["items"] or 1
            retries = (t["requests"] - p["requests"]) / max(p["requests"], 1)
            print(
                f"| {case.name} | {p['items']:.0f} | {p['requests'] / items:.1f} "
                f"| {f['requests'] / items:.1f} | {t['requests'] / items:.1f} "
                f"| {p['completion'] / items:.0f} | {f['completion'] / items:.0f} "
                f"| {f['reasoning'] / max(f['completion'], 1):.0%} | {retries:.2f} "
                f"| {f['cut'] + t['cut']:.0f} | {'yes' if equal else 'NO'} |"
            )
            for name, value in (
                ("plain", p["requests"]),
                ("found", f["requests"]),
                ("told", t["requests"]),
            ):
                sums[name] = sums.get(name, 0) + value
    print(
        f"\nrequests over all cases: plain {sums['plain']:.0f}, reasoning found from the first "
        f"reply {sums['found']:.0f} (+{sums['found'] - sums['plain']:.0f}), told with a short "
        f"budget {sums['told']:.0f} ({(sums['told'] - sums['plain']) / sums['plain']:.2f} "
        "retries per call)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
