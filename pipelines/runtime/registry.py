"""Frameworks and studies by name, and the commands they bring.

Adding a framework: one sub-package of ``pipelines`` whose ``__init__`` exposes ``STUDIES`` (its
framework objects, plus any multi-run studies) and ``COMMANDS`` (CLI path -> command function),
and one line in ``PACKAGES`` below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from typing import Any

from pipelines.runtime.config import UserError

PACKAGES = (
    "pipelines.generate",
    "pipelines.comprehensiveness",
    "pipelines.fanoutqa",
    "pipelines.garage",
    "pipelines.icat",
    "pipelines.finetune",
    "pipelines.crux",
)


@cache
def studies() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for package in PACKAGES:
        for item in importlib.import_module(package).STUDIES:
            found[item.name] = item
    return found


def study(name: str):
    try:
        return studies()[name]
    except KeyError:
        raise UserError(
            f"unknown framework or study {name!r}: have {', '.join(studies())}"
        ) from None


def framework(name: str):
    from pipelines.runtime.protocol import Framework

    found = study(name)
    if not isinstance(found, Framework):
        raise UserError(f"{name!r} is a study of several runs, not a framework")
    return found


def commands() -> dict[str, Callable[..., Any]]:
    """CLI path ("eval garage", "meta-eval") -> command function, from every package."""
    out: dict[str, Callable[..., Any]] = {}
    for package in PACKAGES:
        out |= importlib.import_module(package).COMMANDS
    return out
