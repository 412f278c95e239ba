"""Frameworks and studies by name, and the commands they bring, found by entry points.

Every framework registers in the ``groundcover.frameworks`` entry-point group, the built-ins
exactly as a user's package does (``docs/write-a-framework.md``). An entry point names either

- a light *plugin module* with ``STUDIES`` (``"module:NAME"`` references) and ``COMMANDS``
  (``pipelines.runtime.contract.commands.Command``): its commands are listed without importing the
  framework, which is imported when a command runs; or
- a ``Study`` object (``"my_metric:METRIC"``): one file is a framework, its command is
  ``eval NAME`` with a flag for each of its options' fields (``default_command``).

A plugin that fails to import is one warning line naming it, and the others load.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .commands import Command, Flag, load_object

if TYPE_CHECKING:  # the protocol module loads pydantic and the client: not for --help
    from .protocol import Framework, Study

GROUP = "groundcover.frameworks"
BUILT_IN = "groundcover"  # the distribution whose plugins come first and win a name


@dataclass(frozen=True)
class Plugin:
    """One entry point, loaded: where it comes from, its studies and its commands."""

    name: str
    value: str  # "module" or "module:OBJECT"
    distribution: str
    studies: tuple[str, ...]  # "module:NAME" of each Study
    commands: tuple[Command, ...]


def _distribution(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return str(dist.metadata["Name"]) if dist is not None else ""


def _ordered(points: list[EntryPoint]) -> list[EntryPoint]:
    """Built-ins first, then by distribution and name: listings do not depend on install order."""
    return sorted(points, key=lambda p: (_distribution(p) != BUILT_IN, _distribution(p), p.name))


def _warn(point: EntryPoint, why: str) -> None:
    where = f" (from {_distribution(point)})" if _distribution(point) else ""
    sys.stderr.write(
        f"groundcover: warning: framework plugin {point.name!r} = {point.value}{where} "
        f"not loaded: {why}; the other frameworks load\n"
    )


def default_command(ref: str, study: Study[Any]) -> Command:
    """``eval NAME`` for a study given as an object: its docstring's first paragraph is the
    summary, the rest the help, and each field of its options is a flag (``input``, when the
    options have one, is the positional argument)."""
    doc = (type(study).__doc__ or study.name).strip().split("\n\n", 1)
    summary, rest = " ".join(doc[0].split()), " ".join(doc[1].split()) if len(doc) > 1 else ""
    fields = study.Options.model_fields
    flags = tuple(Flag(name, argument=name == "input") for name in fields)
    return Command(f"eval {study.name}", ref, summary, rest, flags=flags)


def _load(point: EntryPoint) -> Plugin:
    loaded = point.load()
    dist = _distribution(point)
    if isinstance(loaded, ModuleType):
        studies = tuple(getattr(loaded, "STUDIES", ()))
        commands = getattr(loaded, "COMMANDS", None)
        if commands is None:  # a module of studies without declarations: the defaults
            commands = tuple(default_command(ref, load_object(ref)) for ref in studies)
        return Plugin(point.name, point.value, dist, studies, tuple(commands))
    from .protocol import Study

    if not isinstance(loaded, Study):
        raise TypeError(f"{type(loaded).__name__} is neither a plugin module nor a Study")
    commands = loaded.commands or (default_command(point.value, loaded),)
    return Plugin(point.name, point.value, dist, (point.value,), tuple(commands))


@cache
def plugins() -> tuple[Plugin, ...]:
    """Every plugin that loads, built-ins first; the others are one warning line each."""
    found: list[Plugin] = []
    for point in _ordered(list(entry_points(group=GROUP))):
        try:
            found.append(_load(point))
        except Exception as exc:  # a user's package: any failure is theirs, never ours to crash on
            _warn(point, f"{type(exc).__name__}: {exc}".strip())
    return tuple(found)


@cache
def studies() -> dict[str, Study[Any]]:
    found: dict[str, Study[Any]] = {}
    for plugin in plugins():
        for ref in plugin.studies:
            try:
                item = load_object(ref)
            except Exception as exc:
                sys.stderr.write(f"groundcover: warning: study {ref} not loaded: {exc}\n")
                continue
            found.setdefault(item.name, item)  # the first (a built-in) keeps a name
    return found


def study(name: str) -> Study[Any]:
    from .config import UserError

    try:
        return studies()[name]
    except KeyError:
        raise UserError(
            f"unknown framework or study {name!r}: have {', '.join(studies())}"
        ) from None


def framework(name: str) -> Framework[Any, Any]:
    from .config import UserError
    from .protocol import Framework

    found = study(name)
    if not isinstance(found, Framework):
        raise UserError(f"{name!r} is a study of several runs, not a framework")
    return found


@cache
def commands() -> dict[str, Command]:
    """CLI path ("eval garage", "meta-eval conflictbank") -> its declaration, from every
    plugin, importing no framework that declares its commands in a plugin module."""
    found: dict[str, Command] = {}
    for plugin in plugins():
        for command in plugin.commands:
            found.setdefault(command.path, command)
    return found
