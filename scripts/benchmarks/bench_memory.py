"""Peak memory of a run against the number of items: what a 100,000-item meta-evaluation costs.

Each size runs in its own process: the runtime (plan, run store, bounded worker queue, summary)
over N items of about 2 KB of text each, answered by the scripted client (``generate``: one call
per item, a ~300-character answer), so the numbers are the runtime's, not a model's. Prints the
peak RSS per size and the slope in KB per item (median of the pairwise slopes).

    python scripts/benchmarks/bench_memory.py --sizes 2000 10000 30000
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
FILLER = (
    "The tower was finished in 1889 for the fair and stands about three hundred metres "
    "tall in the middle of the city. "
)


def one_run(size: int, tmp: Path) -> None:
    """In a fresh process: write the items, run them, print the peak RSS in KB."""
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
    from groundcover.pipelines.shared.answering import GENERATE, GenerateOptions
    from tests.support.scripted import ScriptedClient

    items = tmp / "items.jsonl"
    with items.open("w") as out:
        for k in range(size):
            out.write(
                json.dumps({"id": f"q{k}", "question": f"Question {k}? " + FILLER * 18}) + "\n"
            )
    client = ScriptedClient(
        {"generate": lambda prompt: "An answer. " + FILLER * 3}, keep_calls=False
    )
    evaluator = EvaluatorConfig(model="judge", endpoint="http://127.0.0.1:9/v1", concurrency=64)
    request = RunRequest(
        evaluator, RunConfig(run_dir=tmp / "run", cache=None), GenerateOptions(input=items)
    )
    execute(GENERATE, request, quiet=True, open_client=lambda ev, d: fixed_client(client))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 10000, 30000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            one_run(args.one, Path(tmp))
        return
    peaks = {}
    for size in args.sizes:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(size)],
            check=True,
            capture_output=True,
            text=True,
        )
        peaks[size] = int(done.stdout.split()[-1]) / 1024
        print(f"{size:>7} items: peak RSS {peaks[size]:,.0f} MiB", flush=True)
    sizes = sorted(peaks)
    slopes = [(peaks[b] - peaks[a]) * 1024 / (b - a) for a, b in itertools.pairwise(sizes)]
    if slopes:
        per_item = statistics.median(slopes)
        print(
            f"slope {per_item:.1f} KB per item (items ~2 KB of text): 100,000 items ~ "
            f"{peaks[sizes[0]] + per_item * (100_000 - sizes[0]) / 1024:,.0f} MiB"
        )


if __name__ == "__main__":
    main()
