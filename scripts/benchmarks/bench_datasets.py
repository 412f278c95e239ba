"""Peak memory of converting ConflictBank's question file: ``QA_dataset.json`` is about 1.3 GB of
JSON Lines despite its extension, and the conversion must never hold it whole.

Writes a file of that layout and size (rows shaped like the published ones, generated here),
converts it with the catalogue's converter in a fresh process, and prints the file size, the
rows, the wall time and the converting process's peak RSS (and, beside it, the same process's
RSS after importing the converter, so the conversion's own share is visible).

    python scripts/benchmarks/bench_datasets.py --gb 1.3
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILLER = "Records kept by the works describe the engine's first production run in detail. "


def write_file(path: Path, target_bytes: int) -> int:
    """JSON Lines of ConflictBank-shaped rows up to ``target_bytes``; returns the row count."""
    rows, size = 0, 0
    with path.open("w", encoding="utf-8") as out:
        while size < target_bytes:
            row = {
                "question": f"Which company first produced engine {rows}?",
                "default_claim": f"Arrow Motors first produced engine {rows}.",
                "misinformation_conflict_claim": f"Kestrel Works first produced engine {rows}.",
                "default_evidence": FILLER * 6,
                "misinformation_conflict_evidence": FILLER * 5,
                "temporal_conflict_evidence": FILLER * 5,
                "semantic_conflict_evidence": FILLER * 5,
            }
            line = json.dumps(row) + "\n"
            out.write(line)
            size += len(line)
            rows += 1
    return rows


CONVERT = """
import resource, sys, time
from pathlib import Path
from groundcover.pipelines.datasets.convert import conflictbank_train
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.perf_counter()
conflictbank_train([Path(sys.argv[1])], Path(sys.argv[2]))
print(before, time.perf_counter() - began)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.3, help="size of the generated file")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        source, out = Path(tmp) / "QA_dataset.json", Path(tmp) / "out"
        out.mkdir()
        rows = write_file(source, int(args.gb * 1e9))
        done = subprocess.run(
            [sys.executable, "-c", CONVERT, str(source), str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        imported_kb, seconds = done.stdout.split()
        converted = sum(1 for _ in (out / "train.jsonl").open(encoding="utf-8"))
        assert converted == rows, (converted, rows)
        print(
            f"file {source.stat().st_size / 1e9:.2f} GB, {rows:,} rows, converted in "
            f"{float(seconds):.1f} s ({rows / float(seconds):,.0f} rows/s)"
        )
        print(
            f"peak RSS {int(peak_kb) / 1024:.0f} MiB (after imports "
            f"{int(imported_kb) / 1024:.0f} MiB)"
        )


if __name__ == "__main__":
    main()
