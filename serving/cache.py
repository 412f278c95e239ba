"""A persistent, content-addressed response cache shared by every pipeline.

Keys are SHA-256 digests of a canonical JSON of everything that determines a model's answer
(model, adapter, messages, sampling parameters, tools, output constraints, prompt-template id), so
a rerun of the same command is answered from disk and costs no model calls. SQLite in WAL mode lets
several processes (Ray workers, resumed runs) share one file.

Off the request path: ``put`` hands the row to one writer thread, which commits what has queued
up in one transaction (at least every ``flush_seconds``), so no answer waits for a commit;
``get`` reads its own connection (WAL readers never wait for the writer) after the rows not yet
written. A process killed outright loses at most the rows of the last ``flush_seconds``: cache
rows, never run records (the run store writes those itself), and a resumed run asks again for
exactly those answers.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import queue
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import orjson


def cache_key(payload: dict[str, Any]) -> str:
    # json, not orjson: keys written by earlier versions must keep matching (float spellings)
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


_STOP = object()


class ResponseCache:
    def __init__(self, path: Path | str, flush_seconds: float = 0.25, batch_rows: int = 512):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_seconds, self.batch_rows = flush_seconds, batch_rows
        self._reader = self._connect()
        self._reader_lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}  # put, not yet committed
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._writer = threading.Thread(
            target=self._write_loop, args=(self._connect(),), name="cache-writer", daemon=True
        )
        self._writer.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS responses "
            "(key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL)"
        )
        db.commit()
        return db

    def get(self, key: str) -> dict[str, Any] | None:
        with self._pending_lock:
            found = self._pending.get(key)
        if found is not None:
            return found
        with self._reader_lock:
            row = self._reader.execute(
                "SELECT response FROM responses WHERE key=?", (key,)
            ).fetchone()
        return orjson.loads(row[0]) if row else None

    def put(self, key: str, response: dict[str, Any]) -> None:
        if self._closed:
            raise RuntimeError(f"the response cache {self.path} is closed")
        if self._error is not None:
            raise RuntimeError(f"the response cache {self.path} stopped writing") from self._error
        with self._pending_lock:
            self._pending[key] = response
        self._queue.put((key, response))

    def flush(self) -> None:
        """Wait until every row put so far is committed."""
        if self._closed:
            return  # close() committed them
        done = threading.Event()
        self._queue.put(done)
        while not done.wait(0.5):
            if not self._writer.is_alive():
                break
        if self._error is not None:
            raise RuntimeError(f"the response cache {self.path} stopped writing") from self._error

    def _write_loop(self, db: sqlite3.Connection) -> None:
        try:
            while True:
                batch, waiters, stop = self._take_batch()
                if batch:
                    now = time.time()  # one transaction, one time
                    db.executemany(
                        "INSERT OR REPLACE INTO responses VALUES (?, ?, ?)",
                        [(k, orjson.dumps(r).decode(), now) for k, r in batch],
                    )
                    db.commit()
                    with self._pending_lock:
                        for k, r in batch:
                            if self._pending.get(k) is r:
                                del self._pending[k]
                for waiter in waiters:
                    waiter.set()
                if stop:
                    break
        except BaseException as exc:  # a full disk, say: put raises from now on
            self._error = exc
        finally:
            db.close()

    def _take_batch(self) -> tuple[list[tuple[str, dict[str, Any]]], list[Any], bool]:
        """Rows queued up to ``batch_rows``, waiting at most ``flush_seconds`` after the first."""
        batch: list[tuple[str, dict[str, Any]]] = []
        waiters: list[Any] = []
        first = self._queue.get()
        deadline = time.monotonic() + self.flush_seconds
        item: Any = first
        while True:
            if item is _STOP:
                return batch, waiters, True
            if isinstance(item, threading.Event):
                waiters.append(item)
                return batch, waiters, False  # a flush: commit what came before it now
            batch.append(item)
            if len(batch) >= self.batch_rows:
                return batch, waiters, False
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return batch, waiters, False

    def __len__(self) -> int:
        self.flush()
        with self._reader_lock:
            return self._reader.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        with self._reader_lock:
            self._reader.close()
        if self._error is not None:
            raise RuntimeError(f"the response cache {self.path} stopped writing") from self._error


def _close_at_exit(ref: weakref.ref[ResponseCache]) -> None:
    """A process that ends without closing its cache still commits what it put (not on SIGKILL)."""
    cache = ref()
    if cache is not None:
        with contextlib.suppress(Exception):
            cache.close()
