"""The replay ceiling: a real multi-stage run against vLLM, then the same requests replayed by a
bare client at the same concurrency, and through ``vllm run-batch``.

The run goes through a recording proxy on loopback (each chat request's body kept, in order);
the replay sends those exact bodies straight to the server with a bare aiohttp loop, and the
batch phase writes them as one Batch API file for ``vllm run-batch`` (the model loaded by that
process: its wall time is reported with and without the load). For each phase: calls/s,
completion tokens/s and the prefix cache's hit rate (vLLM's ``/metrics`` counters, read before
and after). The prefix cache is emptied before the run and before the replay (vLLM's
``/reset_prefix_cache``, served in its dev mode), so both start cold and their hit rates compare:
what the run's order of requests lets the cache reuse against what the replay's does. The run's
ratio to the bare replay is what the runtime costs a multi-stage framework whose stages wait on
each other; the replay keeps no such order.

    python scripts/benchmarks/bench_replay.py --model embedded --concurrency 16 \
        --run "eval comprehensiveness examples/comprehensiveness.jsonl" \
        --run "generate examples/questions.jsonl --max-tokens 64"

``{work}`` in a command is the benchmark's scratch folder and ``{tiny_nli}`` a tiny
DeBERTa-v2 NLI checkpoint built there that entails every pair (ICAT's grounding runs on it: so
every claim is grounded and aligned; NLI calls are not the judge's, and only the judge's are
replayed); ``--prepare`` runs a groundcover command once
before any run, unmeasured (an index for ICAT)::

    --prepare "index build scripts/benchmarks/replay-icat/corpus.jsonl {work}/icat-index
               --dense-model none"
    --run "eval icat scripts/benchmarks/replay-icat/responses.jsonl --queries
           scripts/benchmarks/replay-icat/queries.jsonl --index {work}/icat-index
           --retrieval bm25 --nli-model {tiny_nli}"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from groundcover.serving.launch.registry import model_source, resolve
from groundcover.serving.launch.server import (
    ServerSpec,
    VLLMServer,
    engine_environment,
    run_batch_command,
)

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A proxy in front of the server: forwards every request, keeps each chat body."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.bodies: list[dict[str, Any]] = []
        self.url = ""

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_route("*", "/{tail:.*}", self.forward)
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}/v1"
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(30)

    async def forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(body))
        path = request.path.removeprefix("/v1")
        async with aiohttp.ClientSession() as session, session.request(
            request.method, f"{self.upstream}{path}", data=body or None,
            headers={"Content-Type": "application/json"},
        ) as response:  # fmt: skip
            payload = await response.read()
            return web.Response(
                body=payload, status=response.status, content_type=response.content_type
            )


def prefix_counters(base_url: str) -> tuple[float, float]:
    """vLLM's prefix cache counters (queries, hits), in tokens, from ``/metrics``."""
    import urllib.request

    text = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=30).read()
    found = {"queries": 0.0, "hits": 0.0}
    for line in text.decode().splitlines():
        match = re.match(r"vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})? ([0-9.e+]+)", line)
        if match:
            found[match.group(1)] += float(match.group(2))
    return found["queries"], found["hits"]


def empty_prefix_cache(base_url: str) -> None:
    """A cold prefix cache for the next phase (the server runs with VLLM_SERVER_DEV_MODE=1)."""
    import urllib.request

    root = base_url.removesuffix("/v1")
    urllib.request.urlopen(urllib.request.Request(f"{root}/reset_prefix_cache", method="POST"))


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    queries, hits = after[0] - before[0], after[1] - before[1]
    return hits / queries if queries else None


async def replay(base_url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """The captured bodies sent as they are, ``concurrency`` at a time: the bare ceiling."""
    gate = asyncio.Semaphore(concurrency)
    tokens = 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(body: dict[str, Any]) -> None:
            nonlocal tokens
            async with gate, session.post(f"{base_url}/chat/completions", json=body) as r:
                answer = await r.json()
                tokens += (answer.get("usage") or {}).get("completion_tokens", 0)

        started = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "completion_tokens": tokens}


def run_batch(spec: ServerSpec, device: str, bodies: list[dict[str, Any]], work: Path) -> dict:
    source, output = work / "replay.jsonl", work / "replay.out.jsonl"
    lines = [
        {"custom_id": f"r{k}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for k, body in enumerate(bodies)
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = engine_environment(spec, device)
    log = (work / "run-batch.log").open("w")
    started = time.perf_counter()
    done = subprocess.run(
        run_batch_command(spec, device, source, output), env=env, stdout=log, stderr=log
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"vllm run-batch failed: see {work / 'run-batch.log'}")
    rows = [json.loads(x) for x in output.read_text().splitlines()]
    tokens = sum(
        (r["response"]["body"].get("usage") or {}).get("completion_tokens", 0) for r in rows
    )
    text = (work / "run-batch.log").read_text(errors="replace")
    # the model's load, from vLLM's own log: what a long batch pays once
    loaded = re.search(r"init engine .* took ([0-9.]+) s", text)
    return {
        "seconds": seconds,
        "completion_tokens": tokens,
        "engine_init_s": loaded and float(loaded.group(1)),
    }


def placeholders(work: Path, commands: list[str]) -> dict[str, str]:
    """What ``{work}`` and ``{tiny_nli}`` stand for; the NLI checkpoint is built only when a
    command names it."""
    places = {"{work}": str(work)}
    if any("{tiny_nli}" in command for command in commands):
        places["{tiny_nli}"] = str(entailing_nli(work / "tiny-nli"))
    return places


def filled(command: str, places: dict[str, str]) -> list[str]:
    """``groundcover COMMAND`` as argv, its placeholders replaced (other braces, e.g. JSON in
    an option, stay as they are)."""
    for name, value in places.items():
        command = command.replace(name, value)
    return [sys.executable, "-m", "groundcover", *shlex.split(command)]


def entailing_nli(target: Path) -> Path:
    """A tiny random DeBERTa-v2 NLI checkpoint whose output bias puts every pair at
    ENTAILMENT: every claim is grounded, so ICAT's later stages (the alignment of grounded
    claims with aspects) are asked as they are with a real NLI model that grounds them."""
    import torch
    from transformers import AutoModelForSequenceClassification

    sys.path.insert(0, str(ROOT))
    from tests.support.tiny import build_tiny_classifier

    build_tiny_classifier(target)
    model = AutoModelForSequenceClassification.from_pretrained(target)
    entailment = model.config.label2id["ENTAILMENT"]
    with torch.no_grad():
        model.classifier.bias.zero_()
        model.classifier.bias[entailment] = 50.0
    model.save_pretrained(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--run", action="append", required=True,
        help="a groundcover command (after `groundcover`), repeat: each run is measured",
    )  # fmt: skip
    parser.add_argument(
        "--prepare", action="append", default=[],
        help="a groundcover command run once before the runs, unmeasured (repeat)",
    )  # fmt: skip
    args = parser.parse_args()
    spec = ServerSpec(model=args.model, env={"VLLM_SERVER_DEV_MODE": "1"})
    model_source(resolve(args.model))  # converted once, outside every timing
    with tempfile.TemporaryDirectory() as tmp, VLLMServer(spec, Path(tmp) / "serve.log") as server:
        work = Path(tmp)
        places = placeholders(work, [*args.prepare, *args.run])
        for command in args.prepare:
            done = subprocess.run(filled(command, places), cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}")
        recorder = Recorder(server.base_url)
        recorder.start()
        rows = []
        for number, command in enumerate(args.run):
            recorder.bodies.clear()
            empty_prefix_cache(server.base_url)
            before = prefix_counters(server.base_url)
            argv = filled(command, places)
            argv += ["--endpoint", recorder.url, "--model", server.served_name]
            argv += ["--concurrency", str(args.concurrency), "--no-cache", "--quiet"]
            argv += ["--run-dir", str(work / f"run-{number}")]
            env = os.environ | {"GROUNDCOVER_HOME": str(work / "home")}
            started = time.perf_counter()
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
            run_s = time.perf_counter() - started
            if done.returncode not in (0, 4):  # 4: items failed (a weak model), still measured
                raise SystemExit(f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}")
            # the run's own clock (items solving, servers probed), not the process start
            clocks = [
                json.loads(f.read_text()).get("seconds_this_invocation") or 0.0
                for f in (work / f"run-{number}").rglob("summary.json")
            ]
            run_s = sum(clocks) or run_s
            bodies = list(recorder.bodies)
            empty_prefix_cache(server.base_url)
            after_run = prefix_counters(server.base_url)
            replayed = asyncio.run(replay(server.base_url, bodies, args.concurrency))
            after_replay = prefix_counters(server.base_url)
            batch = run_batch(spec, server.device, bodies, work)
            rows.append(
                {
                    "run": command,
                    "calls": len(bodies),
                    "run_s": round(run_s, 2),
                    "replay_s": round(replayed["seconds"], 2),
                    "run_batch_s": round(batch["seconds"], 2),
                    "run_batch_engine_init_s": batch["engine_init_s"],
                    "ratio_run_to_replay": round(replayed["seconds"] / run_s, 3),
                    "replay_tokens_per_s": round(
                        replayed["completion_tokens"] / replayed["seconds"], 1
                    ),
                    "run_batch_tokens_per_s": round(
                        batch["completion_tokens"] / batch["seconds"], 1
                    ),
                    "prefix_hit_run": hit_rate(before, after_run),
                    "prefix_hit_replay": hit_rate(after_run, after_replay),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(
        "\n| run | calls | run s | bare replay s | run / replay (calls/s) "
        "| run-batch s (incl. load) | prefix hits: run | prefix hits: replay |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        hit = [
            f"{h:.2f}" if h is not None else "-"
            for h in (r["prefix_hit_run"], r["prefix_hit_replay"])
        ]
        print(
            f"| `{r['run']}` | {r['calls']} | {r['run_s']} | {r['replay_s']} | "
            f"{r['ratio_run_to_replay']} | {r['run_batch_s']} | {hit[0]} | {hit[1]} |"
        )


if __name__ == "__main__":
    main()
