"""A persistent, content-addressed response cache shared by every pipeline.

Keys are SHA-256 digests of a canonical JSON of everything that determines a model's answer
(model and adapter by name *and* by revision, messages, sampling parameters, tools, output
constraints, prompt-template id), so a rerun of the same command is answered from disk and costs
no model calls, and a retrained adapter or a replaced model is never answered from before.

Off the request path: ``put`` hands the row to one writer thread, which commits what has queued
up in one transaction (at least every ``flush_seconds``), so no answer waits for a commit;
``get`` reads its own connection after the rows not yet written. A process killed outright loses
at most the rows of the last ``flush_seconds``: cache rows, never run records (the run store
writes those itself), and a resumed run asks again for exactly those answers.

The cache is derived data, so it fails safe:

- a damaged file (``database disk image is malformed``, not a database) is moved aside with one
  line (``NAME.damaged-<time>``) and a fresh one takes its place, at open or mid-run;
- a write that fails otherwise (a full disk) turns caching off for the rest of the process with
  one line; the run goes on and its records are written by the run store as before;
- several hosts: on a network file system (where SQLite's WAL does not work) or when told
  (``shared``, as ``--drivers`` on a cluster does), each host writes its own file
  ``NAME@HOST.sqlite`` beside ``NAME.sqlite`` (rollback journal on a network file system) and
  reads every file of the family, read-only, for answers (a plain run reads the hosts' files
  that exist when it opens, so a run after a drivers' run is answered from them too).

A file written before keys carried revisions still answers: a row from before (``legacy``) is
served for a model whose revision is the one first seen with it (``bindings``); a model whose
revision changed since is asked again. The same holds for rows keyed before an endpoint that
nothing identifies was known by its URL (schema 3): such a row (keyed with no revision, or with
the revision the endpoint's listing alone gave) is served to the first endpoint that asks for
it, and only to that one, so two servers sharing one model name never share answers.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import queue
import random
import socket
import sqlite3
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import orjson

from .content import on_network_filesystem
from .redact import clipped

# 2: keys carry revisions; rows carry their model and revision. 3: an endpoint nothing
# identifies is keyed by its URL too (rows keyed before that are legacy, bound on first use)
SCHEMA = "3"
RESCAN_SECONDS = 30.0  # how often a miss looks for other hosts' new files


def cache_key(payload: dict[str, Any]) -> str:
    # json, not orjson: keys written by earlier versions must keep matching (float spellings)
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def host_id() -> str:
    """This host's name in a shared cache's file names (``GROUNDCOVER_HOST_ID`` overrides)."""
    raw = os.environ.get("GROUNDCOVER_HOST_ID") or socket.gethostname() or "host"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)[:64]


def family(path: Path) -> list[Path]:
    """A cache's files: ``NAME.sqlite`` and every host's ``NAME@HOST.sqlite``."""
    found = sorted(path.parent.glob(f"{path.stem}@*{path.suffix}"))
    return ([path] if path.is_file() else []) + found


def is_damage(exc: BaseException) -> bool:
    """An error that says the file itself is damaged (not busy, not full)."""
    text = str(exc).lower()
    damaged = ("malformed", "not a database", "corrupt")
    return isinstance(exc, sqlite3.DatabaseError) and any(word in text for word in damaged)


_STOP = object()


class ResponseCache:
    def __init__(
        self,
        path: Path | str,
        flush_seconds: float = 0.25,
        batch_rows: int = 512,
        shared: bool | None = None,
    ):
        self.path = Path(path)  # the family's name (NAME.sqlite)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        network = on_network_filesystem(self.path.parent)
        self.shared = network if shared is None else shared or network
        self.wal = not network
        self.own = (
            self.path.with_name(f"{self.path.stem}@{host_id()}{self.path.suffix}")
            if self.shared
            else self.path
        )
        self.flush_seconds, self.batch_rows = flush_seconds, batch_rows
        self.notes: list[str] = []
        self._lock = threading.RLock()  # the reader connections and a file's replacement
        self._generation = 0  # bumped when the own file is replaced: the writer reconnects
        self._reader, self.legacy_before = self._open_own()
        # other hosts' files, read-only (None: left out), and whether their rows carry revisions
        self._others: dict[Path, sqlite3.Connection | None] = {}
        self._revisioned: dict[Path, bool] = {}
        # per other file: rows keyed without a revision count as legacy when created before this
        # (None: all of them, the file was last written before schema 3)
        self._marks: dict[Path, float | None] = {}
        self._scanned = 0.0
        self._scan_others()
        self._pending: dict[str, dict[str, Any]] = {}  # put, not yet committed
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writing = True  # False once a write failed for good: answers are not kept
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="cache-writer", daemon=True)
        self._writer.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- files -----------------------------------------------------------------------------

    def _connect(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, timeout=60)
        _journal(db, "wal" if self.wal else "delete")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS responses "
            "(key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL NOT NULL, "
            "model TEXT, revision TEXT)"
        )
        columns = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
        for column in ("model", "revision"):  # a file from before: rows keep NULL there
            if column not in columns:
                db.execute(f"ALTER TABLE responses ADD COLUMN {column} TEXT")
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS bindings "
            "(name TEXT PRIMARY KEY, revision TEXT NOT NULL, bound REAL NOT NULL)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS models (revision TEXT PRIMARY KEY, name TEXT, "
            "source TEXT, seen REAL)"
        )
        db.commit()
        return db

    def _open_own(self) -> tuple[sqlite3.Connection, float | None]:
        """The file this process writes (and when its rows keyed without revisions end),
        moved aside and made anew when it is damaged."""
        for attempt in (1, 2):
            try:
                db = self._connect(self.own)
                return db, self._legacy_mark(db)
            except sqlite3.DatabaseError as exc:
                if attempt == 2 or not is_damage(exc):
                    raise
                self._move_aside(exc)
        raise AssertionError("unreachable")

    def _move_aside(self, exc: BaseException) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.own.with_name(f"{self.own.name}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm", "-journal"):
            part = Path(f"{self.own}{suffix}")
            with contextlib.suppress(OSError):
                if part.exists():
                    os.replace(part, Path(f"{target}{suffix}"))
        self._note(
            f"the response cache {self.own} is damaged ({clipped(str(exc), 80)}): "
            f"moved aside to {target.name}; answers will be asked again"
        )

    def _note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", file=sys.stderr)

    def _legacy_mark(self, db: sqlite3.Connection) -> float | None:
        """Rows created before this time and keyed without a revision were keyed by the rules
        before this schema (None: none were). Moving to this schema sets the mark to now when
        the file holds such rows."""
        with self._lock:
            found = dict(db.execute("SELECT name, value FROM meta").fetchall())
            stored = found.get("legacy_before")
            mark = float(stored) if stored else None
            if found.get("schema") == SCHEMA:
                return mark
            unkeyed = "SELECT 1 FROM responses WHERE revision IS NULL LIMIT 1"
            if db.execute(unkeyed).fetchone() is not None:
                mark = time.time()
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('legacy_before', ?), ('schema', ?)",
                ("" if mark is None else repr(mark), SCHEMA),
            )
            db.commit()
        return mark

    def _scan_others(self) -> None:
        """Other hosts' files of the family (and the plain file, read-only in shared mode)."""
        self._scanned = time.monotonic()
        for path in family(self.path):
            if path == self.own or path in self._others:
                continue
            try:
                db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
                db.execute("SELECT 1 FROM responses LIMIT 1").fetchall()
                self._revisioned[path] = _has_revision(db)
                self._marks[path] = _mark_of(db)
                self._others[path] = db
            except sqlite3.DatabaseError as exc:
                self._others[path] = None
                self._note(f"the response cache {path} is not readable ({exc}): left out")

    # ---- reading ---------------------------------------------------------------------------

    def get(self, key: str) -> dict[str, Any] | None:
        with self._pending_lock:
            found = self._pending.get(key)
        if found is not None:
            return found
        raw = self._own_row(key)
        if raw is None and (self.shared or self._others):  # rows other hosts (drivers) wrote
            raw = self._other_row(key)
        return _decoded(raw)

    def _own_row(self, key: str) -> str | None:
        with self._lock:
            try:
                row = self._reader.execute(
                    "SELECT response FROM responses WHERE key=?", (key,)
                ).fetchone()
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                self._replace_own(exc)
                return None
        return row[0] if row else None

    def _other_row(self, key: str) -> str | None:
        if self.shared and time.monotonic() - self._scanned > RESCAN_SECONDS:
            with self._lock:
                self._scan_others()
        with self._lock:
            for path, db in self._others.items():
                if db is None:
                    continue
                try:
                    row = db.execute(
                        "SELECT response FROM responses WHERE key=?", (key,)
                    ).fetchone()
                except sqlite3.DatabaseError as exc:  # another host's file: left out
                    self._others[path] = None
                    self._note(f"the response cache {path} is not readable ({exc}): left out")
                    continue
                if row:
                    return row[0]
        return None

    def legacy(
        self, key: str, name: str, revision: str, keyed_with: str | None = None
    ) -> dict[str, Any] | None:
        """A row keyed by the rules before (``key``: with no revision, or with ``keyed_with``,
        the revision those rules gave), served only while ``name`` (base and model, and the
        revision before) has the revision first seen with such rows here."""
        if keyed_with is None and self.legacy_before is None and not self._others:
            return None
        if keyed_with is not None:
            name = f"{name}\0{keyed_with}"
        with self._lock:
            try:
                bound = self._reader.execute(
                    "SELECT revision FROM bindings WHERE name=?", (name,)
                ).fetchone()
                if bound is not None and bound[0] != revision:
                    return None
                raw = self._legacy_row(key) if keyed_with is None else self._keyed_row(key)
                if raw is not None and bound is None:
                    self._reader.execute(
                        "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)",
                        (name, revision, time.time()),
                    )
                    self._reader.commit()
            except sqlite3.DatabaseError as exc:
                if not is_damage(exc):
                    raise
                self._replace_own(exc)
                return None
        return _decoded(raw)

    def _keyed_row(self, key: str) -> str | None:
        """A row under ``key`` in any file of the family (a held lock)."""
        row = self._reader.execute("SELECT response FROM responses WHERE key=?", (key,)).fetchone()
        if row:
            return row[0]
        for db in self._others.values():
            if db is None:
                continue
            with contextlib.suppress(sqlite3.DatabaseError):
                row = db.execute("SELECT response FROM responses WHERE key=?", (key,)).fetchone()
                if row:
                    return row[0]
        return None

    def _legacy_row(self, key: str) -> str | None:
        if self.legacy_before is not None:
            row = self._reader.execute(
                "SELECT response FROM responses WHERE key=? AND created < ? AND revision IS NULL",
                (key, self.legacy_before),
            ).fetchone()
            if row:
                return row[0]
        for path, db in self._others.items():  # other files' rows without a revision
            if db is None:
                continue
            query = "SELECT response FROM responses WHERE key=?"
            args: list[Any] = [key]
            mark = self._marks.get(path)
            if self._revisioned[path]:
                query += " AND revision IS NULL"
                if mark is not None:
                    query += " AND created < ?"
                    args.append(mark)
            with contextlib.suppress(sqlite3.DatabaseError):
                row = db.execute(query, args).fetchone()
                if row:
                    return row[0]
        return None

    def _replace_own(self, exc: BaseException) -> None:
        """The own file turned out damaged mid-run: aside, and a fresh one (held lock)."""
        with contextlib.suppress(sqlite3.Error):
            self._reader.close()
        if self.own.exists():
            self._move_aside(exc)
        self._reader, self.legacy_before = self._open_own()
        self._generation += 1

    # ---- writing ---------------------------------------------------------------------------

    def put(
        self,
        key: str,
        response: dict[str, Any],
        model: str | None = None,
        revision: str | None = None,
    ) -> None:
        if self._closed:
            raise RuntimeError(f"the response cache {self.path} is closed")
        with self._pending_lock:
            self._pending[key] = response
        if self._writing:
            self._queue.put((key, response, model, revision))

    def remember_model(self, revision: str, name: str, source: str | None) -> None:
        """What a revision is (a model or adapter name, where it was found): ``cache list``
        shows it, ``cache prune --missing`` checks it."""
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._reader.execute(
                "INSERT OR REPLACE INTO models VALUES (?, ?, ?, ?)",
                (revision, name, source, time.time()),
            )
            self._reader.commit()

    def flush(self) -> None:
        """Wait until every row put so far is committed (or given up on)."""
        if self._closed:
            return  # close() committed them
        done = threading.Event()
        self._queue.put(done)
        while not done.wait(0.5):
            if not self._writer.is_alive():
                break

    def _write_loop(self) -> None:
        db, generation = None, -1
        try:
            while True:
                batch, waiters, stop = self._take_batch()
                if batch and self._writing:
                    if generation != self._generation and db is not None:
                        with contextlib.suppress(sqlite3.Error):
                            db.close()
                        db = None
                    generation = self._generation
                    db = self._commit(db, batch, generation)
                with self._pending_lock:
                    for k, r, _, _ in batch:
                        if self._writing and self._pending.get(k) is r:
                            del self._pending[k]
                for waiter in waiters:
                    waiter.set()
                if stop:
                    break
        finally:
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()

    def _commit(
        self, db: sqlite3.Connection | None, batch: list[tuple], generation: int
    ) -> sqlite3.Connection | None:
        now = time.time()  # one transaction, one time
        rows = [(k, orjson.dumps(r).decode(), now, m, v) for k, r, m, v in batch]
        for attempt in (1, 2):
            try:
                db = db or self._connect(self.own)
                db.executemany("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)", rows)
                db.commit()
                return db
            except sqlite3.DatabaseError as exc:
                if attempt == 1 and is_damage(exc):
                    with self._lock:
                        if db is not None:
                            with contextlib.suppress(sqlite3.Error):
                                db.close()
                        if self._generation == generation:  # not replaced by a reader yet
                            self._replace_own(exc)
                        generation = self._generation
                    db = None
                    continue
                self._writing = False  # a full disk, say: the run goes on without caching
                self._note(
                    f"the response cache {self.own} stopped taking answers "
                    f"({clipped(str(exc), 80)}); the run goes on without it"
                )
                return db
        return db

    def _take_batch(self) -> tuple[list[tuple], list[Any], bool]:
        """Rows queued up to ``batch_rows``, waiting at most ``flush_seconds`` after the first."""
        batch: list[tuple] = []
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
        with self._lock:
            return self._reader.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._reader.close()
            for db in self._others.values():
                if db is not None:
                    with contextlib.suppress(sqlite3.Error):
                        db.close()


def _journal(db: sqlite3.Connection, mode: str, patience: float = 60.0) -> None:
    """Set the file's journal mode unless it has it. Changing it takes the file whole, and
    SQLite's busy timeout does not wait for that: processes opening one new file together (a
    run's drivers) take turns here instead of failing with 'database is locked'."""
    deadline = time.monotonic() + patience
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != mode:
                db.execute(f"PRAGMA journal_mode={mode}")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02 + 0.05 * random.random())


def _mark_of(db: sqlite3.Connection) -> float | None:
    """Another host's file: before when its rows keyed without a revision are legacy (None:
    all of them, as the file was last written under an older schema)."""
    try:
        found = dict(db.execute("SELECT name, value FROM meta").fetchall())
    except sqlite3.DatabaseError:
        return None
    if found.get("schema") != SCHEMA:
        return None
    return float(found["legacy_before"]) if found.get("legacy_before") else 0.0


def _has_revision(db: sqlite3.Connection) -> bool:
    return any(row[1] == "revision" for row in db.execute("PRAGMA table_info(responses)"))


def _decoded(raw: str | None) -> dict[str, Any] | None:
    """A stored answer, or None when the row is unreadable (a damaged page's bytes): a miss is
    asked again, a garbled answer would be scored."""
    if raw is None:
        return None
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _close_at_exit(ref: weakref.ref[ResponseCache]) -> None:
    """A process that ends without closing its cache still commits what it put (not on SIGKILL)."""
    cache = ref()
    if cache is not None:
        with contextlib.suppress(Exception):
            cache.close()
