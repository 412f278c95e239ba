"""The fault-injection table: adversarial model outputs replayed through every framework.

For each case (a framework, or a method x protocol of comprehensiveness) and seed, the pool of
adversarial outputs (tests/support/adversarial.py: 14 families) is mixed with well-formed answers
and replayed through the real runtime with the scripted client. Printed: outputs sent per family,
items by status, failures recorded inside scored items, escaped exceptions (must be 0), lost
items (must be 0) and other problems (NaN, out of range, bad denominators; must be 0). Then the
malformed-input cases per file format: refused cleanly (exit 2, one line naming the file, nothing
written), escaped, or wrote files (both must be 0). Kills, dead servers and a full disk are
tests/test_outages.py (real vLLM, real tmpfs).

    python scripts/fault_report.py --per-kind 1000
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.adversarial import FAMILIES  # noqa: E402
from tests.support.faults import DEFINED, Replay, cases, replay, stage_kind  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="replays per case at least")
    parser.add_argument(
        "--per-kind",
        type=int,
        default=1000,
        help="then more seeds until every stage family got this many",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    totals = {case.name: Replay() for case in cases()}
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as quiet:
        seed = 0
        while True:
            seed += 1
            short = short_kinds(totals, args.per_kind)
            todo = [
                c for c in cases() if seed <= args.seeds or kinds_of(totals[c.name], c.name) & short
            ]
            if not todo:
                break
            for case in todo:
                with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    totals[case.name].merge(replay(case, seed, Path(tmp) / case.name / str(seed)))
                shutil.rmtree(Path(tmp) / case.name / str(seed))
    rows = list(totals.items())
    print_tables(rows)
    print()
    refused = malformed_inputs()
    bad = sum(len(r.escaped) + r.lost + len(r.problems) for _, r in rows)
    return 1 if bad or refused else 0


def malformed_inputs() -> int:
    """The malformed-input cases of tests/test_malformed_inputs.py through the CLI: how many
    per file format stopped cleanly (exit 2, one line naming the file, nothing written)."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from tests.test_malformed_inputs import CASES, COMMANDS, GOOD, NO_SERVER, OWN_OUTPUT, snapshot

    table: dict[str, Counter[str]] = {}
    here = Path.cwd()
    for bad in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for name, text in GOOD.items():
                (root / name).write_text(text)
            (root / bad.file).write_bytes(bad.bytes())
            args = COMMANDS[bad.file]
            if args[0] not in OWN_OUTPUT:
                args = [*args, "--run-dir", "run", *NO_SERVER]
            os.chdir(root)
            try:
                before = snapshot(root)
                result = CliRunner().invoke(app, args)
                lines = result.output.strip().splitlines()
                clean = (
                    result.exit_code == 2
                    and len(lines) == 1
                    and bad.file in lines[0]
                    and bad.expect in lines[0]
                )
                outcome = (
                    "wrote files"
                    if snapshot(root) != before
                    else "refused cleanly"
                    if clean
                    else "escaped"
                )
            finally:
                os.chdir(here)
        table.setdefault(bad.file, Counter())[outcome] += 1
    columns = ["refused cleanly", "escaped", "wrote files"]
    lines = [["input file", "cases", *columns]]
    for name, counts in table.items():
        lines.append([name, sum(counts.values()), *(counts[c] for c in columns)])
    total = sum((c for c in table.values()), Counter())
    lines.append(["all", sum(total.values()), *(total[c] for c in columns)])
    show(lines)
    return total["escaped"] + total["wrote files"]


def kinds_of(replayed: Replay, name: str) -> set[str]:
    return {stage_kind(name, stage) for stage in replayed.stages}


def short_kinds(totals: dict[str, Replay], target: int) -> set[str]:
    kinds: Counter[str] = Counter()
    for name, r in totals.items():
        for stage, n in r.stages.items():
            kinds[stage_kind(name, stage)] += n
    return {kind for kind, n in kinds.items() if n < target}


def print_tables(rows: list[tuple[str, Replay]]) -> None:
    head = [
        "case",
        "calls",
        "adversarial",
        *DEFINED,
        "error",
        "recorded",
        "escaped",
        "lost",
        "problems",
    ]
    lines = [head]
    for name, r in rows:
        lines.append(
            [
                name,
                r.calls,
                sum(r.families.values()),
                *(r.statuses[s] for s in DEFINED),
                r.statuses["error"],
                r.recorded,
                len(r.escaped),
                r.lost,
                len(r.problems),
            ]
        )
    total = Replay()
    for _, r in rows:
        total.merge(r)
    lines.append(
        [
            "all",
            total.calls,
            sum(total.families.values()),
            *(total.statuses[s] for s in DEFINED),
            total.statuses["error"],
            total.recorded,
            len(total.escaped),
            total.lost,
            len(total.problems),
        ]
    )
    show(lines)
    print()
    families: Counter[str] = total.families
    show([["output family", "sent"], *([f, families[f]] for f in FAMILIES)])
    print()
    kinds: Counter[str] = Counter()
    for name, r in rows:
        for stage, n in r.stages.items():
            kinds[stage_kind(name, stage)] += n
    show([["stage family", "adversarial outputs"], *sorted(kinds.items())])
    for name, r in rows:
        for message in [*r.escaped, *r.problems][:5]:
            print(f"{name}: {message}")


def show(lines: list[list]) -> None:
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    for n, line in enumerate(lines):
        print(
            " | ".join(
                str(v).rjust(w) if i else str(v).ljust(w)
                for i, (v, w) in enumerate(zip(line, widths, strict=True))
            )
        )
        if n == 0:
            print("-+-".join("-" * w for w in widths))


if __name__ == "__main__":
    raise SystemExit(main())
