"""Records point only inside their run: a path a run's records name (a fact graph's file, a
study's runs) is read only when, its links resolved, it lies inside the run directory (or study
root) being read. A run can be sent by anyone, and its records could otherwise name any file of
the reader's (``~/.ssh/id_ed25519`` embedded in a page they later share); what points elsewhere
is left out, with a note saying so. The run's own files are held to the same rule: a run
directory holding a link that leads out of it (``results.jsonl -> ~/other-run/results.jsonl``)
is not read at all (``refuse_links_out``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ..contract.errors import UserError
from ..terminal import printable
from .run_dir import MANIFEST


def inside_run(run_dir: Path, named: object) -> Path | None:
    """The real path of what a record of ``run_dir`` names (relative to the run, or absolute),
    when, every link on the way resolved, it exists inside the run directory; else None."""
    if not isinstance(named, str) or not named:
        return None
    try:
        root = Path(run_dir).resolve(strict=True)
        real = (Path(run_dir) / named).resolve(strict=True)  # an absolute name stays as it is
    except (OSError, RuntimeError, ValueError):  # gone, a loop of links, a NUL in the name
        return None
    return real if real.is_relative_to(root) else None


def study_runs(root: Path, keys: Iterable[object]) -> dict[str, Path]:
    """The run directories a study root records (``study.json``'s ``runs``) by key, each inside
    the root once its links are resolved; a key that leads elsewhere is left out with a note (a
    key whose run is not there yet, as while a study runs, is left out quietly)."""
    found = {}
    for key in keys:
        if not isinstance(key, str) or not (Path(root) / key / MANIFEST).is_file():
            continue
        if inside_run(root, key) is None:
            note(f"{root}: its study record names a run outside it ({key}): left out")
            continue
        found[key] = Path(root) / key
    return found


def links_out(run_dir: Path) -> list[str]:
    """The links inside ``run_dir`` (at any depth; a linked folder is not entered) that lead out
    of it once resolved, or nowhere: their paths relative to it. One directory listing per
    folder (the entries' types come with it): cheap enough for every read of a manifest."""
    return _unreadable(run_dir)[0]


def _unreadable(run_dir: Path) -> tuple[list[str], list[str]]:
    """What in ``run_dir`` is not read: the links leading out of it, and the entries that are
    neither a regular file, a folder nor a link (a FIFO, a socket, a device: a read of a FIFO
    named ``results.jsonl`` would wait forever), each relative to it, in one walk."""
    root = Path(run_dir).resolve()
    found, special = [], []
    folders = [root]
    while folders:
        try:
            listing = os.scandir(folders.pop())
        except OSError:  # a folder nobody may list: nothing in it is read either
            continue
        with listing as entries:
            for entry in entries:
                if entry.is_symlink():
                    if not _leads_inside(Path(entry.path), root):
                        found.append(Path(entry.path).relative_to(root).as_posix())
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    special.append(Path(entry.path).relative_to(root).as_posix())
    return sorted(found), sorted(special)


def _leads_inside(link: Path, root: Path) -> bool:
    try:
        return link.resolve(strict=True).is_relative_to(root)
    except (OSError, RuntimeError):  # dangling, or a loop of links
        return False


def refuse_links_out(run_dir: Path) -> None:
    """A run directory is read only when no link inside it leads out of it and nothing in it is
    a FIFO, socket or device: one line naming them, otherwise (checked at every read of its
    manifest: a run is never read without)."""
    out, special = _unreadable(run_dir)
    if out:
        raise UserError(
            f"{run_dir}: holds symbolic links leading out of it ({_some(out)}): not read (a run "
            "is read only from inside its directory)"
        )
    if special:
        raise UserError(
            f"{run_dir}: holds entries that are not files ({_some(special)}: a FIFO, socket or "
            "device): not read (a read of one could wait forever)"
        )


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def note(line: str) -> None:
    sys.stderr.write(f"groundcover: {printable(line)}\n")
