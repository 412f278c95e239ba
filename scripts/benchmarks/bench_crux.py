"""The cost of CRUX's ratings, measured side by side on one server.

1. ratings/s for the same (passage, sub-question) pairs rated one at a time (sequential
   requests, the straightforward loop) vs concurrently through our client (the server batches);
2. a rerun of the concurrent pass with the response cache: hit rate and speed-up;
3. the cost model of a full build -- calls = passages x sub-questions per topic -- for the
   paper's datasets (Table 4 of the CRUX paper: DUC 50 topics, 1,931 relevant passages,
   15 sub-questions; Multi-News test 4,986 topics, 62,126 relevant passages, 10 sub-questions),
   in hours at the measured rate.

Passages and sub-questions are TREC Web Track topic descriptions and subtopics (real text).

    python scripts/benchmarks/bench_crux.py --pairs 48 --concurrency 16
    python scripts/benchmarks/bench_crux.py --endpoint http://gpu:8000/v1 \
        --model Llama-3.1-70B-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from groundcover.pipelines.crux.framework import PROMPTS
from groundcover.pipelines.crux.metrics import parse_rating
from groundcover.serving.cache import ResponseCache
from groundcover.serving.client import EvalClient
from groundcover.serving.launch.server import endpoint_or_local

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ROOT.parent / "shared" / "data" / "trec-web" / "topics.jsonl"
DATASETS = {"DUC": (50, 1931, 15), "Multi-News test": (4986, 62126, 10)}


def pairs(n: int) -> list[tuple[str, str]]:
    out = []
    for line in TOPICS.read_text().splitlines():
        topic = json.loads(line)
        for sub in topic["subtopics"]:
            out.append((sub["description"], topic["description"]))
            if len(out) == n:
                return out
    return out


async def rate_all(client: EvalClient, work: list[tuple[str, str]], concurrent: bool) -> float:
    template = PROMPTS["rate"]

    async def one(question: str, text: str) -> int:
        result = await client.chat(
            template.messages(question=question, text=text),
            stage="rate",
            template=template.id,
            temperature=0.0,
            max_tokens=8,
        )
        return parse_rating(result.text)

    started = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(one(q, t) for q, t in work))
    else:
        for q, t in work:
            await one(q, t)
    return time.perf_counter() - started


async def bench(url: str, model: str, args) -> None:
    work = pairs(args.pairs)
    async with EvalClient(url, model, concurrency=1) as client:
        sequential = await rate_all(client, work, concurrent=False)
    with tempfile.TemporaryDirectory() as tmp:
        cache = ResponseCache(Path(tmp) / "cache.sqlite")
        async with EvalClient(url, model, concurrency=args.concurrency, cache=cache) as client:
            concurrent = await rate_all(client, work, concurrent=True)
            before = client.usage["rate"].cache_hits
            cached = await rate_all(client, work, concurrent=True)
            hits = client.usage["rate"].cache_hits - before
    rate = len(work) / concurrent
    print(f"{len(work)} ratings, model {model}")
    print(f"sequential: {len(work) / sequential:7.2f} ratings/s")
    print(
        f"concurrent ({args.concurrency}): {rate:7.2f} ratings/s "
        f"= {sequential / concurrent:.2f}x sequential"
    )
    print(f"cached rerun: hit rate {hits / len(work):.0%}, {concurrent / cached:.0f}x faster")
    for name, (topics, passages, questions) in DATASETS.items():
        calls = passages * questions
        hours = calls / rate / 3600
        print(
            f"full build {name}: {topics} topics, {passages} passages x {questions} "
            f"questions = {calls:,} ratings = {hours:.1f} h at the concurrent rate"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--endpoint")
    parser.add_argument("--model", default="embedded")
    args = parser.parse_args()
    with endpoint_or_local(args.model, args.endpoint) as (url, name):
        asyncio.run(bench(url, name, args))


if __name__ == "__main__":
    main()
