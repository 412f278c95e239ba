"""Catalogue names where a command takes a data file: a path that exists is a file; otherwise a
name (``NAME`` or ``NAME@REVISION``) is fetched and stands for its main file."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from ..runtime.contract.errors import UserError
from .catalog import is_name, parse_spec, split_spec
from .fetch import cached, get, provenance

M = TypeVar("M", bound=BaseModel)


def resolve_names(options: M) -> M:
    """``options`` with every path field that names a dataset (and is no file) resolved, nested
    option groups included (a reproduce command's framework options)."""
    update: dict[str, Any] = {}
    for field, value in options:
        if isinstance(value, BaseModel):
            if (resolved := resolve_names(value)) is not value:
                update[field] = resolved
        elif isinstance(value, Path) and not value.exists() and is_name(str(value)):
            update[field] = dataset_file(str(value))
    return options.model_copy(update=update) if update else options


# set by `groundcover cluster` while it lists what a command reads: a name is recorded, and
# stands for its cached file where it is cached (else for itself), never fetched
LISTED: ContextVar[list[str] | None] = ContextVar("LISTED", default=None)


def dataset_file(spec: str) -> Path:
    """NAME[@REVISION] -> its main file; NAME[@REVISION]/FILE -> that file of it."""
    dataset, wanted = split_spec(spec)
    listed = LISTED.get()
    if listed is not None:
        listed.append(dataset)
        found_here = cached(parse_spec(dataset)[0])
        return found_here.path if found_here is not None and wanted is None else Path(spec)
    found = get(dataset)
    if wanted is None:
        return found.path
    path = found.path.parent / wanted
    if not path.is_file():
        have = ", ".join(sorted(p.name for p in found.path.parent.iterdir()))
        raise UserError(f"dataset {found.name} has no file {wanted!r}; it has: {have}")
    return path


def data_provenance(options: object) -> list[dict[str, str]]:
    """For the manifest: which catalogued dataset (name, revision, sha256) each input is."""
    if not isinstance(options, BaseModel):
        return []
    return provenance([value for _, value in options if isinstance(value, Path)])
