"""Scale-out on Ray, measured side by side in one run.

1. NLI pairs/s: the cross-encoder here vs on plain Ray actors, 1 and 2 (same pairs, same
   batches; the actors load the model once, when the scorer is made) vs on a warm Ray Serve app
   of 1 and 2 replicas; the latency of one 64-pair call on each.
1b. NLI as a run sees it: 10,000 pairs arriving in 64-pair calls from 32 concurrent items,
   pooled by ``NliBatcher``, here vs Serve (1, 2 replicas) vs the Ray actors (1, 2).
1c. The driver's ceiling: EvalClient calls/s against a stub endpoint that answers at once (in its
   own process), the driver's CPU per call, and its memory per request in flight.
2. LLM pairwise calls/s: the NLI prompt of the comprehensiveness method over real sentence pairs,
   through a Ray Serve LLM app with 1 vs 2 replicas; and, on the 2-replica app, our client's
   prompt+completion tokens/s vs vLLM's own benchmark client (``vllm bench serve``, custom
   dataset of the same prompts, same concurrency, 24-token budget) and the plain openai async
   client: how close the pipeline comes to the server's ceiling.
3. Cross-item scheduling: comprehensiveness (NLI method, spec) items/min with items in flight
   together vs one item at a time, on the same 2 replicas.
4. Pruning: the same items exhaustive vs --prune-below T (same cache, so the atoms are the same):
   NLI calls saved and edge recall against the exhaustive graph of the same judge.
5. Many drivers: one FanOutQA-judge run (answers given: one judge call per item) against an
   instant stub, solved by this process vs by 2 driver actors pinned one per node of a two-node
   Ray cluster on this machine: calls/s, driver CPU per call, and calls per driver CPU-second
   (on a 2-core machine the stub, Ray and the drivers share the cores, so the last is the
   figure that must not drop with N).

Default model: the embedded SmolLM2 (weak, but a real LM: its prompts and outputs have real
lengths); NLI: a tiny random DeBERTa-v2 (speed only).

    python scripts/benchmarks/bench_scale.py --pairs 32768 --llm-pairs 96 --items 2
    python scripts/benchmarks/bench_scale.py --skip llm   # the NLI and driver sections only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
WC = ROOT.parent / "shared" / "data" / "wikicontradict" / "humaneval-dev.jsonl"
FANOUT = ROOT.parent / "shared" / "data" / "fanoutqa" / "fanout-final-dev.json"


def sentences(limit: int = 400) -> list[str]:
    """Real sentences: WikiContradict contexts when ../shared is here, else the examples."""
    rows = WC.read_text().splitlines() if WC.is_file() else []
    texts = [
        t
        for line in rows
        for k in ("context1_self_contained", "context2_self_contained")
        if (t := json.loads(line).get(k))
    ]
    if not texts:
        texts = [
            c
            for line in (ROOT / "examples/comprehensiveness.jsonl").read_text().splitlines()
            for c in json.loads(line)["contexts"]
        ]
    out = [s.strip() + "." for t in texts for s in t.split(". ") if len(s.split()) >= 5]
    return out[:limit]


@functools.cache
def distinct_sentences() -> list[str]:
    """Distinct real sentences for NLI pairs: every text of the WikiContradict and FanOutQA dev
    files when ../shared is here (else the examples', and pairs repeat)."""
    texts: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str) and len(value.split()) >= 5:
            texts.append(value)
        elif isinstance(value, dict | list):
            for inner in value.values() if isinstance(value, dict) else value:
                walk(inner)

    for path in (WC, WC.with_name("humaneval-adjudication-dev.json"), FANOUT):
        if path.is_file():
            text = path.read_text()
            lines = path.suffix == ".jsonl"
            walk([json.loads(row) for row in text.splitlines()] if lines else json.loads(text))
    texts = texts or sentences()
    found = (s.strip().rstrip(".") + "." for t in texts for s in t.split(". "))
    return sorted({s for s in found if 5 <= len(s.split()) <= 60})


def pairs_of(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct (premise, hypothesis) pairs (while the sentences last): a scorer that
    deduplicates gets no free pairs."""
    rng = random.Random(seed)
    pool = distinct_sentences()
    picks = rng.sample(range(len(pool) ** 2), min(n, len(pool) ** 2))
    picks += [rng.randrange(len(pool) ** 2) for _ in range(n - len(picks))]
    return [(pool[k // len(pool)], pool[k % len(pool)]) for k in picks]


# ---- 1. NLI -------------------------------------------------------------------------------------


def bench_nli(tmp: Path, n: int, stream_pairs: int) -> None:
    from groundcover.retrieval.nli import NliScorer
    from groundcover.retrieval.nli_ray import RayNliScorer
    from groundcover.retrieval.nli_serve import ServeNliScorer
    from tests.support.tiny import build_tiny_classifier

    model = str(build_tiny_classifier(tmp / "tiny-nli"))
    pairs = pairs_of(n)
    here = NliScorer(model)
    started = time.perf_counter()
    local = here.probabilities(pairs)
    rates = {"local": n / (time.perf_counter() - started)}
    small = {"local": statistics.median(seconds(here.probabilities, pairs[:64]) for _ in range(5))}
    tiny = {"local": statistics.median(seconds(here.probabilities, pairs[:1]) for _ in range(5))}
    streamed = {"local": stream(here, stream_pairs)}
    kinds = [("ray", RayNliScorer, "actors", k) for k in (1, 2)]
    kinds += [("serve", ServeNliScorer, "replicas", k) for k in (1, 2)]
    for kind, make, unit, count in kinds:
        scorer = make(model, **{unit: count})
        scorer.probabilities(pairs[:64])  # a first call warms each path alike
        name = f"{kind} {count} {unit[:-1] if count == 1 else unit}"
        started = time.perf_counter()
        remote = scorer.probabilities(pairs)
        rates[name] = n / (time.perf_counter() - started)
        assert (remote.argmax(1) == local.argmax(1)).all()
        small[name] = statistics.median(seconds(scorer.probabilities, pairs[:64]) for _ in range(5))
        tiny[name] = statistics.median(
            seconds(scorer.probabilities, pairs[k : k + 1]) for k in range(5)
        )
        streamed[name] = stream(scorer, stream_pairs)
        scorer.close()  # its Ray driver process and local Ray with it
    print(
        f"1. NLI, {n} pairs in one call (tiny DeBERTa-v2), pairs/s: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
    )
    print(
        f"   ray 2 / 1 actors: {rates['ray 2 actors'] / rates['ray 1 actor']:.2f}"
        f"x; serve 2 / 1 replicas: {rates['serve 2 replicas'] / rates['serve 1 replica']:.2f}x"
    )
    print(
        "   one call of 64 pairs, median of 5: "
        + ", ".join(f"{k} {v * 1000:,.0f} ms" for k, v in small.items())
    )
    print(
        "   one call of 1 pair (the cost of a call itself), median of 5: "
        + ", ".join(f"{k} {v * 1000:,.1f} ms" for k, v in tiny.items())
    )
    for actors in (1, 2):
        for replicas in (1, 2):
            data = small[f"ray {actors} {'actor' if actors == 1 else 'actors'}"]
            warm = small[f"serve {replicas} {'replica' if replicas == 1 else 'replicas'}"]
            print(
                f"   a 64-pair call, ray {actors} / serve {replicas}: {data / warm:,.2f}x the time"
            )
    print(
        f"1b. {stream_pairs:,} pairs in 64-pair calls from 32 concurrent items (NliBatcher "
        "pools them), pairs/s and ratio to local: "
        + ", ".join(f"{k} {v:,.0f} ({v / streamed['local']:.2f}x)" for k, v in streamed.items()),
        flush=True,
    )


def stream(scorer, total: int, items: int = 32, per_call: int = 64) -> float:
    """Pairs/s when ``items`` concurrent items each send 64-pair calls until ``total`` pairs
    have been asked, through the ``NliBatcher`` a run uses (pairs are new on every call)."""
    from groundcover.retrieval.nli import NliBatcher

    calls = [pairs_of(per_call, seed=1000 + k) for k in range(-(-total // per_call))]

    async def run() -> float:
        batcher = NliBatcher(scorer)
        queue = list(range(len(calls)))

        async def item() -> None:
            while queue:
                await batcher.rows(calls[queue.pop()])

        started = time.perf_counter()
        await asyncio.gather(*(item() for _ in range(items)))
        elapsed = time.perf_counter() - started
        batcher.close()
        return len(calls) * per_call / elapsed

    return asyncio.run(run())


# ---- 1c. the driver's ceiling -------------------------------------------------------------------

STUB = r"""
import asyncio, json, sys
CONTENT = sys.argv[3] if len(sys.argv) > 3 else "entailment"
BODY = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": CONTENT}}],
    "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}}).encode()
DELAY = float(sys.argv[2])

async def answer(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if DELAY:
                await asyncio.sleep(DELAY)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(BODY) + BODY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()

async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


BEFORE = "553c29c"  # the last commit with the openai-SDK client and the per-answer cache commit


def client_before(rev: str, folder: Path):
    """``EvalClient`` and ``ResponseCache`` as they were at ``rev`` (git), importable beside
    today's: the "before" columns of the same run."""
    package = folder / "serving_before"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in ("client", "cache"):
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:serving/{name}.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (package / f"{name}.py").write_text(
            text.replace("from groundcover.serving.cache", "from serving_before.cache").replace(
                "from serving.cache", "from serving_before.cache"
            )
        )
    sys.path.insert(0, str(folder))
    import serving_before.cache
    import serving_before.client

    return serving_before.client.EvalClient, serving_before.cache.ResponseCache


def distinct_messages(calls: int) -> list[list[dict]]:
    """One NLI prompt, made distinct per call so that no call is a cache hit."""
    base = nli_messages(1)[0]
    return [
        base[:-1] + [{**base[-1], "content": f"{base[-1]['content']} ({n})"}] for n in range(calls)
    ]


async def drive_client(make, url: str, messages, concurrency: int, cache=None):
    """(calls/s, driver CPU ms per call, peak RSS MB): ``EvalClient``-like ``make`` in one loop."""
    peak = rss_mb()
    client = make(
        url,
        "stub",
        concurrency=concurrency,
        max_retries=0,
        cache=cache,
        default_params={"max_tokens": 4},
        vllm_extensions=False,
    )
    cpu, started = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(client.chat(m, stage="nli")) for m in messages]
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.05)
        peak = max(peak, rss_mb())
    await asyncio.gather(*tasks)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await client.aclose()
    if cache is not None:
        cache.close()
    return len(messages) / elapsed, 1000 * cpu / len(messages), peak


async def drive_sdk(url: str, messages, concurrency: int):
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(m):
        async with gate:
            response = await client.chat.completions.create(model="stub", messages=m, max_tokens=4)
            return response.model_dump(exclude_unset=True)

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(m) for m in messages))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await client.close()
    return len(messages) / elapsed, 1000 * cpu / len(messages), 0.0


async def drive_bare(url: str, messages, concurrency: int):
    """vLLM's benchmark client in miniature: one aiohttp session, a semaphore, POST, read JSON."""
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(m):
            async with gate:
                body = {"model": "stub", "messages": m, "max_tokens": 4}
                async with session.post(url + "/chat/completions", json=body) as response:
                    return json.loads(await response.read())

        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(m) for m in messages))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return len(messages) / elapsed, 1000 * cpu / len(messages), 0.0


def bench_driver(calls: int, concurrencies: list[int], in_flight: list[int], before: str) -> None:
    from groundcover.serving.cache import ResponseCache
    from groundcover.serving.client import EvalClient
    from groundcover.serving.launch.server import free_port

    work = Path(tempfile.mkdtemp(prefix="gc-driver-"))
    old_client, old_cache = client_before(before, work)
    kinds = {
        "bare aiohttp": lambda url, ms, c: drive_bare(url, ms, c),
        "openai SDK": lambda url, ms, c: drive_sdk(url, ms, c),
        f"EvalClient {before}": lambda url, ms, c: drive_client(old_client, url, ms, c),
        f"+ cache {before}": lambda url, ms, c: drive_client(
            old_client, url, ms, c, old_cache(work / f"old-{time.time_ns()}.sqlite")
        ),
        "EvalClient now": lambda url, ms, c: drive_client(EvalClient, url, ms, c),
        "+ cache now": lambda url, ms, c: drive_client(
            EvalClient, url, ms, c, ResponseCache(work / f"new-{time.time_ns()}.sqlite")
        ),
    }
    table: dict[int, dict[str, tuple[float, float]]] = {}
    rows = []
    for delay in (0.0, 2.0):  # instant; then slow, to hold many requests in flight at once
        port = free_port()
        stub = subprocess.Popen(
            [sys.executable, "-c", STUB, str(port), str(delay)], stdout=subprocess.PIPE, text=True
        )
        assert stub.stdout is not None and stub.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/v1"
        try:
            if delay == 0.0:
                messages = distinct_messages(calls)
                asyncio.run(drive_client(EvalClient, url, messages[:200], 16))  # warm-up
                for concurrency in concurrencies:
                    for name, run in kinds.items():
                        runs = [asyncio.run(run(url, messages, concurrency)) for _ in range(3)]
                        table.setdefault(concurrency, {})[name] = (
                            statistics.median(r[0] for r in runs),
                            statistics.median(r[1] for r in runs),
                        )
                        print(
                            f"   {concurrency} {name}: {table[concurrency][name][0]:,.0f}/s",
                            flush=True,
                        )
            else:
                base = rss_mb()
                for count in in_flight:
                    started = time.perf_counter()
                    _, _, peak = asyncio.run(
                        drive_client(EvalClient, url, distinct_messages(count), count)
                    )
                    rows.append(
                        f"{count:,} requests in flight (a 2 s stub): all answered in "
                        f"{time.perf_counter() - started:.1f} s, +{peak - base:,.0f} MB, "
                        f"{1024 * (peak - base) / count:,.1f} KB each"
                    )
        finally:
            stub.kill()
            stub.wait()
    names = list(kinds)
    lines = [
        "| concurrency | " + " | ".join(names) + " | now / bare | now+cache / bare |",
        "|" + " --- |" * (len(names) + 3),
    ]
    for concurrency, found in table.items():
        cells = [f"{found[n][0]:,.0f} ({found[n][1]:.2f} ms)" for n in names]
        bare = found["bare aiohttp"][0]
        lines.append(
            f"| {concurrency} | " + " | ".join(cells) + f" | "
            f"{found['EvalClient now'][0] / bare:.2f} | {found['+ cache now'][0] / bare:.2f} |"
        )
    print(
        f"1c. driver ceiling: {calls:,} distinct chat calls against an instant stub in its own "
        "process, median of 3: calls/s (driver CPU per call)\n"
        + "\n".join(lines)
        + "\n   "
        + "\n   ".join(rows),
        flush=True,
    )


def seconds(work, *args) -> float:
    started = time.perf_counter()
    work(*args)
    return time.perf_counter() - started


# ---- 2.-4. LLM replicas -------------------------------------------------------------------------


def nli_messages(n: int) -> list[list[dict]]:
    from groundcover.pipelines.comprehensiveness.common import PROMPTS

    return [PROMPTS["nli"].messages(premise=p, hypothesis=h) for p, h in pairs_of(n, seed=1)]


async def ours(url: str, model: str, batch: list[list[dict]], concurrency: int) -> dict:
    from groundcover.serving.client import EvalClient

    params = {"temperature": 0.0, "max_tokens": 24}
    async with EvalClient(url, model, concurrency=concurrency, default_params=params) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client.chat(m, stage="nli") for m in batch))
        elapsed = time.perf_counter() - started
        usage = client.usage["nli"]
    tokens = usage.prompt_tokens + usage.completion_tokens
    return {"calls/s": len(batch) / elapsed, "tokens/s": tokens / elapsed}


async def plain(url: str, model: str, batch: list[list[dict]], concurrency: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(messages):
        nonlocal tokens
        async with gate:
            answer = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=24, temperature=0.0
            )
            tokens += answer.usage.prompt_tokens + answer.usage.completion_tokens

    started = time.perf_counter()
    await asyncio.gather(*(one(m) for m in batch))
    elapsed = time.perf_counter() - started
    await client.close()
    return {"calls/s": len(batch) / elapsed, "tokens/s": tokens / elapsed}


def vllm_bench(
    url: str, model: str, tokenizer: str, batch: list[list[dict]], concurrency: int, tmp: Path
) -> dict:
    """vLLM's own benchmark client (``vllm bench serve``) sending the same prompts to the same
    server. Run as a module: the ``vllm`` command of the CPU wheel cannot find its own version."""
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": m[-1]["content"]}) + "\n" for m in batch))
    code = (
        "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
        "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
        "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
    )
    base = url.removesuffix("/v1")
    args = [
        "--backend",
        "openai-chat",
        "--base-url",
        base,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--skip-chat-template",
        "--custom-output-len",
        "24",
        "--num-prompts",
        str(len(batch)),
        "--max-concurrency",
        str(concurrency),
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp),
        "--result-filename",
        "vllm-bench.json",
    ]
    subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, timeout=1800
    )
    result = json.loads((tmp / "vllm-bench.json").read_text())
    return {"calls/s": result["request_throughput"], "tokens/s": result["total_token_throughput"]}


def items(n: int):
    from groundcover.pipelines.comprehensiveness.common import Item

    rows = [json.loads(line) for line in WC.read_text().splitlines()[:n]] if WC.is_file() else []
    if not rows:
        return [
            Item(**json.loads(line))
            for line in (ROOT / "examples/comprehensiveness.jsonl").read_text().splitlines()
        ]
    return [
        Item(
            id=f"wc{k}",
            query=r["question"],
            response=r["answer3"],
            contexts=[r["context1_self_contained"], r["context2_self_contained"]],
        )
        for k, r in enumerate(rows)
    ]


async def run_items(
    url: str, model: str, todo, options, concurrent: bool, cache=None, judge=None
) -> tuple[float, list]:
    from groundcover.pipelines.comprehensiveness.framework import evaluate_item
    from groundcover.serving.client import EvalClient

    async with EvalClient(
        url, model, concurrency=16, cache=cache, default_params={"temperature": 0.0}
    ) as client:
        started = time.perf_counter()
        if concurrent:
            records = await asyncio.gather(
                *(evaluate_item(client, it, options, nli_judge=judge) for it in todo)
            )
        else:
            records = [await evaluate_item(client, it, options, nli_judge=judge) for it in todo]
        return time.perf_counter() - started, records


def bench_llm(tmp: Path, args) -> None:
    from groundcover.serving.cluster.serve_app import RayReplicas
    from groundcover.serving.launch.registry import model_source, resolve
    from groundcover.serving.launch.server import ServerSpec

    batch = nli_messages(args.llm_pairs)
    rates = {}
    for n in args.replicas:
        with RayReplicas(ServerSpec(model=args.model), replicas=n) as app:
            url, model = app.base_url, app.served_name
            asyncio.run(ours(url, model, batch[:8], 8))  # warm-up
            runs = [
                asyncio.run(ours(url, model, batch, args.concurrency)) for _ in range(args.rounds)
            ]
            rates[n] = statistics.median(r["calls/s"] for r in runs)
            print(
                f"2. LLM pairwise calls ({args.llm_pairs} NLI prompts, {args.model}, "
                f"concurrency {args.concurrency}, median of {args.rounds}): {n} replica(s) "
                f"{rates[n]:.1f} calls/s",
                flush=True,
            )
            if n != 2:
                continue
            if 1 in rates:
                print(f"   2 / 1 replicas: {rates[2] / rates[1]:.2f}x", flush=True)
            tokenizer = model_source(resolve(args.model))
            ceiling = [
                asyncio.run(plain(url, model, batch, args.concurrency)) for _ in range(args.rounds)
            ]
            theirs = [
                vllm_bench(url, model, tokenizer, batch, args.concurrency, tmp)
                for _ in range(args.rounds)
            ]
            mine, top, vllm = (
                statistics.median(r["tokens/s"] for r in x) for x in (runs, ceiling, theirs)
            )
            print(
                f"   2 replicas, prompt+completion tokens/s: ours {mine:,.0f}, plain openai "
                f"client {top:,.0f}, vLLM's benchmark client {vllm:,.0f}: ours = "
                f"{mine / vllm:.2f} of vLLM's ({mine / top:.2f} of plain)"
            )
            if args.items:
                bench_items(url, model, tmp, args)


def bench_items(url: str, model: str, tmp: Path, args) -> None:
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
    from groundcover.pipelines.comprehensiveness.pruning import PrunedJudge, Pruner, edge_recall
    from groundcover.serving.cache import ResponseCache

    todo = items(args.items)
    options = ComprehensivenessOptions(
        method="nli", protocol="spec", t_rel=args.t_rel, export_graphs=False
    )
    together, _ = asyncio.run(run_items(url, model, todo, options, True))
    alone, _ = asyncio.run(run_items(url, model, todo, options, False))
    print(
        f"3. cross-item scheduling ({len(todo)} items, NLI method, spec, 2 replicas): "
        f"{60 * len(todo) / together:.2f} vs {60 * len(todo) / alone:.2f} items/min one at a "
        f"time = {alone / together:.2f}x",
        flush=True,
    )
    cache = ResponseCache(tmp / "prune.sqlite")
    _, full = asyncio.run(run_items(url, model, todo, options, True, cache, LlmNli()))
    for threshold in args.prune:
        judge = PrunedJudge(LlmNli(), Pruner(threshold))
        pruned_options = options.model_copy(update={"prune_below": threshold})
        _, found = asyncio.run(run_items(url, model, todo, pruned_options, True, cache, judge))
        result = edge_recall([r.model_dump() for r in full], [r.model_dump() for r in found])
        saved = result["pairs_skipped"] / max(1, result["pairs_exhaustive"])
        recall = "n/a" if result["recall"] is None else f"{result['recall']:.2f}"
        print(
            f"4. pruning below {threshold}: {result['pairs_judged']} of "
            f"{result['pairs_exhaustive']} pairs judged ({saved:.0%} saved), edge recall "
            f"{recall} ({result['kept']} of {result['edges']} edges)",
            flush=True,
        )
    cache.close()


# ---- 5. many drivers ---------------------------------------------------------------------------


BURNER = """
import itertools, sys
sys.path.insert(0, sys.argv[1])
from groundcover.pipelines.fanoutqa.metrics import normalize
normalize("warm")
print("ready", flush=True)
for n in itertools.count():
    normalize(f"The answer number {n} is here")
"""


@contextlib.contextmanager
def cpu_burner():
    """A process doing a driver's work (the metrics' normalisation, which is most of it) on the
    other core for the block: what a second driver does to the first one's CPU per call on a
    machine with few cores (shared caches and memory bandwidth), without any Ray."""
    burner = subprocess.Popen(
        [sys.executable, "-c", BURNER, str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    assert burner.stdout is not None and burner.stdout.readline().strip() == "ready"
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def bench_drivers(tmp: Path, items: int, rounds: int) -> None:
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study
    from groundcover.pipelines.runtime.execution.execute import execute
    from groundcover.serving.launch.server import free_port
    from tests.support.ray_head import ray_head, ray_worker

    fanoutqa = study("fanoutqa")
    texts = iter(range(1 << 30))

    def inputs() -> tuple[Path, Path]:
        """Questions and answers no earlier run used: the metrics' normalisation caches its
        texts per process, so a repeated text would cost the in-process runs nothing."""
        n = next(texts)
        questions = [
            {"id": f"q{k:05d}", "question": f"Which city is {k}?", "answer": f"City {n}-{k}"}
            for k in range(items)
        ]
        answers = [{"id": q["id"], "answer": f"Town {n}-{k % 7}"} for k, q in enumerate(questions)]
        (tmp / f"dev-{n}.json").write_text(json.dumps(questions))
        (tmp / f"answers-{n}.json").write_text(json.dumps(answers))
        return tmp / f"dev-{n}.json", tmp / f"answers-{n}.json"

    port = free_port()
    stub = subprocess.Popen(
        [sys.executable, "-c", STUB, str(port), "0", "Compared.\nB"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stub.stdout is not None and stub.stdout.readline().strip() == "ready"

    def once(name: str, extra: dict) -> dict[str, float]:
        run_dir = tmp / f"drivers-{name}-{time.time_ns()}"
        dev, answers = inputs()
        overrides = {
            "fanoutqa.input": str(dev),
            "fanoutqa.answers": str(answers),
            "fanoutqa.judge": True,
            "evaluator.endpoint": f"http://127.0.0.1:{port}/v1",
            "evaluator.model": "stub",
            "evaluator.concurrency": 64,
            "run.run_dir": str(run_dir),
        } | extra
        started, cpu = time.perf_counter(), time.process_time()
        (outcome,) = execute(
            fanoutqa, request_from(fanoutqa, None, overrides), no_cache=True, quiet=True
        ).values()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        summary = outcome.summary
        assert summary is not None and summary.recorded == items
        calls = sum(u.get("calls", 0) for u in summary.usage_this_invocation.values())
        rows = summary.drivers_this_invocation
        if rows:  # the drivers' own clocks: from their first item, not their start
            solving = max(r["seconds"] for r in rows)
            cpu = sum(r["cpu_seconds"] for r in rows)
        else:
            solving = json.loads((outcome.dir / "invocations.jsonl").read_text())["seconds"]
        return {
            "calls/s": calls / solving,
            "cpu ms/call": 1000 * cpu / calls,
            "calls per CPU-s": calls / cpu,
            "end to end s": wall,
        }

    results: dict[str, list[dict[str, float]]] = {}
    try:
        with (
            ray_head(num_cpus=2, resources={"head_driver": 1}) as head,
            ray_worker(head, num_cpus=2, resources={"worker": 1}),
        ):
            two = {
                "run.drivers": 2,
                "evaluator.ray_address": f"127.0.0.1:{head.port}",
                "run.driver_resources": '[{"head_driver": 1}, {"worker": 1}]',
            }
            once("warm-up", {})  # this process loads what the drivers load in their setup
            for _ in range(rounds):  # interleaved: the machine's noise falls on all three
                results.setdefault("this process", []).append(once("one", {}))
                with cpu_burner():  # the control: one process while another keeps a core busy
                    busy = once("busy", {})
                results.setdefault("this process, the other core doing the same", []).append(busy)
                results.setdefault("2 drivers", []).append(once("two", two))
    finally:
        stub.kill()
        stub.wait()
    keys = list(next(iter(results.values()))[0])
    lines = ["| run | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 1)]
    for name, runs in results.items():
        medians = [statistics.median(r[k] for r in runs) for k in keys]
        lines.append(f"| {name} | " + " | ".join(f"{m:,.2f}" for m in medians) + " |")
    print(
        f"5. many drivers: {items:,} FanOutQA judge calls against an instant stub, median of "
        f"{rounds} (solving seconds from each driver's first item)\n" + "\n".join(lines),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4096)
    parser.add_argument("--stream-pairs", type=int, default=10_000)
    parser.add_argument("--driver-calls", type=int, default=2000)
    parser.add_argument("--driver-concurrency", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--before", default=BEFORE, help="git revision of the 'before' client")
    parser.add_argument("--llm-pairs", type=int, default=96)
    parser.add_argument("--items", type=int, default=2)
    parser.add_argument("--t-rel", type=float, default=3.5)
    parser.add_argument("--replicas", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prune", type=float, nargs="*", default=[0.2, 0.4])
    parser.add_argument("--driver-items", type=int, default=3000, help="items of section 5")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["nli", "driver", "llm", "drivers"]
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if "nli" not in args.skip:
            bench_nli(Path(tmp), args.pairs, args.stream_pairs)
        if "driver" not in args.skip:
            bench_driver(args.driver_calls, args.driver_concurrency, args.in_flight, args.before)
        if "llm" not in args.skip:
            bench_llm(Path(tmp), args)
        if "drivers" not in args.skip:
            bench_drivers(Path(tmp), args.driver_items, args.rounds)


if __name__ == "__main__":
    main()
