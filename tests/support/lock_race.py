"""Processes racing for stale run locks (``tests/test_run_lock.py``): each worker tries every
trial's run directory at the same instant as the others (a barrier), keeps what it won, and
says at the end whether each lock it thinks it holds is still its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from groundcover.pipelines.runtime.store.run_dir import RunLock, RunStoreError

BARRIER_SECONDS = 300  # every racer at the barrier: a bound under load, not a speed target


def race(worker: int, run_dirs: list[str], barrier: Any, results: Any) -> None:
    """One racer; a barrier not reached by all within ``BARRIER_SECONDS`` (another racer died)
    raises, so no racer waits forever."""
    held: list[tuple[int, RunLock]] = []
    for trial, run_dir in enumerate(run_dirs):
        barrier.wait(BARRIER_SECONDS)
        lock = RunLock(Path(run_dir))
        try:
            lock.acquire()
        except RunStoreError:
            results.put(("tried", trial, worker, False))
        else:
            held.append((trial, lock))
            results.put(("tried", trial, worker, True))
        barrier.wait(BARRIER_SECONDS)  # every worker has tried before the next trial
    # every trial is over: whoever still believes it holds a lock says so
    barrier.wait(BARRIER_SECONDS)
    for trial, lock in held:
        holder = lock._read() or {}
        results.put(("holds", trial, worker, holder.get("token") == lock.token))
    barrier.wait(BARRIER_SECONDS)
    for _, lock in held:
        lock.release()
    results.put(("done", -1, worker, True))
