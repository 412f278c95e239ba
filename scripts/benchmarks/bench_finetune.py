"""Fine-tuning cost on this machine, measured side by side in one run.

1. Training the tiny Llama of the tests on chat examples: LoRA vs full fine-tuning of the same
   model, same data and steps -- tokens/s, seconds/step and peak resident memory, each mode in its
   own process (so the peak is that mode's).
2. With ``--teacher N``: teacher-data generation on the embedded model started here (N topics,
   2 entities each), examples/min.

    python scripts/benchmarks/bench_finetune.py --steps 40 [--teacher 4]

What the paper's run needs, measured on one H200 by ``scripts/gpu_check.py`` (random weights in the
Llama-3.1-8B shape, the project's trainer, r=64 on every linear layer, micro-batch 4 x 4,
512-token examples, gradient checkpointing): QLoRA (nf4) 5,209 tokens/s at 8.8 GiB peak, bf16
LoRA 2,405 tokens/s at 19.8 GiB. 1,000 examples x ~400 tokens at effective batch 16 is 63 steps,
about 1.3 minutes of QLoRA -- teacher generation with a 405B model dominates.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARAGRAPHS = [
    (
        "The river city has a tower. The tower is old and tall.",
        ["The river city has a tower.", "The tower is old.", "The tower is tall."],
    ),
    (
        "Water and energy come from the river. The city sells music.",
        ["Water comes from the river.", "Energy comes from the river.", "The city sells music."],
    ),
    (
        "The family history of the city starts with a tower.",
        ["The family history of the city starts with a tower."],
    ),
    (
        "Science and music are taught in the city near the water.",
        [
            "Science is taught in the city.",
            "Music is taught in the city.",
            "The city is near the water.",
        ],
    ),
]


def one_mode(args) -> None:
    """Child process: train one mode, print its numbers and peak RSS as JSON."""
    from groundcover.pipelines.finetune.train import TrainOptions, train

    options = TrainOptions(
        data=Path(args.data),
        base=args.base,
        out=Path(args.out),
        rank=16,
        alpha=32,
        learning_rate=1e-3,
        batch_size=4,
        micro_batch=4,
        max_steps=args.steps,
        save_steps=10_000,
        full=args.mode == "full",
    )
    card = train(options, progress=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    print(
        json.dumps(
            {
                "mode": args.mode,
                "seconds": card["seconds"],
                "tokens": card["tokens"],
                "steps": card["steps"],
                "first_loss": card["first_loss"],
                "final_loss": card["final_loss"],
                "peak_rss_mib": peak,
            }
        )
    )


def bench_training(tmp: Path, steps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from groundcover.pipelines.finetune.examples import chat_example
    from tests.support.tiny import build_tiny_llama

    base = build_tiny_llama(tmp / "tiny")
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(chat_example(p, c)) + "\n" for p, c in PARAGRAPHS * 4))
    rows = {}
    for mode in ("lora", "full"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--data",
                str(data),
                "--base",
                str(base),
                "--out",
                str(tmp / mode),
                "--steps",
                str(steps),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    for mode, row in rows.items():
        print(
            f"{mode:4s}: {row['tokens'] / row['seconds']:8.0f} tokens/s, "
            f"{row['seconds'] / row['steps']:.3f} s/step, "
            f"peak RSS {row['peak_rss_mib']:.0f} MiB, "
            f"loss {row['first_loss']:.3f} -> {row['final_loss']:.3f}"
        )
    lora, full = rows["lora"], rows["full"]
    speed = (lora["tokens"] / lora["seconds"]) / (full["tokens"] / full["seconds"])
    print(
        f"LoRA / full: speed {speed:.2f}x, peak memory "
        f"{lora['peak_rss_mib'] / full['peak_rss_mib']:.2f}x"
    )


def bench_teacher(tmp: Path, n_topics: int) -> None:
    from groundcover.pipelines.finetune.teacher import TEACHER_DATA, TeacherOptions
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.execute import execute

    topics = tmp / "topics.txt"
    topics.write_text(
        "".join(
            f"{t}\n"
            for t in ["rivers of Europe", "baroque music", "solar energy", "ancient Rome"][
                :n_topics
            ]
        )
    )
    options = TeacherOptions(topics=topics, entities=2)
    request = RunRequest(
        EvaluatorConfig(concurrency=8, max_tokens=256), RunConfig(run_dir=tmp / "teacher"), options
    )
    started = time.perf_counter()
    outcomes = execute(TEACHER_DATA, request, quiet=True)
    elapsed = time.perf_counter() - started
    examples = sum(len(r.details.get("examples", [])) for r in outcomes["examples"].results)
    print(
        f"teacher data (embedded, incl. server start): {examples} examples in {elapsed:.0f} s "
        f"= {60 * examples / elapsed:.1f} examples/min"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--teacher", type=int, default=0, help="topics for the teacher bench")
    parser.add_argument("--child")
    parser.add_argument("--data")
    parser.add_argument("--base")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        one_mode(args)
        return
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        bench_training(tmp, args.steps)
        if args.teacher:
            bench_teacher(tmp, args.teacher)


if __name__ == "__main__":
    main()
