"""One way to write a file: whole or not at all, and never through a link nobody named.

Every writer of reports, exports, label sheets, queues, pages, manifests and caches goes through
``write_atomic`` (or ``atomic_file`` for writers that stream): a temporary file is created
exclusively in the target's folder (``O_CREAT | O_EXCL | O_NOFOLLOW``: a planted ``OUT.tmp`` link
to a file of the reader's is never opened), written, flushed to disk and renamed over the target.
Readers see the old file or the new one, never half of one; a failed write leaves the old file
and removes the temporary one. Appends (``open_unlinked``) open the file the same way, never
through a link.

Where the target lies in a folder the user did not name (a run directory received from someone
else, say: ``within=RUN``), a target or any folder between ``within`` and the target that is a
symbolic link is refused in one line: a run holding ``labels -> ~/.config`` must not have its
queue written there. The folders are opened one by one from ``within`` without following a link
and the file is created and renamed relative to the last one opened, so a link swapped in after
the check cannot redirect the write. A path the user typed themselves is theirs: its folders are
followed as given (a home folder that is a link on a cluster, say).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal, overload

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


class UnsafePath(ValueError):
    """A write refused because its target or a folder on its way is a link nobody named (or is
    not a regular file / folder): the message is one line naming the path."""


class NoFolder(UnsafePath):
    """A write refused because the folder it goes in is not there (or is not a folder)."""


def _parts_below(target: Path, root: Path) -> tuple[str, ...]:
    try:
        rest = Path(target).relative_to(root)
    except ValueError:
        raise UnsafePath(f"{target}: not inside {root}") from None
    if ".." in rest.parts:
        raise UnsafePath(f"{target}: leaves {root} ('..' in its path)")
    return rest.parts


def _refusal(path: Path, folder: bool) -> UnsafePath:
    """Why ``path`` may not be written through (it is a link, or not a folder / regular file)."""
    try:
        found = os.lstat(path)
    except OSError:
        return UnsafePath(f"{path}: changed while it was written; refused")
    if stat.S_ISLNK(found.st_mode):
        return UnsafePath(f"{path}: a symbolic link; refused (it could send the write anywhere)")
    if folder:
        return UnsafePath(f"{path}: not a folder")
    return UnsafePath(f"{path}: not a regular file; refused")


def check_within(target: Path, within: Path) -> None:
    """Refuse ``target`` if it, or any folder from ``within`` (excluded) down to it, is a
    symbolic link or not what it should be. ``within`` itself is the user's (named by them)."""
    target, root = Path(target), Path(within)
    here = root
    for part in _parts_below(target, root):
        here = here / part
        try:
            found = os.lstat(here)
        except FileNotFoundError:
            return  # nothing there yet: created as a real file or folder
        if stat.S_ISLNK(found.st_mode):
            raise _refusal(here, folder=here != target)
        if here != target and not stat.S_ISDIR(found.st_mode):
            raise UnsafePath(f"{here}: not a folder")
        if here == target and not stat.S_ISREG(found.st_mode):
            raise UnsafePath(f"{target}: not a regular file; refused")


def _open_folder(folder: Path, within: Path | None, create: bool = False, mode: int = 0o755) -> int:
    """A descriptor of ``folder``: below ``within`` each folder opened without following a link
    (made first where ``create``); without ``within``, the path as the user typed it."""
    if within is None:
        if create:
            Path(folder).mkdir(parents=True, exist_ok=True, mode=mode)
        return os.open(folder, _FOLDER)
    if create:  # ``within`` is the user's (or ours): made as typed, as a folder outside it would be
        Path(within).mkdir(parents=True, exist_ok=True, mode=mode)
    fd = os.open(within, _FOLDER)
    here = Path(within)
    try:
        for part in _parts_below(folder, Path(within)):
            here = here / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
            try:
                inner = os.open(part, _FOLDER | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(here, folder=True) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(folder: Path, within: Path | None = None, mode: int = 0o755) -> None:
    """``folder`` and its missing parents, refusing (``check_within``) a link below ``within``."""
    os.close(_open_folder(Path(folder), within, create=True, mode=mode))


def _resolve_named(target: Path) -> Path:
    """A path the user typed: a link they named is followed (it is theirs) to where it points."""
    return Path(os.path.realpath(target)) if Path(target).is_symlink() else Path(target)


def _check_name(folder_fd: int, target: Path) -> None:
    """The target's own name in its folder: absent, or a regular file (never a link)."""
    try:
        found = os.stat(target.name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(found.st_mode):
        raise _refusal(target, folder=False)


def open_unlinked(path: Path, flags: int, *, within: Path, permissions: int = 0o644) -> int:
    """A descriptor of ``path`` opened with ``flags`` (an append: ``O_WRONLY | O_APPEND |
    O_CREAT``; a read: ``O_RDONLY``) without following a link at it or at any folder between
    ``within`` and it: a label file or a results file a sender linked to one of the reader's
    files is refused, never appended to, truncated or read."""
    path = Path(path)
    folder = _open_folder(path.parent, within)
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW | _CLOEXEC, permissions, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: FreeBSD's word for it
            raise _refusal(path, folder=False) from None
        raise
    finally:
        os.close(folder)


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
    if within is None:
        target = _resolve_named(target)
    else:
        _parts_below(target, Path(within))  # '..' or outside: refused before anything opens
    try:
        folder = _open_folder(target.parent, within)
    except (FileNotFoundError, NotADirectoryError):
        raise NoFolder(f"{target}: no folder {target.parent} to write it in") from None
    try:
        if within is not None:
            _check_name(folder, target)
        yield from _written(folder, target, mode, within, permissions)
    finally:
        os.close(folder)


def _written(
    folder: int, target: Path, mode: str, within: Path | None, permissions: int
) -> Iterator[IO]:
    """The temporary file in ``folder`` (a descriptor), renamed over ``target``'s name there."""
    tmp = f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, _CREATE, permissions, dir_fd=folder)  # the umask applies
    except FileExistsError:  # a 48-bit name taken: someone is guessing; say so, do not retry
        raise UnsafePath(f"{target.parent / tmp}: exists already; refused") from None
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
            _check_name(folder, target)  # a link planted while we wrote is still refused
        os.replace(tmp, target.name, src_dir_fd=folder, dst_dir_fd=folder)
        done = True
        with contextlib.suppress(OSError):  # the rename made durable (some filesystems refuse)
            os.fsync(folder)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)


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
