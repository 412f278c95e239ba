"""The guard of one local engine (``vllm run-batch``), run as a script before anything else is
imported: ``python engine_guard.py --parent PID -- ARGV...`` (PID: the run that starts it).

Started in a session of its own (its pid is the process group's id), it starts ARGV in its
group and ends the whole group -- vLLM's EngineCore, a separate child of the engine with no
parent-death watch of its own, included -- when ARGV exits, when it is told to stop (SIGTERM,
SIGINT, SIGHUP), or when the run that started it dies, even by ``kill -9``: the kernel's
parent-death signal, and a look at its parent ten times a second (the signal follows the thread that
started it, the look follows the process). It is a child subreaper, so a descendant that left
the group is still its own and still ended. Standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CHECK_SECONDS = 0.1  # how soon a stop or a dead parent is noticed


def prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):  # not Linux: the parent look still holds
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def children_of() -> dict[int, list[int]]:
    """Each process's children, from ``/proc``."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def end_everything() -> None:
    """SIGKILL to every descendant and every other member of this group, then reap."""
    me = os.getpid()
    tree = children_of()
    doomed, todo = set(), [me]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in doomed:
                doomed.add(child)
                todo.append(child)
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), signal.SIGTERM)  # any member that is no descendant (ignored here)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.02)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    if not command:
        print(
            "engine_guard: nothing to run (engine_guard.py --parent PID -- ARGV)", file=sys.stderr
        )
        return 2
    given = argv[argv.index("--parent") + 1] if "--parent" in argv else ""
    parent = int(given) if given.isdigit() else os.getppid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: stop.append(number))
    if os.getppid() != parent:  # the run died before the watch was set: nothing is started
        return 137
    engine = subprocess.Popen(command)  # in this group: ended with it
    while not stop and os.getppid() == parent:
        try:
            code = engine.wait(CHECK_SECONDS)
        except subprocess.TimeoutExpired:
            continue
        end_everything()  # EngineCore and whatever else the engine left
        return code if code >= 0 else 128 - code
    end_everything()
    return 128 + (stop[0] if stop else signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
