"""``vllm run-batch`` for a model served here (``LocalRunBatch``): one process per batch under
``engine_guard.py``, which ends the engine's whole process group (EngineCore included) with the
run; what a killed run left is ended by the resume, by group, start time and command line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .batch_said import BatchState, words
from .files import open_unlinked

# one local engine at a time per device in a process: (device, event loop) -> its lock
_ENGINES: dict[tuple[str, int], asyncio.Lock] = {}
GUARD = Path(__file__).with_name("engine_guard.py")  # run as a script: no package import


def process_start(pid: int) -> str | None:
    """A process's start time (``/proc/PID/stat`` field 22): a pid with another start is
    another process."""
    found = _stat(pid)
    return found[19] if found is not None else None


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command (state first), or None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def command_line(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def end_engine_group(pgid: int, start: str, command: list[str] | None) -> list[int]:
    """End what a killed run's engine left: the group ``pgid`` whose leader started at
    ``start`` (clock ticks) with ``command``. The leader, if it is still that process, and every
    member of its group started no earlier than it (a pid is not reused while its group lives,
    so a member of the group is the engine's): EngineCore outlives a leader killed alone. The
    pids signalled."""
    if pgid <= 1 or pgid == os.getpgrp():
        return []
    ended = []
    leader = _stat(pgid)
    same = leader is not None and leader[19] == start
    if same and command is not None and command_line(pgid) != command:
        same = False  # the pid is another program's now
    for pid in _pids():
        found = _stat(pid)
        if found is None or found[0] == "Z" or int(found[2]) != pgid:
            continue
        if pid == pgid and not same:
            continue
        if int(found[19]) < int(start):  # older than the engine: not its
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    return ended


def _pids() -> Iterable[int]:
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                yield int(entry.name)


class LocalRunBatch:
    """``vllm run-batch`` on a model served here: one process per batch, the model loaded by
    it (no server), the output file written beside the input. It runs under a small guard
    (``engine_guard.py``) that leads its process group and ends the whole group -- the engine's
    EngineCore included -- when the engine exits, when told to stop, or when the run that
    started it dies (even by ``kill -9``). One still running from a killed run (its group, start
    time and command line are in the ledger) is ended by the resume, whose batch then runs
    again: nothing was bought. One engine runs at a time per device."""

    name = "vllm-run-batch"
    window = "24h"

    def __init__(
        self, command: Callable[[Path, Path], list[str]], env: dict[str, str], device: str = ""
    ):
        self.command = command  # (input, output) -> argv
        self.env = env
        self.device = device
        self.running: dict[str, subprocess.Popen] = {}
        self.cancelled: set[str] = set()  # batches whose engine was told to stop
        self.tagged: dict[str, str] = {}  # an engine is never found by a listing
        self.seen: set[str] = set()
        self.lost: Counter[str] = Counter()  # an engine's create is never lost

    @property
    def engine(self) -> asyncio.Lock:
        return _ENGINES.setdefault((self.device, id(asyncio.get_running_loop())), asyncio.Lock())

    async def upload(self, path: Path) -> str:
        return path.name  # the file is read where it lies

    async def find(
        self, tag: str, file_id: str, since: float = 0.0, earlier: frozenset[str] = frozenset()
    ) -> str | None:
        return None  # an engine is never left running a batch nobody records: run it again

    async def scan(self, prefix: str, since: float) -> None:
        pass

    async def create(self, file_id: str, path: Path, tag: str) -> str:
        await self.engine.acquire()  # released when the process ends (``poll``)
        out = _output_of(path)
        out.unlink(missing_ok=True)
        try:
            log = _open_log(path.with_suffix(".log"))
            try:
                process = subprocess.Popen(
                    [sys.executable, str(GUARD), "--parent", str(os.getpid()), "--"]
                    + self.command(path, out),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,  # the guard leads a group of its own: ended whole
                )
            finally:
                os.close(log)
        except BaseException:
            self.engine.release()
            raise
        batch_id = f"local-{path.parent.name}-{path.stem}"  # unique across driver folders
        self.running[batch_id] = process
        return batch_id

    def about(self, batch_id: str) -> dict[str, Any]:
        process = self.running.get(batch_id)
        if process is None:
            return {}
        return {
            "pid": process.pid,
            "pid_start": process_start(process.pid),
            "command": command_line(process.pid),
        }

    def found_pending(self, event: dict[str, Any]) -> None:
        """A batch a killed run left pending: its engine's group, if anything of it outlived
        the run, is ended (by group, start time and command line)."""
        pid, start, command = event.get("pid"), event.get("pid_start"), event.get("command")
        if isinstance(pid, int) and isinstance(start, str) and start.isdigit():
            end_engine_group(pid, start, command if isinstance(command, list) else None)

    async def poll(self, batch_id: str, path: Path) -> BatchState:
        process = self.running.get(batch_id)
        if process is not None and process.poll() is None:
            return BatchState("in_progress")
        out = _output_of(path)
        if process is None:  # from before a kill: the process went with the run
            if out.is_file():
                return BatchState("completed", output=out.read_bytes())
            return BatchState("expired", message="vllm run-batch ended with the run before it")
        self.running.pop(batch_id)
        self.engine.release()
        if process.returncode == 0 and out.is_file():
            return BatchState("completed", output=out.read_bytes())
        if batch_id in self.cancelled:  # stopped on purpose: what it wrote is used
            return BatchState("cancelled", output=out.read_bytes() if out.is_file() else b"")
        tail = path.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-3:]
        return BatchState(
            "failed",
            message=words(f"vllm run-batch exited {process.returncode}: {' | '.join(tail)}"),
        )

    async def cancel(self, batch_id: str) -> None:
        """The engine told to stop (its guard ends the group); told a second time, the group is
        killed and the engine's turn given up: the next batch never waits on a stuck one."""
        process = self.running.get(batch_id)
        if process is None:
            return
        if batch_id not in self.cancelled:
            self.cancelled.add(batch_id)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.wait)
        self.running.pop(batch_id, None)
        self.engine.release()

    async def close(self) -> None:
        """Every engine still running ended: its guard asked first (it ends the whole group,
        a descendant that left it too), the group killed if the guard has not in 5 s."""
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        for process in self.running.values():
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            self.engine.release()
        self.running.clear()


def _open_log(path: Path) -> int:
    """The engine's log, opened for the child to write (never through a link)."""
    return open_unlinked(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, within=path.parent)


def _output_of(path: Path) -> Path:
    return path.with_name(f"{path.stem}.out.jsonl")
