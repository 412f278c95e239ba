"""What knowing inputs by content costs, and how fast a dead endpoint is said.

1. Digests (``serving.content.digest_path``) of a model-sized directory (``--gb``, default 2 GB in
   4 files) and of an index-like directory of ``--files`` small files (default 10,000): the first
   digest (everything read and hashed, the memo written), then a repeated one (a stat per file,
   nothing read), median of ``--rounds``. Beside them, ``sha256sum`` over the same files: the
   first digest's ratio to it says what our streaming costs over the system's tool. With
   ``--drop-caches`` (root) the page cache is dropped before each first digest, so it includes
   reading from disk; without, the files were just written and are read from memory.
2. The time from starting ``groundcover generate`` against an endpoint nobody listens on to its
   one-line error, beside the time the same process takes to import the CLI and load the items
   (the same command with ``--dry-run`` against a tolerated dead endpoint).

    python scripts/benchmarks/bench_digests.py [--gb 2] [--files 10000] [--rounds 3] [--drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from groundcover.serving.content import digest_path  # noqa: E402


def write_model(folder: Path, gb: float, files: int = 4) -> int:
    folder.mkdir(parents=True)
    block = (bytes(range(256)) * 4096)[: 1 << 20]  # 1 MiB; content does not change SHA speed
    per_file = int(gb * 1024 / files)
    for n in range(files):
        with open(folder / f"model-{n:05d}-of-{files:05d}.safetensors", "wb") as handle:
            for k in range(per_file):
                handle.write(block[:-8] + k.to_bytes(8, "little"))
    (folder / "config.json").write_text("{}")
    return per_file * files << 20


def write_index(folder: Path, files: int) -> int:
    folder.mkdir(parents=True)
    total = 0
    for n in range(files):
        sub = folder / f"shard-{n // 1000:03d}"
        sub.mkdir(exist_ok=True)
        data = f"chunk {n}: ".encode() * 80
        (sub / f"{n:06d}.jsonl").write_bytes(data)
        total += len(data)
    return total


def old_enough(folder: Path) -> None:
    """Files older than the racy window, as an input is by the time a run reads it."""
    past = time.time() - 60
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sha256sum(folder: Path) -> None:
    names = sorted(str(p) for p in folder.rglob("*") if p.is_file())
    for start in range(0, len(names), 2000):  # argument lists stay short
        subprocess.run(["sha256sum", *names[start : start + 2000]], check=True, capture_output=True)


def digests(folder: Path, rounds: int, drop: bool) -> dict[str, float]:
    first, repeated, system = [], [], []
    for _ in range(rounds):
        memo = Path(tempfile.mkdtemp(prefix="memo-"))
        if drop:
            drop_caches()
        first.append(timed(lambda memo=memo: digest_path(folder, memo)))
        repeated.append(timed(lambda memo=memo: digest_path(folder, memo)))
        if drop:
            drop_caches()
        system.append(timed(lambda: sha256sum(folder)))
        shutil.rmtree(memo)
    return {
        "first_s": statistics.median(first),
        "repeated_s": statistics.median(repeated),
        "sha256sum_s": statistics.median(system),
    }


def dead_endpoint(work: Path, rounds: int) -> dict[str, float]:
    questions = work / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "Why?"}) + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--endpoint",
        url,
    ]
    dead, dry = [], []
    for k in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(
            [*base, "--run-dir", str(work / f"r{k}")], env=env, capture_output=True, text=True
        )
        dead.append(time.perf_counter() - started)
        assert done.returncode == 1 and "connection refused" in done.stderr, done.stderr
        started = time.perf_counter()
        subprocess.run(
            [*base, "--run-dir", str(work / f"d{k}"), "--dry-run"], env=env, capture_output=True
        )
        dry.append(time.perf_counter() - started)
    return {"dead_endpoint_s": statistics.median(dead), "dry_run_s": statistics.median(dry)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drop-caches", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-digests-") as tmp:
        work = Path(tmp)
        size = write_model(work / "model", args.gb)
        files = write_index(work / "index", args.files)
        old_enough(work)
        model = digests(work / "model", args.rounds, args.drop_caches)
        index = digests(work / "index", args.rounds, args.drop_caches)
        endpoint = dead_endpoint(work, args.rounds)
    print(f"model directory: {size / 2**30:.2f} GiB in 5 files")
    ratio = model["first_s"] / model["sha256sum_s"]
    print(
        f"  first {model['first_s']:.2f} s ({size / 2**20 / model['first_s']:,.0f} MiB/s; "
        f"sha256sum {model['sha256sum_s']:.2f} s, ratio {ratio:.2f}), "
        f"repeated {model['repeated_s'] * 1000:.2f} ms "
        f"({model['first_s'] / model['repeated_s']:,.0f}x less)"
    )
    print(f"index directory: {args.files:,} files, {files / 2**20:.1f} MiB")
    print(
        f"  first {index['first_s']:.2f} s (sha256sum {index['sha256sum_s']:.2f} s), repeated "
        f"{index['repeated_s'] * 1000:.1f} ms ({index['repeated_s'] / args.files * 1e6:.1f} µs "
        "per file)"
    )
    print(
        f"dead endpoint: the one-line error {endpoint['dead_endpoint_s']:.2f} s after the "
        f"command starts; the same command's dry run {endpoint['dry_run_s']:.2f} s"
    )
    print(json.dumps({"model": model, "index": index, "endpoint": endpoint}))


if __name__ == "__main__":
    main()
