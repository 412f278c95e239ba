"""Frameworks and studies by name, and the commands they bring.

Adding a framework: one sub-package of ``pipelines`` with a light ``plugin`` module that names
its study objects (``STUDIES``, as ``"module:NAME"``) and declares its commands (``COMMANDS``,
``pipelines.runtime.commands.Command``), and one line in ``PACKAGES`` below. Commands are read
without importing any framework; a study is imported when it is asked for by name.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any

from pipelines.runtime.commands import Command, load_object

if TYPE_CHECKING:  # the protocol module loads pydantic and the client: not for --help
    from pipelines.runtime.protocol import Framework, Study

PACKAGES = (
    "pipelines.generate",
    "pipelines.comprehensiveness",
    "pipelines.fanoutqa",
    "pipelines.garage",
    "pipelines.icat",
    "pipelines.finetune",
    "pipelines.crux",
)


def _plugin(package: str) -> Any:
    return importlib.import_module(f"{package}.plugin")


@cache
def studies() -> dict[str, Study[Any]]:
    found: dict[str, Study[Any]] = {}
    for package in PACKAGES:
        for ref in _plugin(package).STUDIES:
            item = load_object(ref)
            found[item.name] = item
    return found


def study(name: str) -> Study[Any]:
    from pipelines.runtime.config import UserError

    try:
        return studies()[name]
    except KeyError:
        raise UserError(
            f"unknown framework or study {name!r}: have {', '.join(studies())}"
        ) from None


def framework(name: str) -> Framework[Any, Any]:
    from pipelines.runtime.config import UserError
    from pipelines.runtime.protocol import Framework

    found = study(name)
    if not isinstance(found, Framework):
        raise UserError(f"{name!r} is a study of several runs, not a framework")
    return found


@cache
def commands() -> dict[str, Command]:
    """CLI path ("eval garage", "meta-eval conflictbank") -> its declaration, from every
    package, importing no framework."""
    return {c.path: c for package in PACKAGES for c in _plugin(package).COMMANDS}
