"""Crashes: the server dies mid-batch and comes back; the evaluation process itself is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.serving.client import EvalClient
from tests.conftest import require_engine

pytestmark = pytest.mark.engine


async def test_client_survives_server_killed_and_restarted_mid_batch(killable, tmp_path):
    server = killable.take(tmp_path / "serve.log")  # this test kills and restarts it
    port = server.port
    client = EvalClient(
        server.base_url,
        server.served_name,
        concurrency=4,
        max_retries=30,  # ~3.5 min of backoff: a restart on a busy machine (-n 2) takes ~1 min
        backoff=0.5,
        max_backoff=8.0,
        default_params={"temperature": 0.0, "max_tokens": 48},
    )
    messages = [[{"role": "user", "content": f"item {i}"}] for i in range(300)]
    try:
        batch = asyncio.gather(*(client.chat(m, stage="batch") for m in messages))
        batch = asyncio.ensure_future(batch)
        while client.usage.get("batch") is None or client.usage["batch"].requests < 20:
            await asyncio.sleep(0.05)
        assert not batch.done()
        server.kill()  # SIGKILL the whole process group: requests in flight are lost
        killed_at = client.usage["batch"].requests
        server = await asyncio.to_thread(killable.again, port, tmp_path / "serve2.log")
        results = await asyncio.wait_for(batch, timeout=600)
    finally:
        await client.aclose()
    usage = client.usage["batch"]
    assert len(results) == 300 and all(r.completion_tokens > 0 for r in results)
    assert killed_at < 300
    assert usage.retries > 0  # the outage was seen and ridden out
    assert usage.requests == 300 and usage.failures == 0  # no item lost, none answered twice


def write_questions(path: Path, n: int) -> list[str]:
    ids = [f"q{i:03d}" for i in range(n)]
    with open(path, "w") as handle:
        for i, item_id in enumerate(ids):
            handle.write(json.dumps({"id": item_id, "question": f"What about topic {i}?"}) + "\n")
    return ids


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_sigkilled_run_resumes_with_exactly_one_result_per_item(vllm_server, tmp_path):
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 80)
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--run-dir",
        str(run_dir),
        "--concurrency",
        "2",
        "--max-tokens",
        "96",
        "--no-cache",
        "--quiet",
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = run_dir / "results.jsonl"
    deadline = time.monotonic() + 120
    while count_lines(results) < 10 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done_before = count_lines(results)
    assert 10 <= done_before < len(ids), "the kill must land mid-run"
    partial = report_json(run_dir)
    assert partial["summary"]["recorded"] == done_before and partial["summary"]["partial"]
    assert (
        partial["summary"]["statuses"]["ok"] + partial["summary"]["statuses"]["abstained"]
        == done_before
    )

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids  # exactly one per item, none lost
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recorded"] == len(ids)
    # The rerun asked the model only for what was missing (no cache: every answer is a request).
    assert summary["usage_this_invocation"]["generate"]["requests"] == len(ids) - done_before
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["resumed_at"]) == 1
    finished = report_json(run_dir)["summary"]
    own = {k: v for k, v in summary.items() if not k.endswith("_this_invocation")}
    # report adds what the records cost (in all, by role); the rest equals the run's summary
    recorded = ("usage_recorded", "usage_by_role")
    assert {k: v for k, v in finished.items() if k not in recorded} == own
    # Usage summed over the records: every item was answered by exactly one request.
    assert finished["usage_recorded"]["generate"]["requests"] == len(ids)


def report_json(run_dir: Path) -> dict:
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    result = CliRunner().invoke(app, ["report", str(run_dir), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_serve_command_starts_on_loopback_and_stops_its_process_group(tiny_model, tmp_path):
    require_engine()
    from groundcover.serving.launch.server import free_port, port_in_use

    port = free_port()
    command = [
        # own server: what `groundcover serve` starts and stops is the subject
        sys.executable,
        "-m",
        "groundcover",
        "serve",
        str(tiny_model),
        "--port",
        str(port),
        "--run-dir",
        str(tmp_path),
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [tiny_model.name]
        log = (tmp_path / "serve.log").read_text()
        server_pid = int(re.search(r"Started server process \[(\d+)\]", log).group(1))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0
    assert not port_in_use("127.0.0.1", port)
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)
