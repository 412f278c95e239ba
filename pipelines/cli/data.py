"""``groundcover data``: list, describe, fetch, locate and register the catalogued datasets
(``pipelines/datasets``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..datasets.catalog import CATALOG, lookup, parse_spec
from ..datasets.fetch import LOCK, add, cached, data_root, get, read_lock
from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .frameworks import lazy_group
from .options import clean_errors

data_app = typer.Typer(
    cls=lazy_group("data"),
    help="Datasets by name: fetched, pinned (lock file with sha256) and cached under "
    "$GROUNDCOVER_HOME/data.",
    no_args_is_help=True,
)
out = terminal()


@data_app.command("list")
@clean_errors
def data_list() -> None:
    """Every catalogued dataset: home, license, size, and the revision cached here."""
    table = Table("name", "home", "license", "size", "cached")
    lock = read_lock()
    for name, entry in CATALOG.items():
        here = [
            f"{k.rsplit('@', 1)[1]} -> {v['revision']}"
            for k, v in sorted(lock.items())
            if k.rsplit("@", 1)[0] == name
        ]
        table.add_row(name, entry.home, entry.license, entry.size, ", ".join(here) or "-")
    out.print(table)


@data_app.command("info")
@clean_errors
def data_info(name: Annotated[str, typer.Argument(help="dataset name")]) -> None:
    """What a dataset is, where it comes from, what reads it, and its lock entries."""
    entry = lookup(parse_spec(name)[0])
    rows = [
        ("name", entry.name),
        ("about", entry.summary),
        ("home", entry.home),
        ("revision", entry.revision),
        ("files", ", ".join(entry.files) or "-"),
        ("license", entry.license),
        ("size", entry.size),
        ("used by", entry.used_by),
    ]
    if entry.obtain:
        rows.append(("how to obtain", entry.obtain))
    for key, value in sorted(read_lock().items()):
        if key.rsplit("@", 1)[0] == entry.name:
            rows.append((f"locked {key}", f"revision {value['revision']}"))
    table = Table("field", "value", show_header=False)
    for field, value in rows:
        table.add_row(field, value)
    out.print(table)


@data_app.command("get")
@clean_errors
def data_get(
    spec: Annotated[str, typer.Argument(help="NAME or NAME@REVISION (a branch, tag or commit)")],
) -> None:
    """Download (resumable), verify against the lock, convert and cache; print the path."""
    found = get(spec)
    out.print(
        f"{found.name}@{found.revision}: {found.path} (sha256 {found.sha256[:16]})",
        highlight=False,
        soft_wrap=True,
    )


@data_app.command("path")
@clean_errors
def data_path(name: Annotated[str, typer.Argument(help="dataset name")]) -> None:
    """The cached file a --data NAME stands for (nothing is downloaded)."""
    found = cached(parse_spec(name)[0])
    if found is None:
        raise UserError(f"dataset {name} is not cached: run `groundcover data get {name}`")
    print(found.path)


@data_app.command("add")
@clean_errors
def data_add(
    name: Annotated[str, typer.Argument(help="dataset name (e.g. clueweb09-b)")],
    path: Annotated[Path, typer.Argument(help="your local copy")],
) -> None:
    """Register a local copy (licensed corpora) after checking its shape."""
    found = add(name, path)
    out.print(f"{found.name}: registered {found.path} in {data_root() / LOCK}", highlight=False)
