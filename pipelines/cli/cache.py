"""``groundcover cache``: what the response cache holds by model and adapter (revision), and
trimming it. A run never waits on these: rows go in small transactions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..runtime.terminal import terminal
from .frameworks import lazy_group
from .options import clean_errors

cache_app = typer.Typer(
    cls=lazy_group("cache"),
    help="The response cache: list it by model and adapter revision, prune it, clear it.",
    no_args_is_help=True,
)
CacheFile = Annotated[
    Path | None,
    typer.Option("--cache", help="the cache (default: $GROUNDCOVER_HOME/responses.sqlite)"),
]


def _path(given: Path | None) -> Path:
    from ...serving.launch.embedded import cache_root

    return given or cache_root() / "responses.sqlite"


def _day(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d")


@cache_app.command("list")
@clean_errors
def cache_list(
    cache: CacheFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Entries and size per model and revision (an adapter's with its base model's), whether
    the local model or adapter still has that content, and the cache's files."""
    import dataclasses
    import json

    from ...serving.cache_admin import files, groups

    path = _path(cache)
    found, on_disk = groups(path), files(path)
    if as_json:
        payload = {
            "groups": [dataclasses.asdict(g) for g in found],
            "files": {str(f): size for f, size in on_disk},
            "entries": sum(g.rows for g in found),
        }
        print(json.dumps(payload))
        return
    out = terminal()
    table = Table("model", "revision", "entries", "MB", "oldest", "newest", "present")
    for g in found:
        revision = " + ".join(p.removeprefix("sha256:")[:12] for p in (g.revision or "").split("+"))
        present = {True: "yes", False: "no", None: "-"}[g.present]
        table.add_row(
            g.model or "(keyed before revisions)",
            revision or "-",
            f"{g.rows:,}",
            f"{g.bytes / 1e6:,.1f}",
            _day(g.oldest),
            _day(g.newest),
            present,
        )
    out.print(table)
    for file, size in on_disk:
        out.print(f"{file}: {size / 1e6:,.1f} MB on disk", highlight=False, soft_wrap=True)
    out.print(
        f"{sum(g.rows for g in found):,} entries (present: no = the local model or "
        "adapter changed or is gone; prune --missing deletes those)"
    )


@cache_app.command("prune")
@clean_errors
def cache_prune(
    before: Annotated[
        str | None, typer.Option(help="delete entries created before this date (YYYY-MM-DD)")
    ] = None,
    missing: Annotated[
        bool,
        typer.Option(
            "--missing", help="delete entries of local models and adapters changed or gone"
        ),
    ] = False,
    cache: CacheFile = None,
) -> None:
    """Delete entries older than a date, or of models and adapters no longer present."""
    from ...serving.cache_admin import parse_when, prune
    from ..runtime.contract.errors import UserError

    if before is None and not missing:
        raise UserError("cache prune: give --before DATE, --missing, or both")
    try:
        when = parse_when(before) if before else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    done = prune(_path(cache), when, missing)
    terminal().print(f"deleted {done['older']:,} older and {done['missing']:,} of missing models")


@cache_app.command("clear")
@clean_errors
def cache_clear(
    yes: Annotated[bool, typer.Option("--yes", help="do it (nothing is asked)")] = False,
    cache: CacheFile = None,
) -> None:
    """Delete every entry (every host's file) and the damaged files set aside."""
    from ...serving.cache_admin import clear
    from ..runtime.contract.errors import UserError

    if not yes:
        raise UserError("cache clear deletes every cached answer: add --yes")
    terminal().print(f"deleted {clear(_path(cache)):,} entries")
