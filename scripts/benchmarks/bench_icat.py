"""ICAT's grounding cost, measured side by side in one run.

1. NLI pairs/s: the (snippet, claim) pairs of many responses scored batched across responses (our
   ``NliBatcher``, what an ICAT run does with concurrent items) vs one claim at a time (each
   claim's k pairs in their own call, the straightforward loop) -- same model, same pairs.
2. Retrieval: claims/s for BM25, dense and hybrid top-k over an index of TREC Web Track texts.
3. With ``--full``: a whole ICAT run (variants s and a) on the embedded model started here, and
   the median seconds per response by stage from the records.

Default NLI model: a tiny random DeBERTa-v2 (speed only); pass a real checkpoint with --nli-model.

    python scripts/benchmarks/bench_icat.py --responses 32 --claims 8 --k 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ROOT.parent / "shared" / "data" / "trec-web" / "topics.jsonl"


def corpus_rows() -> list[dict]:
    rows = []
    for line in TOPICS.read_text().splitlines():
        topic = json.loads(line)
        rows.append({"id": f"t{topic['topic_id']}", "contents": topic["description"]})
        for sub in topic["subtopics"]:
            rows.append(
                {"id": f"t{topic['topic_id']}.{sub['subtopic_id']}", "contents": sub["description"]}
            )
    return rows


def claims_of(rows: list[dict], n_responses: int, per_response: int) -> list[list[str]]:
    rng = random.Random(0)
    texts = [r["contents"] for r in rows]
    return [rng.sample(texts, per_response) for _ in range(n_responses)]


def bench_nli(model_path: str, responses: list[list[str]], index, k: int) -> None:
    from groundcover.pipelines.icat.grounding import NliBatcher
    from groundcover.retrieval.nli import NliScorer

    scorer = NliScorer(model_path, batch_size=32, max_length=256)
    per_claim = [
        [(h.text, claim) for h in hits]
        for claims in responses
        for claim, hits in zip(claims, index.search(claims, k, "bm25"), strict=True)
    ]
    n_pairs = sum(len(p) for p in per_claim)
    scorer.probabilities(per_claim[0])  # warm-up

    async def batched() -> None:
        batcher = NliBatcher(scorer, max_pairs=512)
        await asyncio.gather(*(batcher.entailment(p) for p in per_claim))
        batcher.close()

    def one_claim_at_a_time() -> None:
        for pairs in per_claim:
            scorer.probabilities(pairs)

    rates = {}
    for name, run in (
        ("batched across responses", lambda: asyncio.run(batched())),
        ("one claim at a time", one_claim_at_a_time),
    ):
        times = []
        for _ in range(3):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        rates[name] = n_pairs / statistics.median(times)
        print(f"NLI {name:26s}: {rates[name]:8.1f} pairs/s ({n_pairs} pairs, median of 3)")
    ratio = rates["batched across responses"] / rates["one claim at a time"]
    print(f"ratio batched / one claim at a time: {ratio:.2f}x")


def bench_retrieval(index, responses: list[list[str]], k: int) -> None:
    claims = [c for claims in responses for c in claims]
    for mode in ("bm25", "dense", "hybrid"):
        index.search(claims[:8], k, mode)
        times = []
        for _ in range(3):
            started = time.perf_counter()
            for claims_of_one in responses:  # per response, as an ICAT item does
                index.search(claims_of_one, k, mode)
            times.append(time.perf_counter() - started)
        print(f"retrieval {mode:6s}: {len(claims) / statistics.median(times):8.1f} claims/s")


def bench_full(tmp: Path, index_dir: Path, model_path: str, n: int) -> None:
    from groundcover.pipelines.icat.framework import ICAT, IcatOptions
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.execute import execute

    topics = [json.loads(line) for line in TOPICS.read_text().splitlines()][:n]
    responses = tmp / "responses.jsonl"
    responses.write_text(
        "".join(
            json.dumps({"query_id": t["topic_id"], "response": t["description"]}) + "\n"
            for t in topics
        )
    )
    options = IcatOptions(
        input=responses,
        queries=TOPICS,
        index=index_dir,
        nli_model=model_path,
        retrieval="hybrid",
        variants=["s", "a"],
    )
    request = RunRequest(EvaluatorConfig(concurrency=8), RunConfig(run_dir=tmp / "run"), options)
    started = time.perf_counter()
    outcome = execute(ICAT, request, quiet=True)[""]
    elapsed = time.perf_counter() - started
    stages: dict[str, list[float]] = {}
    for record in outcome.results:
        for stage, seconds in record.details.get("seconds", {}).items():
            stages.setdefault(stage, []).append(seconds)
    claims = sum(len(r.details.get("claims", [])) for r in outcome.results)
    print(
        f"full run: {len(outcome.results)} responses in {elapsed:.1f} s, {claims} claims "
        f"({claims / elapsed:.2f} claims/s end to end)"
    )
    for stage, values in stages.items():
        print(f"  {stage:10s} median {statistics.median(values):7.2f} s per response")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=32)
    parser.add_argument("--claims", type=int, default=8, help="claims per response")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--nli-model", help="NLI checkpoint (default: tiny random DeBERTa-v2)")
    parser.add_argument("--full", type=int, default=0, help="responses for a whole ICAT run")
    args = parser.parse_args()
    if not TOPICS.is_file():
        sys.exit(f"needs {TOPICS}")
    sys.path.insert(0, str(ROOT))  # tests.support
    from groundcover.index_build.build import IndexSpec, build_index
    from groundcover.retrieval.index import SearchIndex
    from tests.support.tiny import build_tiny_classifier

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows = corpus_rows()
        corpus = tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
        build_index(corpus, tmp / "index", IndexSpec(chunk_trailing=True, faiss="auto"))
        index = SearchIndex.load(tmp / "index")
        model_path = args.nli_model or str(build_tiny_classifier(tmp / "nli"))
        responses = claims_of(rows, args.responses, args.claims)
        print(
            f"{args.responses} responses x {args.claims} claims, k={args.k}, {len(rows)} documents"
        )
        bench_nli(model_path, responses, index, args.k)
        bench_retrieval(index, responses, args.k)
        if args.full:
            bench_full(tmp, tmp / "index", model_path, args.full)


if __name__ == "__main__":
    main()
