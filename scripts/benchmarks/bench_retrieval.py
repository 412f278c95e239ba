"""Retrieval and index-building speed, measured side by side in one run; prints ratios.

1. Index build throughput (chunks/s) on a real small corpus (TREC Web subtopics + WikiContradict
   texts from ../shared, else synthetic sentences): BM25 only, and BM25 + dense + FAISS.
2. Queries/s for BM25, dense and hybrid search on that index.
3. recall@10 and speed-up of HNSW32 and IVF-HNSW against Flat on the same vectors (clustered
   synthetic vectors, --vectors N x 384).
4. NLI pairs/s with length-sorted dynamic padding against fixed padding (random DeBERTa-v2).

    python scripts/benchmarks/bench_retrieval.py --vectors 50000

With ``--corpus`` (a corpus file, or an index directory built with dense embeddings) it measures
instead the FAISS kinds on real text and real embeddings: Flat, HNSW32, IVF-HNSW and IVF-PQ
(+refine; float16 vectors), each as built and tuned to recall@10 >= 0.95 against exact
search over held-out queries -- recall, queries/s as a ratio to Flat, bytes per vector resident
and stored, resident memory after loading, build time per 100K chunks, BM25 at the same scale,
and what a 50M-chunk index would need:

    python scripts/offline_corpus.py /tmp/offline.jsonl      # real prose any machine has
    groundcover index build /tmp/offline.jsonl /tmp/idx --chunk-size 32 --chunk-overlap 0
    python scripts/benchmarks/bench_retrieval.py --corpus /tmp/idx --queries /tmp/held-out.txt
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

from groundcover.index_build.build import IndexSpec, build_faiss, build_index
from groundcover.retrieval.index import SearchIndex
from groundcover.retrieval.nli import NliScorer

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def corpus(path: Path) -> list[str]:
    rows, queries = [], []
    topics = SHARED / "trec-web" / "topics.jsonl"
    if topics.is_file():
        for line in topics.open():
            topic = json.loads(line)
            queries.append(topic["query"])
            rows.append({"id": f"t{topic['topic_id']}", "contents": topic["description"]})
            for sub in topic["subtopics"]:
                rows.append(
                    {
                        "id": f"t{topic['topic_id']}.{sub['subtopic_id']}",
                        "contents": sub["description"],
                    }
                )
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
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.support
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
    # the pairs tokenised once (the scorer) vs again per batch (its plan, then score_batch: how
    # the scorer ran before; on a GPU the second pass took up to a fifth of a large model's time)
    scorer = NliScorer(str(model), batch_size=32, max_length=256)

    def twice() -> None:
        for rows in scorer.plan(pairs):
            scorer.score_batch([pairs[i] for i in rows])

    once_s, twice_s = timed(lambda: scorer.probabilities(pairs)), timed(twice)
    print(
        f"NLI tokenised once {pairs_n / once_s:8.1f} vs twice {pairs_n / twice_s:8.1f} pairs/s: "
        f"{twice_s / once_s:.2f}x"
    )


KINDS = {  # name -> IndexSpec fields; the build defaults otherwise
    "flat": {"faiss": "flat"},
    "hnsw32": {"faiss": "hnsw"},
    "ivf-hnsw": {"faiss": "ivf-hnsw"},
    "ivf-pq48+refine": {"faiss": "ivf-pq"},
    "ivf-pq48+refine f16": {"faiss": "ivf-pq", "vectors": "float16"},
}
RSS_CHILD = """
import sys, numpy as np
from groundcover.retrieval.index import SearchIndex

def rss():  # private (anonymous) and file-backed (page cache, shared) resident kB
    fields = dict(line.split(":") for line in open("/proc/self/status"))
    return int(fields["RssAnon"].split()[0]), int(fields["RssFile"].split()[0])

vectors = np.load(sys.argv[2])
queries = open(sys.argv[4]).read().splitlines()
before = rss()
index = SearchIndex.load(sys.argv[1])
if sys.argv[3] == "bm25":
    index.bm25_search(queries, 10)
else:
    index.vector_search(vectors, 10)
after = rss()
print((after[0] - before[0]) * 1024, (after[1] - before[1]) * 1024)
"""


def resident(index_dir: Path, work: Path, what: str) -> tuple[float, float]:
    """MB of private and file-backed memory added by loading an index and answering the
    queries once, in a fresh process."""
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            RSS_CHILD,
            str(index_dir),
            str(work / "queries.npy"),
            what,
            str(work / "queries.txt"),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    anon, file = out.stdout.split()[-2:]
    return int(anon) / 2**20, int(file) / 2**20


def flat_reference(corpus: Path, work: Path) -> Path:
    if (corpus / "manifest.json").is_file():
        return corpus
    build_index(corpus, work / "flat", IndexSpec(chunk_size=32, chunk_overlap=0))
    return work / "flat"


def measure(out: Path, vectors: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """recall@10 and queries/s of an index with its manifest's search settings."""
    from groundcover.retrieval.tune import recall

    index = SearchIndex.load(out)
    found, _ = index.vector_search(vectors, 10)
    return recall(found, exact), len(vectors) / timed(lambda: index.vector_search(vectors, 10))


def embedding_seconds(index: SearchIndex, n: int, sample: int = 2048) -> float:
    """Seconds to embed all n chunks, at the rate measured on an evenly spaced sample (for an
    index whose manifest does not record its embedding time)."""
    from groundcover.index_build.build import load_encoder

    rows = np.linspace(0, n - 1, min(sample, n)).astype(int)
    texts = [index.chunk(int(r))["text"] for r in rows]
    encoder = load_encoder(index.manifest["dense"]["model_path"], "cpu")
    seconds = timed(lambda: encoder.encode(texts, batch_size=64, normalize_embeddings=True), 1)
    return seconds * n / len(texts)


def knobs(setting: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in setting.items()) or "-"


def bench_corpus(corpus: Path, queries_file: Path, work: Path, n_queries: int) -> None:
    from groundcover.index_build.ann import plan_faiss
    from groundcover.index_build.build import derive_index
    from groundcover.retrieval.tune import TuneError, exact_top_k, read_queries, tune

    flat_dir = flat_reference(corpus, work)
    manifest = json.loads((flat_dir / "manifest.json").read_text())
    n, dim = manifest["counts"]["chunks"], manifest["dense"]["dim"]
    queries = read_queries(queries_file, n_queries)
    flat = SearchIndex.load(flat_dir)
    vectors = flat.encode(queries)
    np.save(work / "queries.npy", vectors)
    (work / "queries.txt").write_text("\n".join(queries))
    exact = exact_top_k(flat.embeddings, vectors, 10)
    embed_s = manifest["dense"].get("seconds") or embedding_seconds(flat, n)
    print(
        f"corpus: {n:,} chunks ({manifest['chunking']}), {len(queries)} held-out queries; "
        f"embedding {embed_s:,.0f} s = {1e5 * embed_s / n:,.0f} s per 100K chunks"
    )
    print(
        f"{'index':20s} {'search setting':24s} {'recall@10':>9s} {'q/s':>8s} {'x Flat':>7s} "
        f"{'B/vec index':>11s} {'B/vec vectors':>13s} {'RSS MB priv/file':>16s} "
        f"{'build s/100K':>12s}"
    )
    flat_qps = None
    plans = {}
    for name, fields in KINDS.items():
        spec = IndexSpec(**fields)
        out = flat_dir if name == "flat" else work / name.replace(" ", "_").replace("+", "_")
        if name != "flat":
            derive_index(flat_dir, out, spec)
        params = json.loads((out / "manifest.json").read_text())["faiss"]
        plans[name] = (spec, params)
        index_b = (out / "faiss.index").stat().st_size / n
        stored_b = (out / "embeddings.npy").stat().st_size / n
        anon, file = resident(out, work, "dense")
        build = 1e5 * params.get("build_seconds", 0) / n
        rows = [("as built", *measure(out, vectors, exact))]
        if name != "flat":
            try:
                record = tune(out, queries, target=0.95)
                rows.append(("tuned " + knobs(record["chosen"]), *measure(out, vectors, exact)))
            except TuneError as exc:
                print(f"{name:20s} tune: {exc}")
        for label, found_recall, qps in rows:
            flat_qps = flat_qps or qps
            print(
                f"{name:20s} {label:24s} {found_recall:9.3f} {qps:8.0f} "
                f"{qps / flat_qps:7.1f} {index_b:11.1f} {stored_b:13.1f} "
                f"{anon:7.0f}/{file:<8.0f} {build:12.1f}"
            )
    if "bm25" in manifest:
        anon, file = resident(flat_dir, work, "bm25")
        qps = len(queries) / timed(lambda: flat.bm25_search(queries, 10))
        size = sum(p.stat().st_size for p in (flat_dir / "bm25").iterdir())
        print(
            f"bm25 (memory-mapped): {qps:,.0f} queries/s, {size / n:.0f} B/chunk on disk, "
            f"load + {len(queries)} queries: RSS +{anon:.0f} MB private, +{file:.0f} MB file; "
            f"build {1e5 * manifest['bm25'].get('seconds', 0) / n:.1f} s per 100K chunks"
        )
    big = 50_000_000
    print(
        f"\n50M chunks x {dim}: index size from the build's size model (the one --memory-budget "
        "checks; estimate/file at this size in brackets); build time: adding at the measured "
        "rate, plus IVF k-means scaled by sample x lists from the ivf-hnsw training measured "
        "here, plus PQ training as measured (its sample is capped)"
    )
    ivf_params = plans["ivf-hnsw"][1]
    ivf_plan = plan_faiss(plans["ivf-hnsw"][0], n, dim)
    for name, (spec, params) in plans.items():
        here, there = plan_faiss(spec, n, dim), plan_faiss(spec, big, dim)
        actual = work / name.replace(" ", "_").replace("+", "_") / "faiss.index"
        if name == "flat":
            actual = flat_dir / "faiss.index"
        train = params.get("train_seconds", 0)
        add = params.get("build_seconds", 0) - train
        seconds = add * big / n
        if here.ivf:
            kmeans = ivf_params["train_seconds"] * (
                min(big, 64 * there.nlist)
                * there.nlist
                / (ivf_params["train_rows"] * ivf_plan.nlist)
            )
            seconds += kmeans + max(0.0, train - ivf_params["train_seconds"])
        vectors_gb = big * dim * (2 if spec.vectors == "float16" else 4) / 1e9
        lists = f", nlist {there.nlist:,}" if there.nlist else ""
        print(
            f"  {name:20s} index {there.index_bytes() / 1e9:6.1f} GB resident "
            f"({here.index_bytes() / actual.stat().st_size:.3f}), vectors {vectors_gb:5.1f} GB "
            f"on disk, FAISS build ~{seconds / 3600:,.1f} h on this machine{lists}"
        )
    print(f"  embedding 50M chunks: {big * embed_s / n / 3600:,.0f} h on this machine's CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=50_000)
    parser.add_argument("--nli-pairs", type=int, default=512)
    parser.add_argument("--corpus", type=Path, help="corpus file or built index directory")
    parser.add_argument("--queries", type=Path, help="held-out queries (text lines or JSONL)")
    parser.add_argument("--n-queries", type=int, default=1000)
    parser.add_argument("--work", type=Path, help="keep the derived indexes here")
    parser.add_argument("--nli-only", action="store_true", help="section 4 alone")
    args = parser.parse_args()
    if args.nli_only:
        with tempfile.TemporaryDirectory() as tmp:
            bench_nli(Path(tmp), args.nli_pairs)
        return
    if args.corpus:
        if args.queries is None:
            parser.error("--corpus needs --queries (held-out text of the same corpus)")
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            bench_corpus(args.corpus, args.queries, Path(tmp), args.n_queries)
        return
    with tempfile.TemporaryDirectory() as tmp:
        bench_build_and_search(Path(tmp))
        bench_ann(args.vectors)
        bench_nli(Path(tmp), args.nli_pairs)


if __name__ == "__main__":
    main()
