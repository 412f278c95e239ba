"""``groundcover trust``: the framework files this machine's user trusts to read runs with
(``runtime.contract.trust``): add one, list them, revoke one. Nothing a run holds adds one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import clean_errors


@clean_errors
def trust(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="framework files to trust (their SHA-256 now, at this path)"),
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the trusted files")] = False,
    revoke: Annotated[
        list[str] | None,
        typer.Option(
            metavar="FILE|SHA256",
            help="take a file (the path it was trusted at) or a full SHA-256 off the list",
        ),
    ] = None,
) -> None:
    """Trust framework files to read runs with: `report`, `view`, `compare`, `agreement`, the
    exports and `labels` then load a run's framework file when its SHA-256 is one you trusted,
    from the path you trusted it at (never the path the run names). `groundcover eval FILE.py`
    trusts the file it runs. Trusting a file does not run it. With no argument: the list."""
    from ..runtime.contract.plugins import read_source, sha256_of
    from ..runtime.contract.trust import add_trusted
    from ..runtime.contract.trust import revoke as take_off

    out = terminal()
    for given in revoke or ():
        for entry in take_off(given):
            out.print(f"revoked: {entry.sha256}  {entry.path}", highlight=False, soft_wrap=True)
    for file in files or ():
        path = file.resolve()
        try:
            digest = sha256_of(read_source(path))
        except OSError as exc:
            raise UserError(f"{file}: not read: {exc.strerror or exc}") from None
        entry = add_trusted(path, digest)
        out.print(f"trusted: {entry.sha256}  {entry.path}", highlight=False, soft_wrap=True)
    if list_ or not (files or revoke):
        show_list()


def show_list() -> None:
    """One line per trusted file: its SHA-256, when, where, and whether the file there still
    has that SHA-256 (a changed or removed file is not loaded)."""
    from ..runtime.contract.plugins import read_source, sha256_of
    from ..runtime.contract.trust import trust_list, trusted

    out = terminal()
    entries = trusted()
    if not entries:
        out.print(f"no trusted framework files ({trust_list()})", highlight=False, soft_wrap=True)
        return
    for entry in entries:
        try:
            now = "" if sha256_of(read_source(Path(entry.path))) == entry.sha256 else "  (changed)"
        except OSError:
            now = "  (gone)"
        out.print(
            f"{entry.sha256}  {entry.when}  {entry.path}{now}", highlight=False, soft_wrap=True
        )
