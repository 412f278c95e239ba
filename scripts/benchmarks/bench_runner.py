"""The runner's own cost per item: runs of many trivial items against an instant endpoint.

1. ``generate`` (one call per item) through the whole runtime (items file, plan, run store
   appends, accounting, the progress display, the summary) with the real ``EvalClient`` over HTTP
   to the instant stub endpoint of ``bench_scale.py`` beside it (its own process): quiet, with the
   progress display, and with the response cache.
2. Comprehensiveness, NLI method, spec protocol: the exact-score test's item (31 calls) repeated,
   answered in-process by the scripted client (the real client above its network call).
3. FanOutQA closed-book with the judge: the runtime test's first question (an answer and a
   verdict) repeated, scripted the same way.

Each run is a fresh process on one revision: an earlier one (a git worktree) beside today's, so
the ratios are side by side; ``--profile`` adds the top of today's profile of run 1.

    python scripts/benchmarks/bench_runner.py --items 10000 --comp-items 1000 \
        [--before REV] [--profile]
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

ROOT = Path(__file__).resolve().parents[2]


def write_items(path: Path, items: int, framework: str) -> None:
    if framework == "fanoutqa":  # FanOutQA's dev file is one JSON list
        from tests.test_runtime import FANOUT

        rows = [dict(FANOUT[0], id=f"f{k}") for k in range(items)]
        path.write_text(json.dumps(rows))
        return
    with path.open("w") as out:
        for k in range(items):
            if framework == "generate":
                row = {"id": f"q{k}", "question": f"Question number {k}?"}
            else:
                from tests.test_exact_scores import ITEM

                row = {
                    "id": f"q{k}",
                    "query": ITEM.query,
                    "response": ITEM.response,
                    "contexts": ITEM.contexts,
                }
            out.write(json.dumps(row) + "\n")


def one_run(args) -> None:
    """In a fresh process whose sys.path starts at the revision's tree: run, print JSON."""
    sys.path.insert(0, str(args.tree))
    try:
        from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
        from groundcover.pipelines.runtime.contract.protocol import RunRequest
        from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
    except ImportError:  # a revision before the runtime had its own package
        from groundcover.pipelines.config import EvaluatorConfig, RunConfig  # type: ignore[no-redef]
        from groundcover.pipelines.protocol import RunRequest  # type: ignore[no-redef]
        from groundcover.pipelines.runner import execute, fixed_client  # type: ignore[no-redef]

    path = args.tmp / "items.jsonl"
    write_items(path, args.one, args.framework)
    evaluator = EvaluatorConfig(model="stub", endpoint=args.url, concurrency=64, max_tokens=16)
    run = RunConfig(run_dir=args.tmp / "run", cache=(args.tmp / "c.sqlite") if args.cache else None)
    kwargs: dict = {"quiet": not args.progress}
    if args.framework == "generate":
        from groundcover.pipelines.shared.answering import GENERATE, GenerateOptions

        study, request = GENERATE, RunRequest(evaluator, run, GenerateOptions(input=path))
    elif args.framework == "fanoutqa":
        from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
        from tests.support.scripted import ScriptedClient
        from tests.test_runtime import FANOUT_SCRIPTS

        options = FanoutOptions(input=path, judge=True)
        study, request = FANOUTQA, RunRequest(evaluator, run, options)
        client = ScriptedClient(FANOUT_SCRIPTS, check_constraints=False, keep_calls=False)
        kwargs["open_client"] = lambda ev, d: fixed_client(client)
    else:
        from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
        from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
        from tests.support.scripted import ScriptedClient
        from tests.test_exact_scores import NLI_SCRIPTS

        options = ComprehensivenessOptions(input=path, method="nli", protocol="spec")
        study, request = COMPREHENSIVENESS, RunRequest(evaluator, run, options)
        client = ScriptedClient(NLI_SCRIPTS, keep_calls=False)
        kwargs["open_client"] = lambda ev, d: fixed_client(client)
    profiler = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    execute(study, request, **kwargs)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    top = ""
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        top = text.getvalue()
    print(json.dumps({"items_per_s": args.one / seconds, "seconds": seconds, "top": top}))


def measure(
    tree: Path,
    items: int,
    url: str,
    framework: str = "generate",
    progress: bool = False,
    cache: bool = False,
    profile: bool = False,
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            str(ROOT / "scripts" / "benchmarks" / "bench_runner.py"),
            "--one",
            str(items),
            "--url",
            url,
            "--tmp",
            tmp,
            "--tree",
            str(tree),
            "--framework",
            framework,
        ]
        command += ["--progress"] * progress + ["--cache"] * cache + ["--profile"] * profile
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=tmp,
            check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "TERM": "dumb"},
        )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000, help="generate items")
    parser.add_argument("--comp-items", type=int, default=1000, help="comprehensiveness items")
    parser.add_argument("--fan-items", type=int, default=1000, help="FanOutQA judge items")
    parser.add_argument("--before", default="553c29c", help="git revision to compare with")
    parser.add_argument("--profile", action="store_true", help="print today's profile top")
    for hidden in ("--url", "--framework"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    for hidden in ("--tmp", "--tree"):
        parser.add_argument(hidden, type=Path, help=argparse.SUPPRESS)
    for hidden in ("--progress", "--cache"):
        parser.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(args)
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts" / "benchmarks"))
    from bench_scale import STUB

    from groundcover.serving.launch.server import free_port

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
    trees = ((args.before, before), ("now", ROOT))
    try:
        print(f"| run | {args.before} items/s | now items/s | now / before |")
        print("| --- | --- | --- | --- |")
        for progress, cache in ((False, False), (True, False), (False, True)) * bool(args.items):
            found = {n: measure(t, args.items, url, "generate", progress, cache) for n, t in trees}
            label = (
                f"{args.items:,} generate items (HTTP, instant stub), "
                + ("progress shown" if progress else "quiet")
                + (", cache on" if cache else "")
            )
            rate = {n: found[n]["items_per_s"] for n in found}
            print(
                f"| {label} | {rate[args.before]:,.0f} | {rate['now']:,.0f} | "
                f"{rate['now'] / rate[args.before]:.1f}x |",
                flush=True,
            )
        if args.comp_items:
            rate = {
                n: measure(t, args.comp_items, url, "comprehensiveness")["items_per_s"]
                for n, t in trees
            }
            print(
                f"| {args.comp_items:,} comprehensiveness NLI items (31 scripted calls each) | "
                f"{rate[args.before]:,.1f} | {rate['now']:,.1f} | "
                f"{rate['now'] / rate[args.before]:.1f}x |"
            )
        if args.fan_items:
            rate = {n: measure(t, args.fan_items, url, "fanoutqa")["items_per_s"] for n, t in trees}
            print(
                f"| {args.fan_items:,} FanOutQA closed-book items with the judge (2 scripted "
                f"calls each) | {rate[args.before]:,.1f} | {rate['now']:,.1f} | "
                f"{rate['now'] / rate[args.before]:.1f}x |"
            )
        if args.profile:
            print(measure(ROOT, args.items, url, "generate", profile=True)["top"])
    finally:
        stub.kill()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
            check=False,
            capture_output=True,
        )


if __name__ == "__main__":
    main()
