r"""Reproduce the comprehensiveness paper's figures against running endpoints.

    python scripts/reproduce_comprehensiveness.py \
        --evaluators gpt-oss-20b@http://127.0.0.1:8000/v1 \
        --evaluators Llama-4-Maverick-17B-128E-Instruct@http://gpu2:8000/v1 \
        --wikicontradict wikicontradict-humaneval-48.jsonl --conflictbank cb_qa_v2-train.parquet \
        [--eli5 eli5.jsonl --eli5-judge gpt-oss-20b@http://127.0.0.1:8000/v1] [--run-dir runs/repro]

Figures 3-5 (WikiContradict, ConflictBank strict/lax/mean, average; model x method, BCa
intervals, the paper's values beside ours) come from `groundcover reproduce comprehensiveness`,
which this script runs with the remaining arguments. With --eli5, every evaluator also answers
the ELI5 questions and --eli5-judge scores them with Q&A and E2E (Figure 6; `groundcover eli5`).
Both resume where they stopped: rerun the same command.
"""

from __future__ import annotations

import argparse
import sys

from groundcover.pipelines.cli import app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--eli5")
    parser.add_argument("--eli5-judge")
    parser.add_argument("--run-dir", default="runs/reproduce-comprehensiveness")
    parser.add_argument("--evaluators", action="append", default=[])
    known, rest = parser.parse_known_args(argv)
    if not known.evaluators:
        print(__doc__)
        return 2
    grid = [arg for spec in known.evaluators for arg in ("--evaluators", spec)]
    code = _run(
        ["reproduce", "comprehensiveness", *grid, *rest, "--run-dir", f"{known.run_dir}/grid"]
    )
    if code or not known.eli5:
        return code
    judge = known.eli5_judge or known.evaluators[0]
    model, _, url = judge.partition("@")
    responders = [arg for spec in known.evaluators for arg in ("--responder", spec)]
    return _run(
        [
            "eli5",
            known.eli5,
            *responders,
            "--method",
            "qa",
            "--method",
            "e2e",
            "--model",
            model,
            *(["--endpoint", url] if url else []),
            "--run-dir",
            f"{known.run_dir}/eli5",
        ]
    )


def _run(args: list[str]) -> int:
    # standalone_mode=False: click returns the command's exit code (2: bad input) to us
    try:
        return int(app(args, standalone_mode=False) or 0)
    except SystemExit as exc:
        return int(exc.code or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
