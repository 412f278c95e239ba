"""A framework's commands, declared as data: the command's path, the study it runs, and which
fields of the study's options model the command line offers. Names, types, help text and
defaults of the flags come from the options model's fields (their ``description``), so an
option is declared once; the CLI layer (``pipelines.cli.frameworks``) builds the commands, and
a framework imports no CLI library.

The study is named as ``"module:NAME"`` and imported only when its command runs or shows its
own help, so ``groundcover --help`` loads no framework.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One option of a command, from one field of the study's options model.

    ``field`` is the field's dotted path (``metric.protocol`` reaches into a nested model);
    ``roles.NAME`` instead names an adapter for that role on the evaluator's model (as
    ``--role NAME=:ADAPTER``, which wins over it)."""

    field: str
    name: str | None = None  # the flag's name where it is not the field's (--data for input)
    help: str | None = None  # only where the command's wording must differ from the field's
    argument: bool = False  # positional
    required: bool = False
    comma: bool = False  # a list field given as one comma-separated value ("m,s,a")

    @property
    def param(self) -> str:
        """The flag's Python name: ``--nli-model`` is ``nli_model``."""
        return (self.name or self.field.rpartition(".")[2]).replace("-", "_")

    @property
    def role(self) -> str | None:
        return self.field.removeprefix("roles.") if self.field.startswith("roles.") else None

    def override(self, value: Any) -> Any:
        """The configuration value of what was given (None: not given, the config stands)."""
        if value is None:
            return None
        if self.role is not None:
            return {"adapter": value}
        if self.comma:
            return [part.strip() for part in str(value).split(",") if part.strip()]
        if isinstance(value, list):
            return [_plain(v) for v in value]
        return _plain(value)


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) else str(value)


def flags(*fields: str) -> tuple[Flag, ...]:
    """Flags named as their fields."""
    return tuple(Flag(f) for f in fields)


# where a cross-encoder runs (execution.nli_placement), for every framework that has one
NLI_PLACEMENT = flags("nli_replicas", "nli_app", "nli_bulk", "nli_resources", "nli_wait")


@dataclass(frozen=True)
class Command:
    """``groundcover PATH``: runs ``study`` with the options its flags and ``fixed`` give."""

    path: str  # "eval garage", "meta-eval conflictbank", "eli5"
    study: str  # "module:NAME" of the Study object
    summary: str  # one line, for the command lists
    help: str = ""  # the rest of the command's own help
    flags: tuple[Flag, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)  # options every invocation sets

    @property
    def name(self) -> str:
        return self.path.rpartition(" ")[2]

    @property
    def group(self) -> str:
        return self.path.rpartition(" ")[0]

    def load_study(self) -> Any:
        return load_object(self.study)

    def overrides(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Dotted option keys from the flags' values (by ``Flag.param``) and ``fixed``."""
        out = {flag.field: flag.override(given.get(flag.param)) for flag in self.flags}
        return out | dict(self.fixed)


def load_object(ref: str) -> Any:
    """``"package.module:NAME"`` -> the object."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
