"""The runner's own cost per item: a run of many trivial items against an instant endpoint.

Each run is the whole runtime (items file, plan, run store appends, accounting, the progress
display, the summary) with the real ``EvalClient`` over HTTP to the instant stub endpoint of
``scripts/bench_scale.py`` (its own process), on the ``generate`` framework: one call per item, so
what is measured is the runtime, not a model. The same runs on an earlier revision (a git
worktree) come first, for a side-by-side; then the top of a profile of today's run.

    python scripts/bench_runner.py --items 10000 [--before REV] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def one_run(items: int, url: str, tmp: Path, progress: bool, cache: bool, profile: bool) -> None:
    """In this process (whose PYTHONPATH picks the revision): run, print items/s as JSON."""
    from pipelines.config import EvaluatorConfig, RunConfig
    from pipelines.generate import GENERATE, GenerateOptions
    from pipelines.protocol import RunRequest
    from pipelines.runner import execute

    path = tmp / "items.jsonl"
    with path.open("w") as out:
        for k in range(items):
            out.write(json.dumps({"id": f"q{k}", "question": f"Question number {k}?"}) + "\n")
    evaluator = EvaluatorConfig(model="stub", endpoint=url, concurrency=64, max_tokens=16)
    run = RunConfig(run_dir=tmp / "run", cache=(tmp / "cache.sqlite") if cache else None)
    request = RunRequest(evaluator, run, GenerateOptions(input=path))
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    execute(GENERATE, request, quiet=not progress)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    top = ""
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        top = text.getvalue()
    print(json.dumps({"items_per_s": items / seconds, "seconds": seconds, "top": top}))


def measure(tree: Path, items: int, url: str, progress: bool, cache: bool, profile: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = (
            [
                sys.executable,
                str(ROOT / "scripts" / "bench_runner.py"),
                "--one",
                str(items),
                "--url",
                url,
                "--tmp",
                tmp,
            ]
            + ["--progress"] * progress
            + ["--cache"] * cache
        )
        args += ["--profile"] * profile
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            cwd=tmp,
            check=False,
            env={
                "PYTHONPATH": str(tree),
                "PATH": "/usr/bin:/bin",
                "HOME": str(Path.home()),
                "TERM": "dumb",
            },
        )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--before", default="553c29c", help="git revision to compare with")
    parser.add_argument("--profile", action="store_true", help="print today's profile top")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(args.one, args.url, args.tmp, args.progress, args.cache, args.profile)
        return
    from bench_scale import STUB

    from serving.launcher import free_port

    port = free_port()
    stub = subprocess.Popen(
        [sys.executable, "-c", STUB, str(port), "0"], stdout=subprocess.PIPE, text=True
    )
    assert stub.stdout is not None and stub.stdout.readline().strip() == "ready"
    url = f"http://127.0.0.1:{port}/v1"
    before = Path(tempfile.mkdtemp(prefix="gc-before-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before],
        check=True,
        capture_output=True,
    )
    try:
        rows = []
        for progress, cache in ((False, False), (True, False), (False, True)):
            found = {}
            for name, tree in ((args.before, before), ("now", ROOT)):
                found[name] = measure(tree, args.items, url, progress, cache, False)
            label = ("progress shown" if progress else "quiet") + (", cache on" if cache else "")
            rows.append(
                f"| {label} | {found[args.before]['items_per_s']:,.0f} | "
                f"{found['now']['items_per_s']:,.0f} | "
                f"{found['now']['items_per_s'] / found[args.before]['items_per_s']:.1f}x |"
            )
        print(
            f"{args.items:,} generate items, one call each, instant stub endpoint, "
            "concurrency 64: items/s"
        )
        print(f"| run | {args.before} | now | now / before |\n| --- | --- | --- | --- |")
        print("\n".join(rows))
        if args.profile:
            print(measure(ROOT, args.items, url, False, False, True)["top"])
    finally:
        stub.kill()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
            check=False,
            capture_output=True,
        )


if __name__ == "__main__":
    main()
