"""Records of a JSONL file read when they are used, found by byte offset.

A 100,000-item run keeps one integer per item and record here instead of the parsed objects:
items are validated once up front (every error still stops the run before anything is written)
and parsed again when a worker takes them; results are read back when a table is computed.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar, overload

T = TypeVar("T")


class FileChanged(RuntimeError):
    pass


def stamp(path: Path) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns


class JsonlView(Sequence[T]):
    """The lines of ``path`` that start at ``offsets``, each parsed by ``parse(position,
    line)`` on access. Given the file's ``stamp`` as it was validated (the items file), a file
    that changed since is refused rather than read as something else."""

    def __init__(
        self,
        path: Path,
        offsets: array,
        parse: Callable[[int, bytes], T],
        *,
        positions: array | None = None,
        stamp: tuple[int, int] | None = None,
        ids: list[str] | None = None,
    ):
        self.path = Path(path)
        self.offsets = offsets
        self.positions = positions if positions is not None else array("q", range(len(offsets)))
        self.parse = parse
        self.stamp = stamp
        self.ids = ids  # their ids, when the reader knows them
        self.digest: str | None = None  # of exactly these records, when the reader knows it

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> JsonlView[T]: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.take(range(len(self))[index])
        with open(self.path, "rb") as handle:
            return self._read(handle, index)

    def __iter__(self) -> Iterator[T]:
        if not self.offsets:  # nothing recorded yet: the file may not exist
            return
        with open(self.path, "rb") as handle:
            for k in range(len(self.offsets)):
                yield self._read(handle, k)

    def take(self, indices: Sequence[int]) -> JsonlView[T]:
        """The records at ``indices`` (in that order), still read on access."""
        return JsonlView(
            self.path,
            array("q", (self.offsets[k] for k in indices)),
            self.parse,
            positions=array("q", (self.positions[k] for k in indices)),
            stamp=self.stamp,
            ids=None if self.ids is None else [self.ids[k] for k in indices],
        )

    def _read(self, handle, k: int) -> T:
        self._check()  # per record: a run takes items over hours
        handle.seek(self.offsets[k])
        return self.parse(self.positions[k], handle.readline())

    def _check(self) -> None:
        if self.stamp is not None and stamp(self.path) != self.stamp:
            raise FileChanged(
                f"{self.path}: changed while the run was reading it (what finished is saved; "
                "restore the file to resume, or start a new --run-dir)"
            )


def item_ids(items: Sequence) -> list[str]:
    """Every item's id, without parsing items a reader keeps on disk."""
    known = getattr(items, "ids", None)
    return list(known) if known is not None else [str(i.id) for i in items]


def select(items: Sequence, indices: list[int]) -> Sequence:
    """The items at ``indices``; a file-backed view stays one (items parsed when taken)."""
    if isinstance(items, JsonlView):
        return items.take(indices)
    return [items[k] for k in indices]
