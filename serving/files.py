"""One way to write a file: whole or not at all, and never through a link nobody named.

Every writer of reports, exports, label sheets, queues, pages, manifests and caches goes through
``write_atomic`` (or ``atomic_file`` for writers that stream): a temporary file is created
exclusively in the target's folder (``O_CREAT | O_EXCL | O_NOFOLLOW``: a planted ``OUT.tmp`` link
to a file of the reader's is never opened), written, flushed to disk and renamed over the target.
Readers see the old file or the new one, never half of one; a failed write leaves the old file
and removes the temporary one.

Where the target lies in a folder the user did not name (a run directory received from someone
else, say: ``within=RUN``), a target or any folder between ``within`` and the target that is a
symbolic link is refused in one line: a run holding ``labels -> ~/.config`` must not have its
queue written there. A path the user typed themselves is theirs: its folders are followed as
given (a home folder that is a link on a cluster, say).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal, overload

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(ValueError):
    """A write refused because its target or a folder on its way is a link nobody named (or is
    not a regular file / folder): the message is one line naming the path."""


def check_within(target: Path, within: Path) -> None:
    """Refuse ``target`` if it, or any folder from ``within`` (excluded) down to it, is a
    symbolic link or not what it should be. ``within`` itself is the user's (named by them)."""
    target = Path(target)
    root = Path(within)
    try:
        rest = target.relative_to(root)
    except ValueError:
        raise UnsafePath(f"{target}: not inside {root}") from None
    if ".." in rest.parts:
        raise UnsafePath(f"{target}: leaves {root} ('..' in its path)")
    here = root
    for part in rest.parts:
        here = here / part
        try:
            found = os.lstat(here)
        except FileNotFoundError:
            return  # nothing there yet: created as a real file or folder
        if stat.S_ISLNK(found.st_mode):
            raise UnsafePath(f"{here}: a symbolic link; refused (it could send the write anywhere)")
        if here != target and not stat.S_ISDIR(found.st_mode):
            raise UnsafePath(f"{here}: not a folder")
    final = os.lstat(target) if target.exists() or target.is_symlink() else None
    if final is not None and not stat.S_ISREG(final.st_mode):
        raise UnsafePath(f"{target}: not a regular file; refused")


def make_dirs(folder: Path, within: Path | None = None, mode: int = 0o755) -> None:
    """``folder`` and its missing parents, refusing (``check_within``) a link below ``within``."""
    folder = Path(folder)
    if within is not None:
        check_within(folder, within)
    folder.mkdir(parents=True, exist_ok=True, mode=mode)
    if within is not None:
        check_within(folder, within)  # made by someone else meanwhile: looked at again


def _resolve_named(target: Path) -> Path:
    """A path the user typed: a link they named is followed (it is theirs) to where it points."""
    return Path(os.path.realpath(target)) if Path(target).is_symlink() else Path(target)


@overload
def atomic_file(
    target: Path,
    mode: Literal["w"] = "w",
    *,
    within: Path | None = None,
    permissions: int = 0o644,
) -> contextlib.AbstractContextManager[IO[str]]: ...
@overload
def atomic_file(
    target: Path,
    mode: Literal["wb"],
    *,
    within: Path | None = None,
    permissions: int = 0o644,
) -> contextlib.AbstractContextManager[IO[bytes]]: ...
def atomic_file(
    target: Path,
    mode: str = "w",
    *,
    within: Path | None = None,
    permissions: int = 0o644,
) -> contextlib.AbstractContextManager[IO[str]] | contextlib.AbstractContextManager[IO[bytes]]:
    """A file to write ``target`` through (``"w"`` text in UTF-8, ``"wb"`` bytes): it becomes
    ``target`` when the block ends without an exception, and is removed otherwise."""
    return _atomic(Path(target), mode, within, permissions)


@contextlib.contextmanager
def _atomic(target: Path, mode: str, within: Path | None, permissions: int) -> Iterator[IO]:
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file: mode {mode!r} (only 'w' or 'wb')")
    if within is not None:
        check_within(target, within)
    else:
        target = _resolve_named(target)
    folder = target.parent
    tmp = folder / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, _CREATE, permissions)  # the umask applies, as to any new file
    except FileExistsError:  # a 48-bit name taken: someone is guessing; say so, do not retry
        raise UnsafePath(f"{tmp}: exists already; refused") from None
    done = False
    try:
        handle: IO = (
            os.fdopen(fd, "w", encoding="utf-8", newline="") if mode == "w" else os.fdopen(fd, "wb")
        )
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if within is not None:
            check_within(target, within)  # a link planted while we wrote is still refused
        os.replace(tmp, target)
        done = True
        _sync_folder(folder)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_atomic(
    target: Path,
    data: str | bytes,
    *,
    within: Path | None = None,
    permissions: int = 0o644,
) -> None:
    """``data`` (text in UTF-8, or bytes) as ``target``, whole or not at all (``atomic_file``)."""
    if isinstance(data, str):
        with atomic_file(target, "w", within=within, permissions=permissions) as text:
            text.write(data)
    else:
        with atomic_file(target, "wb", within=within, permissions=permissions) as binary:
            binary.write(data)


def _sync_folder(folder: Path) -> None:
    """The rename made durable (best effort: some filesystems refuse a folder's fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
