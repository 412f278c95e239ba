"""Bought once, whatever happens: the batch transport against a Batch API that misbehaves as
hosted ones do -- a share of every call answered 503 or 429, create answers lost after the
batch was made, output lines in another order, batches that expire, lines that fail -- and a
run killed at every step (after the upload, after the create before its record, during a
poll, during a download), then resumed with other drivers. Each seeded schedule ends with
every request's answer right and every custom id paid for exactly once, by the stub's own
count. Then the failures by cause, the folder key, the provider's other shapes and the local
engine's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from groundcover.pipelines.runtime.execution.models import batch_folder_key, batch_folders
from groundcover.serving.batch import (
    Batcher,
    BatchError,
    LineFailed,
    LocalRunBatch,
    OpenAIBatches,
    process_start,
    read_ledgers,
    split_by_size,
)
from tests.support.batch_chaos import (
    KILLED,
    WORDS,
    ChaosBatches,
    batcher_for,
    completion,
    expected,
    invocation,
    request,
    seeded_schedule,
)
from tests.support.loopback import serve_app


@pytest.fixture(autouse=True, scope="module")
def _bury_the_killed() -> Any:
    """The killed runs' loops, kept as the kill left them while the tests ran, are ended
    quietly at the end (their servers are gone: what they still try fails at once)."""
    yield
    while KILLED:
        loop = KILLED.pop()
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(
                asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            )
        loop.close()


@pytest.mark.parametrize("seed", range(20))
def test_a_seeded_schedule_of_faults_and_a_kill_pays_every_request_once(tmp_path, seed):
    """20 schedules: 20% of calls 503 / 429, 30% of creates lost after the batch was made,
    10% of batches expired, a failing line, shuffled output; a kill at one step chosen by the
    seed, then a resume (the same folder) that finishes. Every answer right, every custom id
    paid once."""
    folder = tmp_path / "batches" / "judge-x"
    done = seeded_schedule(folder, seed)
    assert done["killed"], "the kill did not come"
    assert done["right"] and done["paid_once"], done
    bought = read_ledgers(tmp_path)
    assert bought is not None and bought["pending"] == 0


def drivers_resume(root: Path, before: int, after: int) -> None:
    """``before`` drivers killed while their batches are pending, resumed with ``after``."""
    server = ChaosBatches(seed=before, blip=0.1, lost=0.2, expire=0.0)
    base = root / f"{before}to{after}" / "batches" / "judge-x"
    base.parent.mkdir(parents=True)

    def shards(n: int) -> list[tuple[Path, list[str], dict[str, Any]]]:
        out = []
        for k in range(n):
            own, adopt, siblings = batch_folders(base, k, n)
            words = [w for i, w in enumerate(WORDS) if i % n == k]
            out.append((own, words, {"adopt": adopt, "siblings": siblings}))
        return out

    def kill() -> None:
        if server.kill is not None:
            server.kill()

    with serve_app(server.app()) as url:
        server.hold = True
        killer = threading.Timer(3.0, kill)
        killer.start()
        assert invocation(server, url, shards(before)) is None
        killer.cancel()
        pending = sum(len(b["lines"]) for b in server.batches.values())
        assert pending >= len(WORDS)  # every first stage was bought, none answered
        server.hold = False
        resumed = invocation(server, url, shards(after))
    assert resumed == {w: expected(w) for w in WORDS}
    made = {
        b: (v["status"], [x["custom_id"] for x in v["lines"]]) for b, v in server.batches.items()
    }
    assert set(server.paid.values()) == {1} and len(server.paid) == 2 * len(WORDS), made
    submitted = Counter(
        cid for b in server.batches.values() for cid in (x["custom_id"] for x in b["lines"])
    )
    assert set(submitted.values()) == {1}, submitted  # no line sent twice


def test_drivers_three_to_two_and_one_to_two_each_line_waited_for_once(tmp_path):
    """Each pending line answered by the driver whose shard now holds it, none bought again."""
    drivers_resume(tmp_path, 3, 2)
    drivers_resume(tmp_path, 1, 2)


def run_async(coroutine: Any) -> Any:
    return asyncio.new_event_loop().run_until_complete(coroutine)


class Scripted:
    """A Batch API whose every batch ends as ``finish`` says (a function of its lines)."""

    def __init__(self, finish: Callable[[list[dict[str, Any]]], dict[str, Any]]):
        self.finish = finish
        self.server = ChaosBatches(0, blip=0, lost=0, expire=0)
        self.server._finish = self._finish  # type: ignore[method-assign]
        self.created: list[list[str]] = []

    def _finish(self, batch_id: str, batch: dict[str, Any]) -> None:
        self.created.append([x["custom_id"] for x in batch["lines"]])
        batch |= self.finish(batch["lines"])
        for kind in ("output", "error"):
            rows = batch.pop(f"{kind}_rows", None)
            if rows is not None:
                file_id = f"file-{kind}-{batch_id}"
                self.server.files[file_id] = "".join(json.dumps(r) + "\n" for r in rows).encode()
                batch[f"{kind}_file_id"] = file_id


def answered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": x["custom_id"],
            "response": {"status_code": 200, "body": completion(x["body"])},
        }
        for x in lines
    ]


def test_failures_by_cause(tmp_path):
    """By hand: a line answered 422 fails its item at once (never sent again); a batch failed
    for its own tokens is split in two and both halves answered (an account's enqueued limit
    waits instead: tests/test_batch_provider.py); a batch failed for another
    reason stops the run with the provider's words; a line answered 401 stops the run."""

    def rejecting(lines: list[dict[str, Any]]) -> dict[str, Any]:
        bad = [x for x in lines if "bad" in x["custom_id"]]
        good = [x for x in lines if x not in bad]
        errors = [
            {
                "custom_id": x["custom_id"],
                "response": {"status_code": 422},
                "error": {"message": "no"},
            }
            for x in bad
        ]
        return {"status": "completed", "output_rows": answered(good), "error_rows": errors}

    stub = Scripted(rejecting)
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "a")

        async def two() -> list[Any]:
            return await asyncio.gather(
                batcher.ask("ok", request("first ok")),
                batcher.ask("bad", request("first bad")),
                return_exceptions=True,
            )

        ok, bad = run_async(two())
    assert ok["choices"][0]["message"]["content"] == "OK"
    assert isinstance(bad, LineFailed) and "422" in str(bad)
    assert stub.created == [["ok", "bad"]]  # the rejected line was never sent again
    assert batcher.stats.causes == {"rejected": 1}

    def token_limit(lines: list[dict[str, Any]]) -> dict[str, Any]:
        if len(lines) > 2:
            return {
                "status": "failed",
                "errors": {  # Voyage's words for a batch's own tokens (PROVIDER_MESSAGES)
                    "data": [
                        {
                            "message": "The max allowed tokens per submitted batch is 120000. "
                            "Your batch has 147910 tokens after truncation."
                        }
                    ]
                },
            }
        return {"status": "completed", "output_rows": answered(lines)}

    stub = Scripted(token_limit)
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "b")

        async def four() -> list[Any]:
            return await asyncio.gather(
                *(batcher.ask(f"c{k}", request(f"first c{k}")) for k in range(4))
            )

        found = run_async(four())
    assert [f["choices"][0]["message"]["content"] for f in found] == ["C0", "C1", "C2", "C3"]
    assert sorted(map(len, stub.created)) == [2, 2, 4]  # the four, then two halves
    assert batcher.stats.causes["split"] == 4

    def refused(lines: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "status": "failed",
            "errors": {"data": [{"code": "invalid_json", "message": "line 1 is not JSON"}]},
        }

    stub = Scripted(refused)
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "c")
        with pytest.raises(BatchError, match="line 1 is not JSON"):
            run_async(batcher.ask("d", request("first d")))

    def unauthorised(lines: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [
            {
                "custom_id": x["custom_id"],
                "response": {"status_code": 401},
                "error": {"message": "bad key"},
            }
            for x in lines
        ]
        return {"status": "completed", "error_rows": rows}

    stub = Scripted(unauthorised)
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "d")
        with pytest.raises(BatchError, match="bad key"):
            run_async(batcher.ask("e", request("first e")))


def test_a_line_that_cannot_be_a_batch_line_fails_alone(tmp_path):
    stub = Scripted(lambda lines: {"status": "completed", "output_rows": answered(lines)})
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "a")

        async def two() -> list[Any]:
            return await asyncio.gather(
                batcher.ask("fine", request("first fine")),
                batcher.ask("broken", {"model": "judge", "messages": "not a list"}),
                return_exceptions=True,
            )

        fine, broken = run_async(two())
    assert fine["choices"][0]["message"]["content"] == "FINE"
    assert isinstance(broken, LineFailed) and "no messages" in str(broken)
    assert stub.created == [["fine"]]


def test_a_request_asked_twice_while_its_round_uploads_is_bought_once(tmp_path):
    stub = Scripted(lambda lines: {"status": "completed", "output_rows": answered(lines)})
    stub.server.upload_delay = 0.3  # a large file: the second ask comes while it uploads
    with serve_app(stub.server.app()) as url:
        batcher = batcher_for(url, tmp_path / "a", settle=0.01)

        async def twice() -> list[Any]:
            first = asyncio.ensure_future(batcher.ask("same", request("first same")))
            await asyncio.sleep(0.05)  # its round is being uploaded now
            second = await batcher.ask("same", request("first same"))
            await asyncio.sleep(0.3)  # a second round, if there were one, is created by now
            return [await first, second]

        one, two = run_async(twice())
    assert one == two and len(stub.server.batches) == 1


def test_files_split_by_bytes_as_well_as_lines():
    lines = {f"id{k}": request("x" * 100) for k in range(10)}
    one = (
        len(
            json.dumps(
                {
                    "custom_id": "id0",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": lines["id0"],
                }
            ).encode()
        )
        + 1
    )
    assert [len(p) for p in split_by_size(lines, 4, 10**9)] == [4, 4, 2]
    assert [len(p) for p in split_by_size(lines, 100, 3 * one)] == [3, 3, 3, 1]


def test_another_shape_is_read_where_unambiguous_and_refused_in_one_line_where_not(tmp_path):
    stub = Scripted(lambda lines: {"status": "completed", "output_rows": answered(lines)})
    stub.server.shape = "wrapped"  # {"job": {...}}, statuses in capitals
    with serve_app(stub.server.app()) as url:
        found = run_async(batcher_for(url, tmp_path / "a").ask("w", request("first w")))
    assert found["choices"][0]["message"]["content"] == "W"

    async def uploaded(request: web.Request) -> web.Response:
        return web.json_response({"id": "file-1"})

    async def nonsense(request: web.Request) -> web.Response:
        return web.json_response({"batch_ref": 7, "state": "ok"})

    odd = web.Application()
    odd.router.add_post("/v1/files", uploaded)
    odd.router.add_post("/v1/batches", nonsense)
    with serve_app(odd) as url, pytest.raises(BatchError, match="no field id"):
        run_async(batcher_for(url, tmp_path / "b").ask("x", request("first x")))


def test_the_folder_is_known_by_what_decides_its_answers():
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig

    base = EvaluatorConfig(
        model="judge", endpoint="http://judge.example:8000/v1", transport="batch"
    )
    same = [
        base.model_copy(update={"concurrency": 3, "timeout": 10.0, "max_retries": 1}),
        base.model_copy(update={"api_key_env": "OTHER_KEY", "batch_size": 7, "batch_poll": 1.0}),
        base.model_copy(update={"endpoint": "HTTP://Judge.Example:8000/v1/"}),
    ]
    other = [
        base.model_copy(update={"temperature": 0.7}),
        base.model_copy(update={"model": "another"}),
        base.model_copy(update={"max_tokens": 9}),
        base.model_copy(update={"endpoint": "http://elsewhere:8000/v1"}),
    ]
    key = batch_folder_key(base)
    assert all(batch_folder_key(c) == key for c in same)
    assert all(batch_folder_key(c) != key for c in other)
    # an endpoint whose model is known by its revision: the URL's host no longer matters
    known = {"base": {"revision": "sha256:abc"}}
    a = base.model_copy(update={"content": known})
    b = a.model_copy(update={"endpoint": "http://other-host:9000/v1"})
    assert batch_folder_key(a) == batch_folder_key(b)


def test_a_folder_written_under_the_earlier_key_is_read(tmp_path):
    from groundcover.pipelines.runtime.execution.models import earlier_folders

    batches = tmp_path / "batches"
    old = batches / "judge-0123456789"
    old.mkdir(parents=True)
    (old / "ledger.jsonl").write_text("")
    new = batches / "judge-abcdefabcd"
    new.mkdir()
    (new / "folder.json").write_text('{"nonce": "x"}')
    (new / "ledger.jsonl").write_text("")
    assert earlier_folders(new) == [old]


# ---- the local engine -----------------------------------------------------------------------

SLEEPER = "import sys, time; time.sleep(float(sys.argv[1]))"


def test_a_local_engine_dies_with_the_run_that_started_it(tmp_path):
    """The run killed -9 while ``vllm run-batch`` (here a process standing in for it) runs:
    the engine goes with it (a parent-death signal), no process left under PID 1."""
    marker = tmp_path / "engine.pid"
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from pathlib import Path
        from groundcover.serving.batch import LocalRunBatch

        async def main():
            command = [sys.executable, "-c", {SLEEPER!r}, "120"]
            engine = LocalRunBatch(lambda i, o: command, dict(os.environ))
            path = Path({str(tmp_path)!r}) / "00001.jsonl"
            path.write_text("")
            batch = await engine.create("f", path, "t")
            Path({str(marker)!r}).write_text(str(engine.running[batch].pid))
            await asyncio.sleep(120)

        asyncio.run(main())
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script],
        env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])},
    )
    deadline = time.monotonic() + 60
    while not marker.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine = int(marker.read_text())
    assert process_start(engine) is not None
    os.kill(run.pid, signal.SIGKILL)
    run.wait(30)
    deadline = time.monotonic() + 10
    while process_start(engine) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_start(engine) is None, "the engine outlived its run"


def test_a_surviving_engine_is_ended_by_the_resume_and_engines_run_one_at_a_time(tmp_path):
    survivor = subprocess.Popen([sys.executable, "-c", SLEEPER, "120"], start_new_session=True)
    folder = tmp_path / "batches" / "judge-x"
    folder.mkdir(parents=True)
    (folder / "00001.jsonl").write_text("")
    event = {
        "event": "submitted", "batch": "local-judge-x-00001", "round": 1, "file": "00001.jsonl",
        "custom_ids": ["q"], "pid": survivor.pid, "pid_start": process_start(survivor.pid),
    }  # fmt: skip
    (folder / "ledger.jsonl").write_text(json.dumps(event) + "\n")
    log = tmp_path / "spans.txt"
    writer = (
        "import sys, time, json; open(sys.argv[3], 'a').write(f'{time.time()} start\\n'); "
        "time.sleep(0.3); rows = [json.loads(x) for x in open(sys.argv[1])]; "
        "out = open(sys.argv[2], 'w'); "
        "[out.write(json.dumps({'custom_id': r['custom_id'], 'response': {'status_code': 200, "
        "'body': {'choices': [{'message': {'content': 'ok'}}]}}}) + '\\n') for r in rows]; "
        "out.close(); open(sys.argv[3], 'a').write(f'{time.time()} end\\n')"
    )
    engine = LocalRunBatch(
        lambda i, o: [sys.executable, "-c", writer, str(i), str(o), str(log)], dict(os.environ)
    )
    batcher = Batcher(engine, folder, settle=0.01, poll=0.02, max_lines=2)
    survivor.wait(10)  # ended by reading the ledger
    assert survivor.returncode == -signal.SIGKILL

    async def four() -> list[Any]:
        return await asyncio.gather(
            *(batcher.ask(f"r{k}", request(f"first r{k}")) for k in range(4))
        )

    found = run_async(four())
    assert all(f["choices"][0]["message"]["content"] == "ok" for f in found)
    spans = [line.split() for line in log.read_text().splitlines()]
    assert [kind for _, kind in spans] == ["start", "end", "start", "end"]  # never two at once


def test_a_fault_that_outlasts_the_patience_stops_the_run_in_one_line(tmp_path):
    """Every call answered 503: the calls are retried until the patience is spent, then the
    run stops with one line saying what kept failing (the same command resumes)."""
    server = ChaosBatches(0, blip=1.0, lost=0.0, expire=0.0)
    with serve_app(server.app()) as url:
        executor = OpenAIBatches(url, "sk-test-0000000000", patience=1.0)
        batcher = Batcher(executor, tmp_path / "a", settle=0.01, poll=0.01)
        began = time.monotonic()
        with pytest.raises(BatchError, match=r"POST /files: still failing after 1 s") as caught:
            run_async(batcher.ask("x", request("first x")))
    assert time.monotonic() - began < 10
    assert "\n" not in str(caught.value) and "resumes" in str(caught.value)
