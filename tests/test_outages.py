"""Outages, measured with the real parts: a full disk under the run directory (a real tmpfs of a
few hundred KB), the vLLM server killed and restarted mid-run, the server never coming back, and
the evaluation SIGKILLed at ten random points -- each ending with every item recorded exactly
once, the results file valid, and (for the kills) the same results as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from groundcover.pipelines.runtime.store.run_dir import RunStoreError
from groundcover.pipelines.shared.answering import GENERATE, GenerateOptions
from tests.support.scripted import ScriptedClient
from tests.test_runtime import run

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


# ---- a full disk ----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KB filesystem (tmpfs); skipped where this process may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_run_with_one_error_and_a_valid_results_file(tmp_path, small_disk):
    questions = tmp_path / "q.jsonl"
    ids = [f"q{i:02d}" for i in range(40)]
    questions.write_text("".join(json.dumps({"id": i, "question": f"Q {i}?"}) + "\n" for i in ids))
    answer = "An answer that fills the disk. " * 300  # ~9 KB per record: 40 records need ~360 KB
    options = GenerateOptions(input=questions)
    run_dir = small_disk / "run"
    with pytest.raises(RunStoreError) as stopped:
        run(GENERATE, options, ScriptedClient({"generate": answer}), run_dir, concurrency=1)
    message = str(stopped.value)
    assert "No space left on device" in message and "run the same command to resume" in message
    assert "\n" not in message
    lines = (run_dir / "results.jsonl").read_bytes().splitlines(keepends=True)
    assert 5 < len(lines) < len(ids)  # the disk filled mid-run ...
    assert all(line.endswith(b"\n") and json.loads(line)["status"] == "ok" for line in lines)
    # ... and every line is a whole record. Room again (the same filesystem, grown): resume.
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    client = ScriptedClient({"generate": answer})
    outcome = run(GENERATE, options, client, run_dir, concurrency=1)[""]
    assert sorted(r.id for r in outcome.results) == ids  # every item exactly once
    assert len(client.calls) == len(ids) - len(lines)  # only what was missing was asked


# ---- the server killed, restarted, or gone -----------------------------------------------------


def write_questions(path: Path, n: int) -> list[str]:
    ids = [f"q{i:03d}" for i in range(n)]
    path.write_text(
        "".join(
            json.dumps({"id": i, "question": f"What about topic {k}?"}) + "\n"
            for k, i in enumerate(ids)
        )
    )
    return ids


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while count_lines(path) < n and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)


def generate_command(questions: Path, run_dir: Path, base_url: str, served: str, *extra: str):
    return [
        sys.executable,
        "-m",
        "groundcover",
        "generate",
        str(questions),
        "--endpoint",
        base_url,
        "--model",
        served,
        "--run-dir",
        str(run_dir),
        "--max-tokens",
        "24",
        "--quiet",
        *extra,
    ]


def retries_config(path: Path, retries: int) -> Path:
    path.write_text(f"evaluator:\n  max_retries: {retries}\n")
    return path


@pytest.mark.engine
def test_server_killed_and_restarted_mid_run_the_run_completes(killable, tmp_path):
    server = killable.take(tmp_path / "serve.log")
    questions, run_dir = tmp_path / "q.jsonl", tmp_path / "run"
    ids = write_questions(questions, 60)
    config = retries_config(tmp_path / "c.yaml", 12)
    command = generate_command(
        questions,
        run_dir,
        server.base_url,
        server.served_name,
        "--no-cache",
        "--concurrency",
        "2",
        "--config",
        str(config),
    )
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_lines(run_dir / "results.jsonl", 10, proc)
        server.kill()  # SIGKILL its process group: the requests in flight are lost
        killed_at = count_lines(run_dir / "results.jsonl")
        server = killable.again(server.port, tmp_path / "serve2.log")
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output.decode()[-3000:]
    assert 10 <= killed_at < len(ids)
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids  # none lost, none twice
    assert all(r["status"] in ("ok", "abstained") for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["usage_this_invocation"]["generate"]["retries"] > 0  # the outage was seen


@pytest.mark.engine
def test_server_never_back_one_error_and_a_resumable_run(killable, tmp_path):
    server = killable.take(tmp_path / "serve.log")
    questions, run_dir = tmp_path / "q.jsonl", tmp_path / "run"
    ids = write_questions(questions, 60)
    config = retries_config(tmp_path / "c.yaml", 2)
    command = generate_command(
        questions,
        run_dir,
        server.base_url,
        server.served_name,
        "--no-cache",
        "--concurrency",
        "2",
        "--config",
        str(config),
    )
    proc = subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_lines(run_dir / "results.jsonl", 10, proc)
    server.kill()
    _, stderr = proc.communicate(timeout=300)
    recorded = (run_dir / "results.jsonl").read_text().splitlines()
    assert proc.returncode not in (0, None)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and server.base_url in errors[0], stderr[-2000:]
    assert "gave up" in errors[0] and "rerun the same command to resume" in stderr
    assert 10 <= len(recorded) < len(ids)
    records = [json.loads(line) for line in recorded]  # every line a whole record
    assert all(r["status"] in ("ok", "abstained") for r in records)  # no record of the outage
    # The server is back: the same command resumes and asks only for what is missing.
    server = killable.again(server.port, tmp_path / "serve2.log")
    again = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["usage_this_invocation"]["generate"]["requests"] == len(ids) - len(recorded)


# ---- ten kills ---------------------------------------------------------------------------------


def comparable(run_dir: Path) -> dict[str, dict]:
    """Records by id without what legitimately differs between invocations (timings, usage)."""
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        for volatile in ("usage", "seconds", "elapsed", "timings"):
            record.pop(volatile, None)
        out[record["id"]] = record
    return out


def test_ten_kills_at_random_points_end_with_the_uninterrupted_results(vllm_server, tmp_path):
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 48)
    served = (vllm_server.base_url, vllm_server.served_name)
    # The uninterrupted run fills its own cache; the killed run starts from an empty one. One
    # request at a time: vLLM's CPU engine is not batch-invariant, so two in flight could give
    # an answer other tokens from one run to the next (once seen: a record differed).
    reference = generate_command(questions, tmp_path / "reference", *served, "--concurrency", "1")
    env = dict(ENV, GROUNDCOVER_HOME=str(tmp_path / "home-reference"))
    done = subprocess.run(reference, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    run_dir = tmp_path / "killed"
    killed = generate_command(questions, run_dir, *served, "--concurrency", "1")
    env = dict(ENV, GROUNDCOVER_HOME=str(tmp_path / f"home-{uuid.uuid4().hex}"))
    rng = random.Random(15)
    points = sorted(rng.sample(range(1, len(ids) - 2), 10))  # records done when each kill lands
    landed = []
    for point in points:
        proc = subprocess.Popen(
            killed, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_lines(run_dir / "results.jsonl", point, proc)
        time.sleep(rng.random() * 0.2)  # land anywhere: between records, mid-append, mid-request
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        landed.append(count_lines(run_dir / "results.jsonl"))
    last = subprocess.run(killed, env=env, capture_output=True, text=True, timeout=600)
    assert last.returncode == 0, last.stderr[-2000:]
    assert landed[-1] < len(ids), f"the last kill must land before the end: {landed}"
    assert comparable(run_dir) == comparable(tmp_path / "reference")
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(ids)  # one record per item, none twice
    summary = json.loads((run_dir / "summary.json").read_text())
    reference_summary = json.loads((tmp_path / "reference" / "summary.json").read_text())
    assert summary["statuses"] == reference_summary["statuses"]
    assert len(set(landed)) >= 5 and landed == sorted(landed)  # ten kills, spread over the run
