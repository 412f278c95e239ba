"""Ray Serve LLM: two tiny-Llama replicas behind one OpenAI-compatible URL -- both replicas
serve, answers equal a plain single server's (temperature 0, no cache) for the base model and for
a LoRA adapter served through Serve's multiplexing, and a replica SIGKILLed mid-run costs nothing:
the run ends with one record per item. The app binds every interface, so it asks for a key: a
request without it is refused by Serve's proxy, our client and runs send it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.serving.client import EndpointError, EvalClient
from groundcover.serving.launch.registry import LoraAdapter
from groundcover.serving.launch.server import ServerSpec, engine_device
from tests.conftest import ADAPTER, TEST_SERVER_ENV, require_engine
from tests.support.questions import questions_file
from tests.support.ray_head import wait_for_records

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]
KEY = "serve-key-51c2"
KEYED = dict(os.environ, PYTHONPATH=str(ROOT), OPENAI_API_KEY=KEY)  # what runs send as Bearer


@pytest.fixture(scope="module")
def replicas(tiny_model, tiny_lora):
    require_engine()
    pytest.importorskip("ray.serve.llm", reason="needs ray[serve] (the engine extra)")
    from groundcover.serving.cluster.serve_app import RayReplicas

    adapter = LoraAdapter(name=ADAPTER, path=str(tiny_lora), base=tiny_model.name, rank=8)
    spec = ServerSpec(
        model=str(tiny_model), loras=[adapter], env=TEST_SERVER_ENV, host="0.0.0.0", api_key=KEY
    )
    # own server: a two-replica Serve LLM app (one per module, shared by its tests)
    with RayReplicas(spec, replicas=2) as app:
        yield app


async def answers(
    base_url: str,
    model: str,
    prompts: list[str],
    concurrency: int,
    adapter: str | None = None,
    prefix: str = "",
) -> list[str]:
    async with EvalClient(
        base_url,
        model,
        adapter=adapter,
        adapter_prefix=prefix,
        api_key=KEY,  # the plain test server ignores it
        concurrency=concurrency,
        max_retries=4,
        default_params={"temperature": 0.0, "max_tokens": 16},
    ) as client:
        results = await asyncio.gather(
            *(client.chat([{"role": "user", "content": p}], stage="probe") for p in prompts)
        )
    return [r.text for r in results]


def test_two_replicas_both_serve_and_answer_like_one_plain_server(replicas, vllm_server):
    import psutil

    pids = replicas.replica_pids()
    assert len(pids) == 2
    engines: list[psutil.Process] = []  # each replica's engine core, where the passes run
    if engine_device() == "cpu":  # the model in the engine core's process: no worker beside it
        for pid in pids:
            tree = psutil.Process(pid).children(recursive=True)
            named = [c for c in tree if c.name().startswith("VLLM::")]
            assert [c.name() for c in named] == ["VLLM::EngineCore"], [c.name() for c in tree]
            engines += named

    def cpu() -> list[float]:
        """CPU seconds of each replica's engine core, the same processes throughout (one started
        again would bring its load's CPU along). Not the replica's actor: its polls grow with the
        wall time, which a loaded machine stretches (there, its idle came near its busy)."""
        return [sum(engine.cpu_times()[:2]) for engine in engines]

    prompts = [f"Tell me about item number {i}." for i in range(128)]
    counted = {r["pid"]: r["requests"] for r in replicas.served()}
    before, started = cpu(), time.monotonic()
    asyncio.run(answers(replicas.base_url, replicas.served_name, prompts, concurrency=16))
    busy = [b - a for a, b in zip(before, cpu(), strict=True)]
    # each replica counts what it answered: every request once, spread over both
    answered = {r["pid"]: r["requests"] - counted[r["pid"]] for r in replicas.served()}
    assert sorted(answered) == sorted(pids) and sum(answered.values()) == len(prompts)
    assert min(answered.values()) > 0, answered
    before, wall = cpu(), time.monotonic() - started
    time.sleep(wall)  # the same time idle: what a replica spends without requests
    idle = [b - a for a, b in zip(before, cpu(), strict=True)]
    # each replica ran forward passes for a real part of the batch, in the engine it started
    # with (on a GPU they run in Ray's worker actors, not under the replica: not measured there)
    assert all(b > 2 * i + 0.2 for b, i in zip(busy, idle, strict=True)), (busy, idle)
    assert all(engine.is_running() for engine in engines)  # the same processes, not restarted
    # One request at a time: the same greedy answers as the plain server of the same weights.
    some = prompts[:12]
    mine = asyncio.run(answers(replicas.base_url, replicas.served_name, some, concurrency=1))
    plain = asyncio.run(answers(vllm_server.base_url, vllm_server.served_name, some, 1))
    assert mine == plain


def test_the_app_refuses_requests_without_its_key(replicas):
    import httpx

    url = replicas.base_url
    assert url.startswith("http://127.0.0.1:")  # bound to every interface, reached on loopback
    body = {
        "model": replicas.served_name,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    }
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
        assert (
            httpx.post(
                f"{url}/chat/completions", json=body, headers=headers, timeout=60
            ).status_code
            == 401
        )
        assert httpx.get(f"{url}/models", headers=headers, timeout=60).status_code == 401
    keyed = {"Authorization": f"Bearer {KEY}"}
    models = httpx.get(f"{url}/models", headers=keyed, timeout=60).json()
    assert replicas.served_name in [m["id"] for m in models["data"]]

    async def unkeyed() -> None:
        async with EvalClient(url, replicas.served_name, max_retries=0) as client:
            await client.chat(body["messages"], stage="probe", max_tokens=4)

    with pytest.raises(EndpointError, match="401"):
        asyncio.run(unkeyed())


def test_an_adapter_through_serve_answers_like_the_plain_servers_adapter(replicas, vllm_server):
    prompts = [f"Describe thing {i}." for i in range(8)]
    url, name, prefix = replicas.base_url, replicas.served_name, replicas.adapter_prefix
    assert prefix == f"{name}:"  # Serve routes BASE:ADAPTER to a replica that loads it
    tuned = asyncio.run(answers(url, name, prompts, 1, adapter=ADAPTER, prefix=prefix))
    plain = asyncio.run(
        answers(vllm_server.base_url, vllm_server.served_name, prompts, 1, adapter=ADAPTER)
    )
    base = asyncio.run(answers(url, name, prompts, 1))
    assert tuned == plain  # the same adapter weights, greedy
    assert tuned != base  # and really the adapter, not the base model
    with pytest.raises(EndpointError, match="404.*no-such-adapter' does not exist here"):
        asyncio.run(answers(url, name, prompts[:1], 1, adapter="no-such-adapter", prefix=prefix))


def test_a_run_reaches_the_adapter_of_a_serve_app_by_its_prefix(replicas, vllm_server, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions_file(questions, [f"q{i}" for i in range(4)], "Why {}?")

    def generate(url: str, name: str, *extra: str) -> dict[str, str]:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        command = [
            sys.executable,
            "-m",
            "groundcover",
            "generate",
            str(questions),
            "--endpoint",
            url,
            "--model",
            name,
            "--adapter",
            ADAPTER,
            *extra,
            "--run-dir",
            str(run_dir),
            "--max-tokens",
            "16",
            "--concurrency",
            "1",
            "--no-cache",
            "--quiet",
        ]
        done = subprocess.run(command, env=KEYED, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (run_dir / "results.jsonl").read_text().splitlines()
        return {r["id"]: r["details"]["response"] for r in map(json.loads, lines)}

    served = generate(
        replicas.base_url, replicas.served_name, "--adapter-prefix", replicas.adapter_prefix
    )
    assert served == generate(vllm_server.base_url, vllm_server.served_name)


def test_a_replica_killed_mid_run_costs_no_item(replicas, tmp_path):
    questions, run_dir = tmp_path / "q.jsonl", tmp_path / "run"
    ids = [f"q{i:03d}" for i in range(60)]
    questions_file(questions, ids, "What about {}?")
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--endpoint",
        replicas.base_url,
        "--model",
        replicas.served_name,
        "--run-dir",
        str(run_dir),
        "--max-tokens",
        "24",
        "--concurrency",
        "8",
        "--no-cache",
        "--quiet",
    ]
    proc = subprocess.Popen(command, env=KEYED, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = run_dir / "results.jsonl"
    wait_for_records(results, 10, proc, timeout=300)
    victim = replicas.replica_pids()[0]
    os.kill(victim, signal.SIGKILL)  # Serve notices and starts a new replica
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output.decode()[-3000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids  # every item, none twice
    assert all(r["status"] in ("ok", "abstained") for r in records)
    deadline = time.monotonic() + 300  # and Serve brings the replica count back to two
    while time.monotonic() < deadline and (
        len(pids := replicas.replica_pids()) < 2 or victim in pids
    ):
        time.sleep(2)
    assert len(replicas.replica_pids()) == 2 and victim not in replicas.replica_pids()
