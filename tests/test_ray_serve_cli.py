"""`--replicas 2` on an evaluation that starts its own server: the run deploys a Ray Serve LLM app
with two replicas (and its LoRA adapter), sends every request through it, and stops it (and its
Ray) at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADAPTER, require_engine
from tests.support.questions import questions_file

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]


def test_generate_with_two_replicas_started_by_the_run(
    tiny_model, tiny_lora, vllm_server, tmp_path
):
    require_engine()
    pytest.importorskip("ray.serve.llm", reason="needs ray[serve] (the engine extra)")
    questions, run_dir = tmp_path / "q.jsonl", tmp_path / "run"
    ids = [f"q{i}" for i in range(12)]
    questions_file(questions, ids)
    # own server: the app a run starts with --replicas, and its teardown, is the subject
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--model",
        str(tiny_model),
        "--replicas",
        "2",
        "--run-dir",
        str(run_dir),
        "--lora",
        f"{ADAPTER}={tiny_lora}",
        "--adapter",
        ADAPTER,
        "--concurrency",
        "1",
        "--max-tokens",
        "16",
        "--no-cache",
        "--quiet",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(ids)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["usage_this_invocation"]["generate"]["requests"] == len(ids)
    spread = summary["replicas_this_invocation"]  # per replica of the app the run started
    (counts,) = spread.values()
    assert len(counts) == 2 and sum(r["requests"] for r in counts) == len(ids), spread
    assert not ray_workers_after(30), "the run left Ray processes behind"
    # every answer is the adapter's: the same run against the plain server's adapter agrees
    plain_dir = tmp_path / "plain"
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
        "--adapter",
        ADAPTER,
        "--run-dir",
        str(plain_dir),
        "--max-tokens",
        "16",
        "--concurrency",
        "1",
        "--no-cache",
        "--quiet",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    plain = {
        json.loads(line)["id"]: json.loads(line)
        for line in (plain_dir / "results.jsonl").read_text().splitlines()
    }
    assert {r["id"]: r["details"]["response"] for r in records} == {
        i: r["details"]["response"] for i, r in plain.items()
    }


def ray_workers_after(seconds: float) -> list[int]:
    """Ray worker processes still alive after ``seconds`` (shutdown is asynchronous), leaving
    out a Slurm job's Ray that tests/test_slurm.py may run meanwhile (its own ports, and its
    workers' files in /tmp/gc-ray-JOB)."""
    import psutil

    def elsewhere(process) -> bool:
        try:
            return any(f.path.startswith("/tmp/gc-ray-") for f in process.open_files())
        except psutil.Error:
            return False

    deadline = time.monotonic() + seconds
    while True:
        alive = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith("ray::") and not elsewhere(p)
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(1)


def test_the_cluster_gone_under_a_run_with_replicas(tiny_model, tmp_path):
    """Replicas on a cluster whose head is killed mid-run: one `error:` line, exit 1, whole
    records; the same command without Ray (a plain server) resumes to every item once."""
    require_engine()
    pytest.importorskip("ray.serve.llm", reason="needs ray[serve] (the engine extra)")
    import signal

    from tests.support.ray_head import ray_head, wait_for_records

    questions, run_dir = tmp_path / "q.jsonl", tmp_path / "run"
    ids = [f"q{i:03d}" for i in range(60)]  # killed after 5: the rest is the resume's
    questions_file(questions, ids)
    # own server: replicas on a cluster this test kills; the resume starts a plain server
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--model",
        str(tiny_model),
        "--run-dir",
        str(run_dir),
        "--max-tokens",
        "24",
        "--concurrency",
        "2",
        "--no-cache",
        "--quiet",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    results = run_dir / "results.jsonl"
    with ray_head(num_cpus=8) as head:
        on_ray = [*command, "--ray-address", f"127.0.0.1:{head.port}"]
        run = subprocess.Popen(
            on_ray, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        wait_for_records(results, 5, run, timeout=600)
        os.killpg(head.pid, signal.SIGKILL)  # GCS, raylet, proxy and replicas with it
        killed = time.monotonic()
        _, err = run.communicate(timeout=300)
        assert run.returncode == 1, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Ray" in errors[0] and "gone" in errors[0], err[-3000:]
        assert time.monotonic() - killed < 55, "ours, not Ray's exit after 60 s"
        done = [json.loads(line) for line in results.read_text().splitlines()]
        assert 0 < len(done) < len(ids)
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids  # every item, none twice


def test_a_cluster_whose_proxy_does_not_ask_for_the_key_is_not_served(tiny_model, tmp_path):
    """`serve --host 0.0.0.0 --api-key-env` on a cluster started without our proxy callback:
    its proxy answers without the key, so the model is never deployed and `serve` ends with one
    `error:` line naming what the nodes need -- nothing is served without a key, not even
    for a moment."""
    require_engine()
    pytest.importorskip("ray.serve.llm", reason="needs ray[serve] (the engine extra)")
    import httpx

    from groundcover.serving.cluster.serve_app import CALLBACK_ENV, KEY_ENV
    from groundcover.serving.launch.server import free_port
    from tests.support.ray_head import ray_head

    port = free_port()
    starts = tmp_path / "starts.jsonl"  # every part the command starts: no Serve LLM app
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC_SERVE_KEY="k-2b7e")
    env["GROUNDCOVER_START_LOG"] = str(starts)
    with ray_head(num_cpus=8) as head:  # started without the two variables
        # own server: an app on a cluster without our proxy callback, which must be refused
        command = [
            sys.executable,
            "-m",
            "groundcover",
            "serve",
            str(tiny_model),
            "--replicas",
            "1",
            "--ray-address",
            f"127.0.0.1:{head.port}",
            "--host",
            "0.0.0.0",
            "--api-key-env",
            "GC_SERVE_KEY",
            "--port",
            str(port),
            "--run-dir",
            str(tmp_path),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode != 0 and len(errors) == 1, done.stderr[-3000:]
        assert "without the API key" in errors[0] and CALLBACK_ENV in errors[0]
        assert KEY_ENV in errors[0]
        kinds = [json.loads(line)["kind"] for line in starts.read_text().splitlines()]
        assert "ray-join" in kinds and "serve-llm" not in kinds, kinds
        with pytest.raises(httpx.HTTPError):  # the app is gone (Serve stays for others' apps)
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).raise_for_status()


def test_a_judge_after_a_serve_started_without_a_proxy_stops_at_once(tiny_model, tmp_path):
    """Serve's proxy is set by whoever starts Serve: after an NLI app's start (no proxy), a
    judge's ``serve.start(http_options=...)`` joins Serve as it is and its proxy never comes.
    `serve MODEL --replicas` says so at once, with the fix (the order the Slurm and KubeRay
    recipes use: tests/test_cluster_recipes.py), instead of waiting out its start."""
    require_engine()
    pytest.importorskip("ray.serve.llm", reason="needs ray[serve] (the engine extra)")
    from groundcover.serving.launch.server import free_port
    from tests.support.ray_head import ray_head
    from tests.support.tiny import build_tiny_classifier

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    nli = build_tiny_classifier(tmp_path / "nli")
    with ray_head(num_cpus=8) as head:
        address = f"127.0.0.1:{head.port}"
        groundcover = [sys.executable, "-m", "groundcover", "serve"]
        deployed = subprocess.run(  # an NLI app first: Serve starts without an HTTP proxy
            [*groundcover, "--nli", str(nli), "--nli-app", "n", "--ray-address", address],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        command = [
            *[sys.executable, "-m", "groundcover", "serve", str(tiny_model), "--replicas", "1"],
            *["--ray-address", address, "--port", str(port), "--run-dir", str(tmp_path)],
            *["--timeout", "600"],
        ]
        began = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode != 0 and len(errors) == 1, done.stderr[-3000:]
        assert "HTTP proxy" in errors[0] and "Disabled" in errors[0], errors
        assert f"--http-port {port} --proxy-location EveryNode" in errors[0], errors
        assert time.monotonic() - began < 300  # not the start's timeout
