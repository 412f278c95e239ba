"""Bought once when the provider is slow, forgetful or odd: the batch transport against a chaos
Batch API (``tests/support/batch_chaos.py``) that lists late, ignores its cursor, makes
batches after the create gave up, cuts and garbles its files, answers in odd shapes, keeps a
batch running past its ``expires_at``, refuses for the organisation's enqueued tokens and
loses output files. Every schedule ends with each line billed once by the stub's own count;
where a line is paid for and lost (a file gone for good), it is bought again once, with a note,
and the command line shows and forgets the batch. The provider messages each mean what their
documentation says, and ``vllm run-batch`` (a stand-in that starts a grandchild as EngineCore
does) dies whole with its run, or at the resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from groundcover.serving.batch import (
    PROVIDER_MESSAGES,
    REJECT,
    SPLIT,
    STOP,
    WAIT,
    Batcher,
    LineFailed,
    LocalRunBatch,
    OpenAIBatches,
    Problem,
    Undecided,
    batch_errors,
    command_line,
    ledger_events,
    meaning_of,
    process_start,
    read_ledgers,
    read_output,
    words,
)
from groundcover.serving.redact import remember
from tests.support.batch_chaos import (
    KILLED,
    SCHEDULES,
    WORDS,
    ChaosBatches,
    batcher_for,
    expected,
    invocation,
    request,
    run_schedule,
)
from tests.support.loopback import serve_app


@pytest.fixture(autouse=True, scope="module")
def _bury_the_killed() -> Any:
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


def run_async(coroutine: Any) -> Any:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def lines_of(run_dir: Path) -> list[dict[str, Any]]:
    return [e for ledger in run_dir.glob("batches/*/ledger.jsonl") for e in ledger_events(ledger)]


# ---- the schedules: one fault each, every line billed once ------------------------------------


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_provider_that_lies_in_one_way_bills_each_line_once(tmp_path, name):
    """Each fault of a slow, forgetful or odd provider, 10% of the calls 503 / 429 besides:
    every one of the 16 lines billed exactly once, none twice, none lost."""
    done = run_schedule(tmp_path / "batches" / "judge-x", name, seed=3)
    assert (done["once"], done["twice"], done["lost"]) == (16, 0, 0), done
    if name == "bad cursor":  # a repeated page ends each pass: no 100 identical pages
        assert done["listings"] < 40, done


def test_a_listing_whose_cursor_does_not_move_is_read_until_a_page_repeats(tmp_path):
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.bad_cursor, server.page_size = True, 1
    for k in range(3):
        server.files[f"file-{k}"] = b""
        server._make({"input_file_id": f"file-{k}", "metadata": {"groundcover": f"t{k}"}})
    with serve_app(server.app()) as url:
        executor = OpenAIBatches(url, "sk-test-0000000000", find_window=0.0)

        async def look() -> tuple[str | None, str, int, str | None]:
            newest = await executor.find("t2", "file-2")  # the newest: on page one
            executor.pages = 0
            with pytest.raises(Undecided) as undecided:  # never "not made": it cannot say
                await executor.find("absent", "file-9")
            pages = executor.pages
            # a batch known to be older than the one looked for: the pass has read far enough
            known = await executor.find("absent", "file-9", earlier=frozenset({"batch-2"}))
            await executor.close()
            return newest, str(undecided.value), pages, known

        newest, undecided, pages, known = run_async(look())
    assert newest == "batch-2" and known is None
    assert "listing repeated a page while it said there were more" in undecided
    assert pages == 2  # the second page was the first again: the pass ends


def test_a_create_made_after_the_search_for_it_ended_is_adopted_and_cancelled(tmp_path):
    """A create answered 504 whose batch the provider makes 0.5 s later, after the search (0.1
    s) gave up and the file's batch was made again: the late one, found in the next listing,
    is recorded as adopted and cancelled while still validating; nothing is billed twice."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.late_first, server.late_by = 1, 0.5
    server.polls_before_done = 100  # the first round ends after the late batch is made
    folder = tmp_path / "batches" / "judge-x"
    options: dict[str, Any] = {"executor": {"find_window": 0.1}}
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, WORDS, options)])
    assert found == {w: expected(w) for w in WORDS}
    assert set(server.paid.values()) == {1} and len(server.paid) == 16
    adopted = [e for e in lines_of(tmp_path) if e.get("adopted")]
    assert len(adopted) == 1 and server.cancels == 1
    late = server.batches[adopted[0]["batch"]]
    assert late["status"] == "cancelled" and late["request_counts"]["completed"] == 0


# ---- downloads checked before they are believed ---------------------------------------------


def test_a_file_cut_for_good_has_its_lost_lines_bought_again_once_with_a_note(tmp_path):
    """Each download of the first output cut mid-line (the transfer whole): downloaded three
    times, then read as far as it goes; its last line, paid for, is bought again once and the
    ledger says why -- not retried as if it had never been answered."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.broken = {"batch-0": "cut"}
    folder = tmp_path / "batches" / "judge-x"
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, WORDS, {})])
    assert found == {w: expected(w) for w in WORDS}
    assert server.downloads["file-out-batch-0"] == 3
    finished = [e for e in lines_of(tmp_path) if e.get("event") == "finished"]
    first = next(e for e in finished if e["batch"] == "batch-0")
    assert "its last line is cut after 3 downloads" in first["note"]
    assert list(first["lost"].values()) == ["cut"] and first["causes"] == {"cut": 1}
    (lost,) = first["lost"]
    assert server.paid[lost] == 2  # paid, lost in the cut, bought once more
    assert sum(server.paid.values()) == 17


def test_a_short_file_is_downloaded_again_against_its_request_counts():
    """Whole lines, fewer than the batch counts: not yet believed (``shortfall``)."""
    from groundcover.serving.batch import shortfall

    line = b'{"custom_id": "a", "response": {"status_code": 200, "body": {"choices": [{}]}}}\n'
    assert shortfall(line * 3, 3) == ""
    assert shortfall(line * 2, 3) == "2 complete lines of the 3 its batch counts"
    assert shortfall(line * 3 + line[:20], None) == "its last line is cut"
    assert shortfall(line.replace(b'"a"', b'"\xff"'), None) == "1 line(s) not UTF-8 or not JSON"


# ---- odd shapes fail the line, not the run ----------------------------------------------------


def test_odd_lines_and_a_file_not_utf8_fail_their_own_lines_and_are_bought_again(tmp_path):
    """A line whose response is a string (its error a list), and one line of the first output
    not UTF-8 in every download: each recorded against its own request with the provider's
    words and bought again; every other line answered from the same batch."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.odd = {"a-w3"}
    server.broken = {"batch-0": "garble"}
    folder = tmp_path / "batches" / "judge-x"
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, WORDS, {})])
    assert found == {w: expected(w) for w in WORDS}
    first = next(e for e in lines_of(tmp_path) if e.get("batch") == "batch-0" and "failed" in e)
    assert first["failed"]["a-w3"] == "odd line: response is a str: odd"
    garbled = [cid for cid, why in first["failed"].items() if "not UTF-8" in why]
    assert len(garbled) == 1 and first["causes"] == {"unreadable": 2}
    assert server.paid[garbled[0]] == 2  # paid, unreadable, bought again
    assert server.paid["a-w3"] == 1  # an odd error line is not billed
    assert sum(server.paid.values()) == 17


def test_a_batch_that_cannot_be_read_fails_its_own_lines_and_is_polled_again_when_asked(
    tmp_path,
):
    """Two batches; one answers a status none of the Batch API's. Its line fails with one line
    naming the batch, the other batch's line is answered, and asking the failed line again
    polls its batch again (never a wait with no call)."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    polls: list[str] = []

    @web.middleware
    async def weird(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if request.method == "GET" and request.path == "/v1/batches/batch-1":
            polls.append(request.path)
            return web.json_response({"id": "batch-1", "status": "half-done"})
        return response

    app = server.app()
    app.middlewares.append(weird)
    with serve_app(app) as url:
        batcher = batcher_for(url, tmp_path / "a", max_lines=1, settle=0.01)

        async def both() -> list[Any]:
            first = asyncio.ensure_future(batcher.ask("one", request("first one")))
            await asyncio.sleep(0.2)
            second = asyncio.ensure_future(batcher.ask("two", request("first two")))
            return await asyncio.gather(first, second, return_exceptions=True)

        async def again() -> Any:
            return await asyncio.wait_for(batcher.ask("two", request("first two")), 10)

        loop = asyncio.new_event_loop()
        one, two = loop.run_until_complete(both())
        seen = len(polls)
        with pytest.raises(LineFailed, match="batch batch-1 could not be read"):
            loop.run_until_complete(again())
        loop.run_until_complete(batcher.close())
        loop.close()
    assert one["choices"][0]["message"]["content"] == "ONE"
    assert isinstance(two, LineFailed) and "status 'half-done' is none of" in str(two)
    assert len(polls) == seen + 1  # asked again: polled again


def test_batch_errors_and_line_errors_of_any_shape_are_read_as_words():
    assert batch_errors({"data": [{"code": "c", "message": "m", "line": 3}]}) == [
        {"code": "c", "message": "m", "line": 3}
    ]
    assert batch_errors([{"message": "m"}, "plain"]) == [
        {"code": "", "message": "m", "line": None},
        {"code": "", "message": "plain", "line": None},
    ]
    assert batch_errors("just words") == [{"code": "", "message": "just words", "line": None}]
    assert batch_errors(None) == []
    odd = b'{"custom_id": "x", "response": {"status_code": 200, "body": "text"}}\n'
    assert read_output(odd).problems["x"].text == "odd line: an answer with a str"
    listed = b'{"custom_id": "y", "response": null, "error": [{"message": "a"}, "b"]}\n'
    assert read_output(listed).problems["y"] == Problem(500, "error: a; b", "retried")


def test_secrets_are_redacted_before_a_provider_s_words_are_cut():
    """A key that straddles the cut is still redacted (redact first, then cut): cut first,
    its first characters would be kept, no longer recognisable as the key."""
    key = "sk-live-" + "k" * 40
    remember(key)
    kept = words("x" * 290 + " " + key)
    assert "sk-live" not in kept and "kkk" not in kept and len(kept) == 300


# ---- failures by what they mean -----------------------------------------------------------


@pytest.mark.parametrize("said", PROVIDER_MESSAGES, ids=lambda s: s.example[:40])
def test_each_documented_provider_message_is_read_as_what_it_means(said):
    assert meaning_of(said.example) == said.meaning, said.source
    if said.code:  # the code alone, where the words are reworded
        assert meaning_of("reworded", said.code) == said.meaning


def test_the_enqueued_limit_is_never_read_as_too_big_and_undocumented_sizes_split():
    assert meaning_of("Enqueued token limit reached for gpt-4o; batch exceeds the limit") == WAIT
    assert meaning_of("Batch file exceeds the maximum size of 100 MB") == SPLIT
    assert meaning_of("This batch is too large, try again later") is None  # a queue's words
    assert meaning_of("something else entirely") is None
    assert {WAIT, SPLIT, REJECT, STOP} == {s.meaning for s in PROVIDER_MESSAGES}


def test_an_enqueued_limit_waits_and_creates_the_same_file_again(tmp_path):
    """The organisation's enqueued tokens full twice: the same uploaded file's batch created
    again after a backoff (never split), the lines bought once."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.enqueued = 2
    folder = tmp_path / "batches" / "judge-x"
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, WORDS, {})])
    assert found == {w: expected(w) for w in WORDS}
    first_three = [server.batches[f"batch-{k}"] for k in range(3)]
    assert [b["status"] for b in first_three] == ["failed", "failed", "completed"]
    assert len({b["input_file_id"] for b in first_three}) == 1  # the same file, whole
    assert all(len(b["lines"]) == 8 for b in first_three)
    assert set(server.paid.values()) == {1}
    bought = read_ledgers(tmp_path)
    assert bought is not None and bought["causes"] == {"queued": 16}


# ---- every wait ends ------------------------------------------------------------------------


def test_a_batch_stuck_past_its_expires_at_is_cancelled_and_its_lines_lost_twice_fail(tmp_path):
    """Every batch in_progress forever, its expires_at passed: each is cancelled once its grace
    is over, its finished half used, the rest bought again once; a line lost that way twice
    fails with a line naming its batch. Polls are bounded."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.stuck = 99
    folder = tmp_path / "batches" / "judge-x"
    words_ = WORDS[:4]
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, words_, {"grace": 0.1})])
    assert found is not None
    failed = [w for w in words_ if isinstance(found[w], LineFailed)]
    assert failed and all(found[w] == expected(w) for w in words_ if w not in failed)
    why = str(found[failed[0]])
    assert "paid for and lost twice: batch batch-" in why and "past its expires_at" in why
    assert server.cancels == len(server.batches)
    assert set(server.paid.values()) == {1}  # a cancelled batch's finished half, paid once


# ---- a vanished output, and the command line's way out ---------------------------------------


def test_a_vanished_output_is_bought_again_once_and_the_ledger_can_be_repaired(tmp_path):
    """The first batch's output gone for good (404): its lines bought again once, with a note;
    ``groundcover batch status`` shows it; when the second output is gone too the lines fail
    (lost twice) until ``batch forget RUN BATCH --rebuy`` lets them be bought again."""
    from groundcover.pipelines.cli import app

    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    server.broken = {"batch-0": "gone", "batch-1": "gone"}
    folder = tmp_path / "batches" / "judge-x"
    one = ["w0", "w1"]
    with serve_app(server.app()) as url:
        found = invocation(server, url, [(folder, one, {})])
        assert found is not None and all(isinstance(found[w], LineFailed) for w in one)
        assert "paid for and lost twice" in str(found["w0"])
        assert server.downloads["file-out-batch-0"] == 3
        shown = CliRunner().invoke(app, ["batch", "status", str(tmp_path)])
        assert shown.exit_code == 0, shown.output
        assert "batch-0" in shown.output and "batch-1" in shown.output
        again = invocation(server, url, [(folder, one, {})])  # a resume: still lost twice
        assert again is not None and "forget" in str(again["w0"])
        forgot = CliRunner().invoke(app, ["batch", "forget", str(tmp_path), "batch-1", "--rebuy"])
        assert forgot.exit_code == 0, forgot.output
        done = invocation(server, url, [(folder, one, {})])
    assert done == {w: expected(w) for w in one}
    status = json.loads(
        CliRunner().invoke(app, ["batch", "status", str(tmp_path), "--json"]).output
    )
    batches = {b["batch"]: b for b in status["clients"]["judge-x"]}
    assert batches["batch-0"]["note"].startswith("out file file-out-batch-0: file")
    assert batches["batch-1"]["status"] == "forgotten"
    missing = CliRunner().invoke(app, ["batch", "forget", str(tmp_path), "batch-9"])
    assert missing.exit_code != 0 and "no batch 'batch-9'" in missing.output


# ---- a local engine that dies with its run ----------------------------------------------------

# vLLM's run-batch starts its EngineCore as a separate child: this stand-in starts a grandchild
# the same way, writes both pids, and sleeps
ENGINE = textwrap.dedent(
    """
    import subprocess, sys, time, os
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {core.pid}")
    time.sleep(120)
    """
)


def wait_for_pids(marker: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if marker.is_file() and len(marker.read_text().split()) == 2:
            return [int(p) for p in marker.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the stand-in engine did not start")


def gone(pids: list[int], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(process_start(p) is None or _zombie(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True


def test_a_local_engine_and_its_enginecore_die_with_a_run_killed_9(tmp_path):
    """The run killed -9 while the engine runs: its guard ends the whole group, the engine's
    own child (EngineCore's stand-in) included."""
    marker = tmp_path / "engine.pids"
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from pathlib import Path
        from groundcover.serving.batch import LocalRunBatch

        async def main():
            command = [sys.executable, "-c", {ENGINE!r}, {str(marker)!r}]
            engine = LocalRunBatch(lambda i, o: command, dict(os.environ))
            path = Path({str(tmp_path)!r}) / "00001.jsonl"
            path.write_text("")
            await engine.create("f", path, "t")
            await asyncio.sleep(120)

        asyncio.run(main())
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script],
        env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[1])},
    )
    engine, core = wait_for_pids(marker)
    assert os.getpgid(core) == os.getpgid(engine) != os.getpgid(0)
    os.kill(run.pid, signal.SIGKILL)
    run.wait(30)
    assert gone([engine, core]), "the engine or its EngineCore outlived the run"


def test_a_resume_ends_what_a_dead_engine_leader_left_by_group_start_and_command(tmp_path):
    """An engine group whose leader died alone (its EngineCore still running): the resume ends
    the group's survivor by the group, the leader's start time and its command line; a live
    process with the recorded pid but another command line is left alone."""
    marker = tmp_path / "engine.pids"
    leader = subprocess.Popen([sys.executable, "-c", ENGINE, str(marker)], start_new_session=True)
    _, core = wait_for_pids(marker)
    started, command = process_start(leader.pid), command_line(leader.pid)
    leader.kill()
    leader.wait()
    assert process_start(core) is not None  # EngineCore outlived its leader
    folder = tmp_path / "batches" / "judge-x"
    folder.mkdir(parents=True)
    (folder / "00001.jsonl").write_text("")
    event = {
        "event": "submitted", "batch": "local-judge-x-00001", "round": 1, "file": "00001.jsonl",
        "custom_ids": ["q"], "pid": leader.pid, "pid_start": started, "command": command,
    }  # fmt: skip
    (folder / "ledger.jsonl").write_text(json.dumps(event) + "\n")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lookalike = dict(event, pid=other.pid, pid_start=process_start(other.pid))
        lookalike["batch"] = "local-judge-x-00002"
        with (folder / "ledger.jsonl").open("a") as ledger:
            ledger.write(json.dumps(lookalike) + "\n")
        Batcher(LocalRunBatch(lambda i, o: ["true"], dict(os.environ)), folder)
        assert gone([core]), "the survivor of the dead leader's group was not ended"
        assert other.poll() is None  # the recorded pid, another program: left alone
    finally:
        other.kill()
        other.wait()


def test_closing_the_executor_ends_each_engine_with_its_enginecore(tmp_path):
    """A run that stops (an error, Ctrl-C) closes its engines: the guard ends the group."""
    marker = tmp_path / "engine.pids"
    engine = LocalRunBatch(lambda i, o: [sys.executable, "-c", ENGINE, str(marker)], {**os.environ})
    path = tmp_path / "00001.jsonl"
    path.write_text("")

    async def start_and_close() -> list[int]:
        await engine.create("f", path, "t")
        pids = await asyncio.to_thread(wait_for_pids, marker)
        await engine.close()
        return pids

    pids = run_async(start_and_close())
    assert gone(pids) and not engine.running


def test_a_local_engine_past_its_window_is_stopped_and_its_lines_fail_naming_the_batch(tmp_path):
    """``vllm run-batch`` (a stand-in that never ends) past the batch window and its grace: its
    guard is told to stop, the batch read as cancelled (not failed: the run goes on), its line
    bought again once, then failed with a line naming the batch."""
    marker = tmp_path / "engine.pids"
    engine = LocalRunBatch(lambda i, o: [sys.executable, "-c", ENGINE, str(marker)], {**os.environ})
    engine.window = "0.3s"
    batcher = Batcher(engine, tmp_path / "judge-x", settle=0.01, poll=0.05, grace=0.1)

    async def ask() -> Any:
        try:
            return await batcher.ask("q", request("first q"))
        finally:
            await batcher.close()

    with pytest.raises(LineFailed, match=r"lost twice: batch local-judge-x-\S+ cancelled: still"):
        run_async(ask())
    assert batcher.stats.causes["stuck"] == 1 and not engine.running


# ---- a sibling driver's upload left without its batch -----------------------------------------


def sibling_orphan(server: ChaosBatches, folder: Path, ids: list[str]) -> None:
    """``folder``'s ledger as a killed driver left it: its file uploaded, no batch made."""
    from groundcover.serving.batch import batch_line, folder_nonce

    folder.mkdir(parents=True)
    name = "00001-00001-abcdef.jsonl"
    text = "".join(batch_line(cid, request(f"first {cid[2:]}")) for cid in ids)
    (folder / name).write_text(text)
    server.files["file-0"] = text.encode()
    event = {
        "event": "uploaded", "file": name, "file_id": "file-0", "round": 1,
        "tag": f"{folder_nonce(folder)}/{name[:-6]}", "custom_ids": ids, "at": time.time(),
    }  # fmt: skip
    (folder / "ledger.jsonl").write_text(json.dumps(event) + "\n")


@pytest.mark.parametrize("owner", ["running", "gone"])
def test_a_sibling_s_upload_left_without_its_batch_is_bought_once(tmp_path, owner):
    """Driver B asks a line of driver A's upload that a kill left without its batch. With A
    running, B waits for the batch A makes and records; with A not there (it asks nothing),
    B makes it from the same file and tag after ``owner_wait``, and A, started later, finds that
    batch in its ledger: one batch either way, each line billed once."""
    server = ChaosBatches(0, blip=0, lost=0, expire=0)
    a, b = tmp_path / "batches" / "judge-x-d0", tmp_path / "batches" / "judge-x-d1"
    sibling_orphan(server, a, ["a-w0", "a-w1"])
    with serve_app(server.app()) as url:

        async def both() -> list[Any]:
            second = batcher_for(url, b, siblings=[a], owner_wait=0.3)
            asks = [second.ask("a-w0", request("first w0"))]
            if owner == "running":
                first = batcher_for(url, a, siblings=[b])
                asks.append(first.ask("a-w1", request("first w1")))
            found = await asyncio.gather(*asks)
            if owner == "gone":  # A resumes later: the batch B made is in its ledger
                first = batcher_for(url, a, siblings=[b])
                found.append(await first.ask("a-w1", request("first w1")))
            await asyncio.gather(first.close(), second.close())
            return found

        found = run_async(both())
    assert [f["choices"][0]["message"]["content"] for f in found] == ["W0", "W1"]
    assert len(server.batches) == 1 and dict(server.paid) == {"a-w0": 1, "a-w1": 1}


def test_an_engine_cancelled_twice_is_killed_and_its_turn_given_up(tmp_path):
    """A cancel the engine does not answer in time is asked again: its group is killed and the
    device's one-engine turn given back, so the next batch never waits on a stuck engine."""
    marker = tmp_path / "engine.pids"
    engine = LocalRunBatch(lambda i, o: [sys.executable, "-c", ENGINE, str(marker)], {**os.environ})
    path = tmp_path / "00001.jsonl"
    path.write_text("")

    async def twice() -> list[int]:
        batch = await engine.create("f", path, "t")
        pids = await asyncio.to_thread(wait_for_pids, marker)
        await engine.cancel(batch)
        await engine.cancel(batch)
        assert not engine.running and not engine.engine.locked()
        return pids

    assert gone(run_async(twice()))


def test_a_quota_refusal_stops_at_once_even_as_a_429():
    """OpenAI says ``insufficient_quota`` with status 429, the status of a limit that waiting
    ends: the words decide (STOP), so the create is refused at once in one line with the
    provider's words, never asked again until patience runs out."""
    asked: list[str] = []

    async def create(request: web.Request) -> web.Response:
        asked.append(request.path)
        body = {
            "error": {
                "message": "You exceeded your current quota, please check your plan and "
                "billing details.",
                "type": "insufficient_quota",
                "code": "insufficient_quota",
            }
        }
        return web.json_response(body, status=429, headers={"Retry-After": "0"})

    provider = web.Application()
    provider.router.add_post("/v1/batches", create)
    with serve_app(provider) as url:
        executor = OpenAIBatches(url, "sk-test-0000000000", patience=30, find_window=0.0)

        async def buy() -> str:
            try:
                await executor.create("file-1", Path("in.jsonl"), "tag-1")
            except Exception as exc:  # the refusal, as the batcher sees it
                return f"{type(exc).__name__}: {exc}"
            finally:
                await executor.close()
            return "made"

        said = run_async(buy())
    assert said.startswith("BatchError") and "exceeded your current quota" in said, said
    assert asked == ["/v1/batches"]  # once: not retried, and no listing searched
