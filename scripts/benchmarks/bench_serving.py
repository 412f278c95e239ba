"""Throughput of our evaluator client vs the plain openai async client, and of a cached rerun.

Both clients hit the same vLLM server at the same concurrency, interleaved over several rounds
(each round with fresh prompts, so the server's prefix cache favours no one); medians and ratios
are printed. Without --endpoint a tiny random Llama is built and served on loopback.

    python scripts/benchmarks/bench_serving.py --requests 256 --concurrency 32 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

from groundcover.serving.cache import ResponseCache
from groundcover.serving.client import EvalClient
from groundcover.serving.launch.server import ServerSpec, VLLMServer


def prompts(tag: str, n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"{tag} question {i} about rivers"}] for i in range(n)]


async def plain(url, model, batch, concurrency, max_tokens) -> float:
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(messages):
        async with gate:
            return await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0.0
            )

    started = time.perf_counter()
    await asyncio.gather(*(one(m) for m in batch))
    elapsed = time.perf_counter() - started
    await client.close()
    return len(batch) / elapsed


async def ours(url, model, batch, concurrency, max_tokens, cache) -> tuple[float, int]:
    params = {"max_tokens": max_tokens, "temperature": 0.0}
    async with EvalClient(
        url, model, concurrency=concurrency, cache=cache, default_params=params
    ) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client.chat(m, stage="bench") for m in batch))
        elapsed = time.perf_counter() - started
        return len(batch) / elapsed, client.usage["bench"].requests


async def bench(url: str, model: str, args, workdir: Path) -> None:
    names = ("plain openai", "ours (fresh cache)", "ours cached")
    rates: dict[str, list[float]] = {name: [] for name in names}
    requests_on_rerun = []
    for round_ in range(args.rounds):
        cache = ResponseCache(workdir / f"cache-{round_}.sqlite")
        batch_a = prompts(f"a{round_}", args.requests)
        batch_b = prompts(f"b{round_}", args.requests)
        first_ours = round_ % 2 == 0  # alternate who goes first
        if first_ours:
            rate, _ = await ours(url, model, batch_b, args.concurrency, args.max_tokens, cache)
            rates["ours (fresh cache)"].append(rate)
        rates["plain openai"].append(
            await plain(url, model, batch_a, args.concurrency, args.max_tokens)
        )
        if not first_ours:
            rate, _ = await ours(url, model, batch_b, args.concurrency, args.max_tokens, cache)
            rates["ours (fresh cache)"].append(rate)
        rate, sent = await ours(url, model, batch_b, args.concurrency, args.max_tokens, cache)
        rates["ours cached"].append(rate)
        requests_on_rerun.append(sent)
        cache.close()
    med = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"{args.requests} requests x {args.rounds} rounds, concurrency {args.concurrency}, "
        f"max_tokens {args.max_tokens}"
    )
    for name, values in rates.items():
        spread = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {name:20s} median {med[name]:8.1f} req/s   rounds: {spread}")
    ratio = med["ours (fresh cache)"] / med["plain openai"]
    print(f"ratio ours/plain (median):        {ratio:.3f}")
    print(f"speed-up cached rerun vs plain:   {med['ours cached'] / med['plain openai']:.1f}x")
    print(f"model requests sent by the cached reruns: {sum(requests_on_rerun)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoint", help="existing OpenAI-compatible URL (needs --model)")
    parser.add_argument("--model", help="model name at --endpoint")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.endpoint:
            asyncio.run(bench(args.endpoint, args.model, args, workdir))
            return
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.support
        from tests.support.tiny import build_tiny_llama

        model_dir = build_tiny_llama(workdir / "tiny-llama")
        with VLLMServer(ServerSpec(model=str(model_dir)), workdir / "serve.log") as server:
            asyncio.run(bench(server.base_url, server.served_name, args, workdir))


if __name__ == "__main__":
    main()
