"""Records point only inside their run: a path a run's records name (a fact graph's file, a
study's runs) is read only when, its links resolved, it lies inside the run directory (or study
root) being read. A run can be sent by anyone, and its records could otherwise name any file of
the reader's (``~/.ssh/id_ed25519`` embedded in a page they later share); what points elsewhere
is left out, with a note saying so."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

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


def note(line: str) -> None:
    sys.stderr.write(f"groundcover: {printable(line)}\n")
