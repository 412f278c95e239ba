"""The encoder's batch size on the CPU, side by side in one process: CPU seconds and wall seconds
to embed the same chunks (real prose: the Python standard library's docstrings, chunked as an
index build chunks them) at each batch size, in rounds that alternate the sizes, with the
median of the rounds and each size's ratio to the smallest; and the largest difference between
the vectors two sizes give (padding changes the arithmetic, not the embedding).

    python scripts/benchmarks/bench_encode_batch.py --chunks 512 --threads 1 --rounds 3

``IndexSpec.batch_size`` defaults to ``CPU_ENCODE_BATCH`` on the CPU from this measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from offline_corpus import docstrings  # noqa: E402


def chunk_texts(n: int, size: int, overlap: int) -> list[str]:
    from groundcover.index_build.chunking import ChunkSpec
    from groundcover.index_build.corpus import Document

    spec, texts = ChunkSpec("words", size, overlap), []
    for doc_id, title, text in docstrings(Path(sysconfig.get_paths()["stdlib"])):
        text = " ".join(text.split())
        if len(text.split()) < 20:
            continue
        texts += [c.text for c in spec.chunks(Document(id=doc_id, text=text, title=title))]
        if len(texts) >= n:
            return texts[:n]
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=32, help="words per chunk")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--sizes", default="8,16,32,64", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="default", help="an encoder name or path")
    args = parser.parse_args()

    import torch

    from groundcover.index_build.build import CPU_ENCODE_BATCH, load_encoder, resolve_model

    torch.set_num_threads(args.threads)
    texts = chunk_texts(args.chunks, args.chunk_size, args.chunk_size // 4)
    model = load_encoder(resolve_model(args.model), "cpu")
    tokens = sum(len(model.tokenizer(t)["input_ids"]) for t in texts) / len(texts)
    sizes = [int(s) for s in args.sizes.split(",")]
    cpu: dict[int, list[float]] = {s: [] for s in sizes}
    wall: dict[int, list[float]] = {s: [] for s in sizes}
    vectors: dict[int, np.ndarray] = {}
    model.encode(texts[:32], batch_size=8)  # warm: the first pass allocates
    for _ in range(args.rounds):
        for size in sizes:
            began, clock = time.process_time(), time.perf_counter()
            vectors[size] = model.encode(texts, batch_size=size, normalize_embeddings=True)
            cpu[size].append(time.process_time() - began)
            wall[size].append(time.perf_counter() - clock)
    base = statistics.median(cpu[sizes[0]])
    print(
        f"{len(texts)} chunks of {tokens:.0f} tokens on average, {args.threads} thread(s), "
        f"median of {args.rounds} rounds (default on the CPU: {CPU_ENCODE_BATCH})"
    )
    print(f"| batch | CPU s | wall s | CPU vs batch {sizes[0]} | max |diff| vs batch {sizes[0]} |")
    print("|---|---|---|---|---|")
    for size in sizes:
        mid = statistics.median(cpu[size])
        diff = float(np.abs(vectors[size] - vectors[sizes[0]]).max())
        print(
            f"| {size} | {mid:.2f} | {statistics.median(wall[size]):.2f} | {mid / base:.2f} "
            f"| {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
