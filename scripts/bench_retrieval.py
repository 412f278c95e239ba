"""Retrieval and index-building speed, measured side by side in one run; prints ratios.

1. Index build throughput (chunks/s) on a real small corpus (TREC Web subtopics + WikiContradict
   texts from ../shared, else synthetic sentences): BM25 only, and BM25 + dense + FAISS.
2. Queries/s for BM25, dense and hybrid search on that index.
3. recall@10 and speed-up of HNSW32 and IVF-HNSW against Flat on the same vectors (clustered
   synthetic vectors, --vectors N x 384).
4. NLI pairs/s with length-sorted dynamic padding against fixed padding (random DeBERTa-v2).

    python scripts/bench_retrieval.py --vectors 50000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from index_build.build import IndexSpec, build_faiss, build_index
from retrieval.index import SearchIndex
from retrieval.nli import NliScorer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def corpus(path: Path) -> list[str]:
    rows, queries = [], []
    topics = SHARED / "trec-web" / "topics.jsonl"
    if topics.is_file():
        for line in topics.open():
            topic = json.loads(line)
            queries.append(topic["query"])
            rows.append({"id": f"t{topic['topic_id']}", "contents": topic["description"]})
            for sub in topic["subtopics"]:
                rows.append({"id": f"t{topic['topic_id']}.{sub['subtopic_id']}",
                             "contents": sub["description"]})  # fmt: skip
        for n, line in enumerate((SHARED / "wikicontradict" / "humaneval-dev.jsonl").open()):
            rows.append({"id": f"wc{n}", "contents": json.loads(line)["context1_self_contained"]})
    else:
        rng = random.Random(0)
        words = "river city tower energy family history water science music sport".split()
        rows = [{"id": str(i), "contents": " ".join(rng.choices(words, k=40))} for i in range(800)]
        queries = [" ".join(rng.choices(words, k=3)) for _ in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return queries


def timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_build_and_search(tmp: Path) -> None:
    queries = corpus(tmp / "corpus.jsonl")
    results = {}
    for name, spec in [
        ("bm25 only", IndexSpec(dense_model=None)),
        ("bm25+dense+flat", IndexSpec()),
    ]:
        out = tmp / name.replace(" ", "_").replace("+", "_")
        start = time.perf_counter()
        manifest = build_index(tmp / "corpus.jsonl", out, spec)
        elapsed = time.perf_counter() - start
        results[name] = manifest["counts"]["chunks"] / elapsed
        print(
            f"build {name:16s}: {manifest['counts']['chunks']} chunks in {elapsed:6.2f} s "
            f"= {results[name]:8.1f} chunks/s"
        )
    ratio = results["bm25 only"] / results["bm25+dense+flat"]
    print(f"ratio build speed bm25-only / with dense: {ratio:.1f}x")
    index = SearchIndex.load(tmp / "bm25_dense_flat")
    batch = queries * 5
    index.search(batch[:4], k=10, mode="hybrid")  # warm up: numba compile, model load
    for mode in ("bm25", "dense", "hybrid"):
        seconds = timed(lambda mode=mode: index.search(batch, k=10, mode=mode))
        rate = len(batch) / seconds
        print(f"search {mode:6s}: {rate:9.1f} queries/s (median of 3, {len(batch)} queries)")


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(8, n // 500), dim))
    data = centres[rng.integers(0, len(centres), n)] + 0.35 * rng.normal(size=(n, dim))
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    return data.astype(np.float32)


def bench_ann(n: int) -> None:
    vectors = clustered(n, 384)
    queries = clustered(1000, 384, seed=1)
    flat, _ = build_faiss(vectors, IndexSpec(faiss="flat"))
    _, exact = flat.search(queries, 10)
    flat_s = timed(lambda: flat.search(queries, 10))
    print(f"flat          : {len(queries) / flat_s:9.1f} queries/s over {n} x 384")
    for kind in ("hnsw", "ivf-hnsw"):
        start = time.perf_counter()
        index, params = build_faiss(vectors, IndexSpec(faiss=kind))
        build_s = time.perf_counter() - start
        _, rows = index.search(queries, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact, strict=True)])
        seconds = timed(lambda index=index: index.search(queries, 10))
        print(
            f"{kind:14s}: {len(queries) / seconds:9.1f} queries/s, recall@10 {recall:.3f}, "
            f"speed-up vs flat {flat_s / seconds:5.1f}x, build {build_s:.1f} s {params}"
        )


def bench_nli(tmp: Path, pairs_n: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
    from tests.support.tiny import build_tiny_classifier

    model = build_tiny_classifier(tmp / "nli")  # random weights: speed only
    rng = random.Random(0)
    words = "the a river city tower energy family history water science music".split()

    def text(low: int, high: int) -> str:
        return " ".join(rng.choices(words, k=rng.randint(low, high)))

    pairs = [(text(5, 120), text(3, 20)) for _ in range(pairs_n)]
    rates = {}
    for dynamic in (True, False):
        scorer = NliScorer(str(model), batch_size=32, max_length=256, dynamic_padding=dynamic)
        scorer.probabilities(pairs[:32])
        seconds = timed(lambda scorer=scorer: scorer.probabilities(pairs))
        rates[dynamic] = pairs_n / seconds
        print(f"NLI {'dynamic' if dynamic else 'fixed':7s} padding: {rates[dynamic]:8.1f} pairs/s")
    print(f"ratio dynamic / fixed padding: {rates[True] / rates[False]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=50_000)
    parser.add_argument("--nli-pairs", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_build_and_search(Path(tmp))
        bench_ann(args.vectors)
        bench_nli(Path(tmp), args.nli_pairs)


if __name__ == "__main__":
    main()
