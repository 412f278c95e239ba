"""What a response cache holds, and trimming it (``groundcover cache``), over every file of its
family (``NAME.sqlite``, each host's ``NAME@HOST.sqlite``) and the damaged files set aside.

Rows are grouped by the model (request name) and revision they were keyed by; rows written before
keys carried revisions form one group of their own. Deleting runs in small transactions, so a run
writing the same file meanwhile waits milliseconds at most, never for the whole pruning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import family
from .content import digest_path

BATCH = 2000  # rows per deleting transaction


@dataclass
class Group:
    model: str | None  # request name (base model or adapter); None: from before revisions
    revision: str | None
    rows: int
    bytes: int
    oldest: float
    newest: float
    names: dict[str, str]  # revision part -> what it is (name @ where), where known
    present: bool | None  # the local model/adapter still has this content (None: cannot tell)


def damaged_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.stem}*{path.suffix}.damaged-*"))


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60)
    db.execute("PRAGMA busy_timeout=60000")
    return db


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(responses)")}


def _known_models(db: sqlite3.Connection) -> dict[str, tuple[str, str | None]]:
    with contextlib.suppress(sqlite3.Error):
        rows = db.execute("SELECT revision, name, source FROM models").fetchall()
        return {r: (n, s) for r, n, s in rows}
    return {}


def _parts(revision: str | None) -> list[str]:
    """The revisions a row's key carries: a base model's, or base and adapter's (``A+B``)."""
    return [p for p in (revision or "").split("+") if p and p != "None"]


def still_present(revision: str, source: str | None) -> bool | None:
    """Whether the local file or directory a revision was read from still has that content;
    None for what this machine cannot check (a hub commit, an endpoint's model)."""
    if not revision.startswith("sha256:") or not source or "://" in source:
        return None
    if not Path(source).exists():
        return False
    with contextlib.suppress(OSError):
        return digest_path(source).sha256 == revision.removeprefix("sha256:")
    return False


def groups(path: Path) -> list[Group]:
    """Every (model, revision) group over the family's files, with sizes and dates."""
    found: dict[tuple[str | None, str | None], Group] = {}
    known: dict[str, tuple[str, str | None]] = {}
    for file in family(path):
        with contextlib.closing(_connect(file)) as db:
            known |= _known_models(db)
            has = "revision" in _columns(db)
            select = "model, revision" if has else "NULL, NULL"
            query = (
                f"SELECT {select}, COUNT(*), SUM(LENGTH(response)), MIN(created), MAX(created) "
                "FROM responses GROUP BY 1, 2"
            )
            for model, revision, rows, size, oldest, newest in db.execute(query):
                key = (model, revision)
                group = found.get(key)
                if group is None:
                    found[key] = Group(model, revision, rows, size or 0, oldest, newest, {}, None)
                else:
                    group.rows += rows
                    group.bytes += size or 0
                    group.oldest, group.newest = (
                        min(group.oldest, oldest),
                        max(group.newest, newest),
                    )
    for group in found.values():
        checks = []
        for part in _parts(group.revision):
            name, source = known.get(part, (None, None))
            if name:
                group.names[part] = f"{name} @ {source}" if source else name
            checks.append(still_present(part, source))
        if checks:
            group.present = False if False in checks else (True if True in checks else None)
    return sorted(found.values(), key=lambda g: (g.model is None, str(g.model), -g.newest))


def files(path: Path) -> list[tuple[Path, int]]:
    """(file, bytes on disk with its WAL) of the family and the damaged files set aside."""
    out = []
    for file in [*family(path), *damaged_files(path)]:
        size = sum(
            os.path.getsize(f"{file}{s}") for s in ("", "-wal") if os.path.exists(f"{file}{s}")
        )
        out.append((file, size))
    return out


def _delete(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> int:
    """Delete matching rows ``BATCH`` at a time: short write transactions only."""
    deleted = 0
    while True:
        cursor = db.execute(
            f"DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses WHERE {where} "
            f"LIMIT {BATCH})",
            args,
        )
        db.commit()
        deleted += cursor.rowcount
        if cursor.rowcount < BATCH:
            return deleted


def _writable(path: Path) -> Iterator[sqlite3.Connection]:
    for file in family(path):
        with contextlib.closing(_connect(file)) as db:
            yield db


def parse_when(text: str) -> float:
    """``YYYY-MM-DD`` or an ISO date-time (local time unless it says otherwise)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--before {text!r}: expected a date, YYYY-MM-DD[THH:MM]") from None
    return when.timestamp()


def prune(path: Path, before: float | None = None, missing: bool = False) -> dict[str, int]:
    """Delete rows created before ``before``, and (``missing``) rows keyed by a local model or
    adapter whose content is gone or changed. Returns rows deleted per reason."""
    out = {"older": 0, "missing": 0}
    gone: list[str] = []
    if missing:
        gone = [g.revision for g in groups(path) if g.present is False and g.revision is not None]
    for db in _writable(path):
        if before is not None:
            out["older"] += _delete(db, "created < ?", (before,))
        if gone and "revision" in _columns(db):
            for revision in gone:
                out["missing"] += _delete(db, "revision = ?", (revision,))
    return out


def clear(path: Path) -> int:
    """Delete every row of every file of the family, and the damaged files set aside."""
    deleted = sum(_delete(db, "1", ()) for db in _writable(path))
    for file in damaged_files(path):
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                os.remove(f"{file}{suffix}")
    return deleted
