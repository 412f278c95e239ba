"""One writer per run directory (``pipelines.runtime.store.run_dir.RunLock``): a second process is
refused in one line naming the holder, a stale holder (its process gone, or a host that stopped
renewing) is taken over, a holder whose lock was taken stops recording, and two real commands on
one run directory record every item once with the calls of one run."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.pipelines.runtime.contract.results import ItemResult
from groundcover.pipelines.runtime.store import run_dir as runstore
from groundcover.pipelines.runtime.store.run_dir import LOCK, RunLock, RunStoreError
from tests.support.records import whole_records

ROOT = Path(__file__).resolve().parents[1]
HOLD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from groundcover.pipelines.runtime.store.run_dir import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run's lock."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_holder_until_it_is_gone(tmp_path):
    holder = hold(tmp_path)
    try:
        with pytest.raises(RunStoreError) as refused:
            RunLock(tmp_path).acquire()
        line = str(refused.value)
        assert "\n" not in line and "another process is writing this run" in line
        assert f"pid {holder.pid} on host {platform.node()} since " in line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = RunLock(tmp_path)
    lock.acquire()  # its process is gone: taken over at once
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK).exists()


def write_lock(run_dir: Path, host: str, pid: int, renewed: float) -> None:
    holder = {"pid": pid, "host": host, "started": renewed, "renewed": renewed, "token": "x"}
    (run_dir / LOCK).write_text(json.dumps(holder))


def test_a_holder_on_another_host_is_taken_over_only_when_it_stopped_renewing(tmp_path):
    write_lock(tmp_path, "node-7", 4242, time.time())  # renewed just now: alive over there
    with pytest.raises(RunStoreError, match="pid 4242 on host node-7"):
        RunLock(tmp_path).acquire()
    write_lock(tmp_path, "node-7", 4242, time.time() - runstore.STALE_SECONDS - 1)
    lock = RunLock(tmp_path)
    lock.acquire()
    assert json.loads((tmp_path / LOCK).read_text())["host"] == platform.node()
    lock.release()


def test_a_holder_whose_lock_was_taken_stops_recording(tmp_path, monkeypatch):
    from groundcover.pipelines.runtime.store.run_dir import RunStore

    monkeypatch.setattr(runstore, "RENEW_SECONDS", 0.05)
    store = RunStore(tmp_path / "run")
    store.open(framework="f", task="t", config={})
    store.append(ItemResult(id="a", status="ok", score=1.0, explanation="x"))
    write_lock(tmp_path / "run", "node-7", 4242, time.time())  # another host took it over
    deadline = time.monotonic() + 10
    while store.lock is not None and not store.lock.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(RunStoreError, match=r"another process took over this run .*node-7"):
        store.append(ItemResult(id="b", status="ok", score=1.0, explanation="x"))
    store.close()
    store.release()
    assert (tmp_path / "run" / LOCK).exists()  # the new holder's lock stays
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a"]


# ---- two real commands on one run directory ---------------------------------------------------


@pytest.fixture
def judged(tmp_path):
    """A FanOutQA run of judged answers against a loopback judge that answers from the prompt
    (each answer after ``pace["seconds"]``): (command for a run directory, the judge, pace)."""
    from groundcover.pipelines.fanoutqa.framework import PROMPTS
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.scripted import ScriptedClient
    from tests.test_drivers import fanoutqa_inputs, judge_letter

    dev, answers = fanoutqa_inputs(tmp_path)
    verdict = {"judge": lambda p: f"Compared.\n{judge_letter(p)}"}
    judge = ScriptedClient(verdict, check_constraints=False)
    pace = {"seconds": 0.1}
    stages = StageByPrompt(PROMPTS, {"judge": "judge"})
    with loopback_judge(judge, "reasoning", stages, lambda: pace["seconds"]) as url:

        def command(run_dir: Path) -> list[str]:
            args = [
                sys.executable,
                "-m",
                "groundcover",
                "eval",
                "fanoutqa",
                "--judge",
            ]
            args += ["--data", str(dev), "--answers", str(answers), "--endpoint", url]
            args += ["--model", "scripted", "--run-dir", str(run_dir), "--quiet", "--no-cache"]
            return [*args, "--concurrency", "2"]

        yield command, judge, pace


def test_two_commands_on_one_run_directory_record_each_item_once(judged, tmp_path):
    command, judge, _ = judged
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    single = subprocess.run(command(tmp_path / "single"), env=env, capture_output=True, timeout=300)
    assert single.returncode == 0
    calls_of_one_run = len(judge.calls)

    run_dir = tmp_path / "run"
    started = []
    for _ in range(2):  # 1 s apart: whichever opens the run first holds it
        started.append(subprocess.Popen(command(run_dir), env=env, stderr=subprocess.PIPE))
        time.sleep(1.0)
    ends = [(proc, proc.communicate(timeout=300)[1].decode()) for proc in started]
    assert sorted(proc.returncode for proc, _ in ends) == [0, 2], [err[-1500:] for _, err in ends]
    (holder, _), (_, refused) = sorted(ends, key=lambda end: end[0].returncode)
    line = " ".join(refused.split())
    assert f"another process is writing this run: pid {holder.pid} on host" in line
    ids = whole_records(run_dir / "answers")
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 24  # every item, once
    assert len(judge.calls) - calls_of_one_run == calls_of_one_run  # the work of one run
    assert not (run_dir / "answers" / LOCK).exists()  # given back at the end


def test_a_holder_killed_mid_run_is_taken_over_by_the_same_command(judged, tmp_path):
    command, judge, pace = judged
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(command(run_dir), env=env, stderr=subprocess.PIPE)
    results = run_dir / "answers" / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results.is_file() and results.read_bytes().count(b"\n") >= 4):
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.02)
    holder.kill()  # SIGKILL: its lock stays behind, naming a process that is gone
    holder.wait()
    assert (run_dir / "answers" / LOCK).exists()
    pace["seconds"] = 0.0
    done = subprocess.run(command(run_dir), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = whole_records(run_dir / "answers")
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 24
    assert 24 <= len(judge.calls) <= 24 + 2  # one run's calls, plus those in flight at the kill


def test_a_holder_killed_but_not_yet_reaped_counts_as_gone(tmp_path):
    holder = hold(tmp_path)
    holder.send_signal(signal.SIGKILL)
    time.sleep(0.5)  # dead, but its parent (this test) has not waited for it: a zombie
    assert Path(f"/proc/{holder.pid}").exists()
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()
    holder.wait()


# ---- racing takers of a stale lock ------------------------------------------------------------

NO_SUCH_PID = 4_194_305  # above Linux's largest pid: never a live process


def test_racing_processes_take_over_a_stale_lock_exactly_one_each_time(tmp_path):
    """100 trials: a lock whose process is gone, eight processes taking it over at one instant.
    Exactly one wins each time, and at the end the lock is the winner's (no second taker that
    also believes it holds it)."""
    import multiprocessing

    from tests.support.lock_race import race

    trials, workers = 100, 8
    run_dirs = []
    for trial in range(trials):
        run_dir = tmp_path / f"t{trial}"
        run_dir.mkdir()
        write_lock(run_dir, platform.node(), NO_SUCH_PID, time.time())
        run_dirs.append(str(run_dir))
    # Forked from the fork server (one thread, the racer module preloaded) rather than from this
    # pytest worker, a process with other threads: a fork copies whatever lock another thread
    # holds at that instant. The barrier still makes them race at one instant each trial.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.support.lock_race"])
    barrier, results = context.Barrier(workers), context.Queue()
    racers = [
        context.Process(target=race, args=(k, run_dirs, barrier, results)) for k in range(workers)
    ]
    for racer in racers:
        racer.start()
    # Each racer's messages arrive in its own order, but not in order across racers: a racer's
    # queue thread can still be sending its last "tried" when another has said "holds" (a loaded
    # machine; reading the phases one after the other once hung this test). So everything is read
    # until every racer has said "done", its last word, and sorted by kind after. A racer that
    # dies ends the wait at once (the others then give up at their barrier's timeout).
    by_kind: dict[str, list[tuple[str, int, int, bool]]] = {"tried": [], "holds": [], "done": []}
    deadline = time.monotonic() + 600  # a wait bound under load, not a speed target
    try:
        while len(by_kind["done"]) < workers and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                message = results.get(timeout=1)
                by_kind[message[0]].append(message)
                continue
            died = [(k, r.exitcode) for k, r in enumerate(racers) if r.exitcode not in (None, 0)]
            assert not died, f"racers died (worker, exit code): {died}"
        silent = sorted(set(range(workers)) - {worker for _, _, worker, _ in by_kind["done"]})
        assert not silent, f"racers {silent} never said done: {[r.exitcode for r in racers]}"
        for racer in racers:
            racer.join(30)
    finally:
        for racer in racers:
            racer.kill()  # whatever is left, so that the pytest worker's exit never waits on it
    seen, holds, done = by_kind["tried"], by_kind["holds"], by_kind["done"]
    assert len(seen) == workers * trials
    winners = [sum(won for _, trial, _, won in seen if trial == t) for t in range(trials)]
    assert winners == [1] * trials, winners
    assert sorted(trial for _, trial, _, _ in holds) == list(range(trials))
    assert all(still for *_, still in holds), holds
    assert len(done) == workers and all(r.exitcode == 0 for r in racers)


TAKE = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from groundcover.pipelines.runtime.store.run_dir import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("taken", flush=True)
"""


def test_a_taker_waits_for_the_guard_before_it_judges_a_stale_lock(tmp_path):
    """The step from reading a stale lock to replacing it runs under the run's guard: a taker in
    another process started while the guard is held blocks on the guard (the kernel lists it as
    a waiter on the guard file) before it has touched the stale lock, and takes it once the guard
    is let go. The race test above may not hit that window on a small machine; this does, each
    time and under any load: an unguarded taker never waits, it takes the lock and says so."""
    write_lock(tmp_path, platform.node(), NO_SUCH_PID, time.time())
    stale_lock = (tmp_path / LOCK).read_text()
    guard = RunLock(tmp_path)._guard()
    guard.__enter__()
    taker = subprocess.Popen(
        [sys.executable, "-c", TAKE, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    try:
        inode = (tmp_path / f".{LOCK}.guard").stat().st_ino
        deadline = time.monotonic() + 120  # a wait bound under load, not a speed target
        while not waits_on_flock(taker.pid, inode):
            assert taker.poll() is None, "the taker did not wait for the guard"
            assert time.monotonic() < deadline, "the taker never reached the guard"
            time.sleep(0.05)
        assert (tmp_path / LOCK).read_text() == stale_lock
    finally:
        guard.__exit__(None, None, None)
        try:
            out, _ = taker.communicate(timeout=120)
        finally:
            taker.kill()
    assert out.strip() == "taken" and taker.returncode == 0
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == taker.pid


def waits_on_flock(pid: int, inode: int) -> bool:
    """Whether process ``pid`` is blocked waiting for an ``flock`` of the file ``inode``: the
    kernel lists each waiter in /proc/locks as ``N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE``."""
    entries = (line.split() for line in Path("/proc/locks").read_text().splitlines())
    return any(
        fields[1:3] == ["->", "FLOCK"]
        and fields[5] == str(pid)
        and fields[6].rsplit(":", 1)[-1] == str(inode)
        for fields in entries
    )


def test_without_file_locks_a_taker_puts_back_a_lock_that_is_not_the_stale_one(tmp_path):
    """Where the file system has no ``flock``, a taker moves the lock it judged stale aside by
    renaming it; if another taker replaced it meanwhile, what it moved is the new holder's and is
    linked back, not removed."""
    write_lock(tmp_path, platform.node(), NO_SUCH_PID, time.time())
    judged = json.loads((tmp_path / LOCK).read_text())
    fresh = {**judged, "pid": os.getpid(), "token": "another taker's"}
    (tmp_path / LOCK).write_text(json.dumps(fresh))  # the other taker was quicker
    RunLock(tmp_path)._take_over(judged)
    assert json.loads((tmp_path / LOCK).read_text()) == fresh
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # nothing left aside
    RunLock(tmp_path)._take_over(fresh)  # the one judged: removed
    assert not (tmp_path / LOCK).exists()
