"""Frameworks and studies by name, and the commands they bring, found by entry points.

Every framework registers in the ``groundcover.frameworks`` entry-point group, the built-ins
exactly as a user's package does (``docs/write-a-framework.md``). An entry point names either

- a light *plugin module* with ``STUDIES`` (``"module:NAME"`` references) and ``COMMANDS``
  (``pipelines.runtime.contract.commands.Command``): its commands are listed without importing the
  framework, which is imported when a command runs; or
- a ``Study`` object (``"my_metric:METRIC"``): one file is a framework, its command is
  ``eval NAME`` with a flag for each of its options' fields (``default_command``).

A plugin that fails to import is one warning line naming it, and the others load.

A framework needs no install to run: ``groundcover eval path/to/file.py[:OBJECT]`` loads the
file (``from_file``) and ``groundcover.evaluate(obj, ...)`` takes the object (``add_study``).
Such a study records where it came from (``source``: the file, the object's name and the file's
SHA-256), and the digest enters its runs' identity.

Opening a run never runs code from it (``run_framework``): ``report``, ``view``, ``compare``,
``agreement`` and the exports import a run's framework file again only when it is at its
recorded absolute path, outside the run directory, with its recorded SHA-256, or when the user
names the file again (``--framework FILE``). Otherwise the run is read from its records and
summary alone (``RecordsOnly``: no tables, no item text), and one line says so.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
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


# studies given as objects or loaded from their files in this process, by name
_GIVEN: dict[str, Study[Any]] = {}


def study(
    name: str,
    source: dict[str, Any] | None = None,
    opened: Path | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> Study[Any]:
    """The study named ``name``: given in this process (a file named with ``--framework``),
    installed, or (``source``: what the manifest of the run directory ``opened`` records of a
    study run from its file) loaded again from its file where ``trusted_file`` allows it, else
    the run read from its records alone (``RecordsOnly``, with the run's ``roles``)."""
    from .config import UserError

    if name in _GIVEN:
        return _GIVEN[name]
    try:
        return studies()[name]
    except KeyError:
        if not (source and source.get("file")):
            raise UserError(
                f"unknown framework or study {name!r}: have {', '.join(studies())}"
            ) from None
    refused = untrusted_why(source, opened)
    if refused is None:
        return from_file(f"{source['file']}:{source.get('object') or ''}".rstrip(":"))[1]
    return RecordsOnly.of(name, source, refused, roles or {})


def framework(
    name: str,
    source: dict[str, Any] | None = None,
    opened: Path | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> Framework[Any, Any]:
    from .config import UserError
    from .protocol import Framework

    found = study(name, source, opened, roles)
    if not isinstance(found, Framework):
        raise UserError(f"{name!r} is a study of several runs, not a framework")
    return found


def run_framework(manifest: Any, run_dir: Path) -> Framework[Any, Any]:
    """The framework of the run in ``run_dir`` (``manifest``: its manifest), as every reader of a
    run finds it: installed, named by the user, or its trusted file (never code the run holds)."""
    return framework(manifest.framework, manifest.source, run_dir, manifest.roles)


def untrusted_why(source: dict[str, Any], opened: Path | None) -> str | None:
    """Why a run's recorded framework file is not imported (None: it may be): it must be an
    absolute path, outside the run directory being opened and any other run directory, to a
    file whose SHA-256 is the one the run recorded. A relative path would be read against
    wherever the reader stands; a file inside a run directory came with a run."""
    from ....serving.content import file_digest

    recorded = Path(str(source["file"]))
    if not recorded.is_absolute():
        return "its recorded path is not absolute"
    try:
        real = recorded.resolve(strict=True)
    except OSError:
        return "no file at its recorded path"
    if opened is not None and real.is_relative_to(opened.resolve()):
        return "it lies inside the run directory"
    if any((folder / "manifest.json").is_file() for folder in real.parents):
        return "it lies inside a run directory"  # another run sent with this one, say
    if not real.is_file() or file_digest(real) != source.get("sha256"):
        return "its SHA-256 is not the one the run recorded"
    return None


_SAID: set[str] = set()  # each note once per process (a page reads a run several times)


def _note(line: str) -> None:
    from ..terminal import printable

    if line not in _SAID:
        _SAID.add(line)
        sys.stderr.write(f"groundcover: {printable(line)}\n")


class RecordsOnly:
    """What is known of a framework whose code is not loaded (``study``): its name, and the
    roles and stages its run recorded. Its runs are read from their records and summary alone:
    statuses, scores, usage, panels and labels, no tables and no item text. Made as a
    ``Framework`` subclass when first needed (the protocol module is not for ``--help``)."""

    @staticmethod
    def of(
        name: str, source: dict[str, Any], why: str, roles: dict[str, dict[str, Any]]
    ) -> Framework[Any, Any]:
        from pydantic import ConfigDict

        from .protocol import Framework, FrameworkOptions

        said = (
            f"framework {name!r} is the file {source['file']}, not loaded ({why}): read from "
            "its records and summary alone (no tables, no item text); --framework FILE loads "
            "a file you trust"
        )
        recorded_stages = {
            stage: role for role, entry in roles.items() for stage in entry.get("stages") or ()
        }
        lead = next(iter(roles), "judge")
        declared = {role: "as the run recorded" for role in roles} or {"judge": ""}

        class AnyOptions(FrameworkOptions):
            model_config = ConfigDict(extra="allow")  # the recorded options, whatever they are

        class Unloaded(Framework[Any, Any]):
            records_only = True
            note = said
            Options = AnyOptions
            roles = declared
            stage_roles = recorded_stages | {"*": lead}

            def load(self, options: Any) -> list[Any]:
                raise ValueError(self.note)

        Unloaded.name = name
        found = Unloaded()
        found.source = source
        _note(said)
        return found


def trust_files(files: list[Path] | None) -> None:
    """``--framework FILE`` of the commands that open runs: each file loaded (the user names
    it: it is trusted), known by its study's name from now on."""
    for path in files or ():
        from_file(str(path))


def add_study(found: Study[Any]) -> Study[Any]:
    """``found`` (an object, not installed) known by its name in this process, with where it
    comes from: its class's file and that file's digest (``source``; None when it has none,
    as a class defined in a notebook). An installed study of that name is refused."""
    from .config import UserError
    from .protocol import Study

    if not isinstance(found, Study):
        raise UserError(f"{found!r} is neither a Framework nor a Study object")
    installed = studies().get(found.name)
    if installed is not None and installed is not found:
        raise UserError(
            f"{found.name!r} is the name of an installed framework: give yours another name"
        )
    if found.source is None:
        found.source = _source_of(found)
    _GIVEN[found.name] = found
    return found


def _source_of(found: Study[Any], name: str | None = None) -> dict[str, Any] | None:
    from ....serving.content import file_digest

    try:
        path = inspect.getsourcefile(type(found))
    except TypeError:
        return None
    if not path or not Path(path).is_file():
        return None
    return {"file": str(Path(path).resolve()), "object": name, "sha256": file_digest(Path(path))}


def is_file_spec(text: str) -> bool:
    """``PATH.py`` or ``PATH.py:OBJECT``: a framework run from its file."""
    path = text.rpartition(":")[0] if ".py:" in text else text
    return path.endswith(".py")


def from_file(spec: str) -> tuple[str, Study[Any]]:
    """``PATH.py[:OBJECT]`` loaded as a module of its own: its ``"module:OBJECT"`` reference and
    the study (``OBJECT``, or the file's only ``Study`` object), known by name from now on."""
    from ....serving.content import file_digest
    from .config import UserError
    from .protocol import Study

    path_text, _, name = spec.partition(".py:") if ".py:" in spec else (spec[:-3], "", "")
    path = Path(path_text if path_text.endswith(".py") else path_text + ".py").resolve()
    if not path.is_file():
        raise UserError(f"{path}: no such framework file")
    digest = file_digest(path)
    module_name = f"groundcover_file_{digest[:16]}"
    module = sys.modules.get(module_name)
    if module is None:
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise UserError(f"{path}: not a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as exc:  # the user's file: one line naming it
            del sys.modules[module_name]
            raise UserError(f"{path}: did not load: {type(exc).__name__}: {exc}") from None
    if name:
        found = getattr(module, name, None)
        if not isinstance(found, Study):
            raise UserError(f"{path}: {name!r} is not a Framework or Study object in the file")
    else:
        defined = [k for k, v in vars(module).items() if isinstance(v, Study)]
        if len(defined) != 1:
            raise UserError(
                f"{path}: {len(defined)} Framework or Study objects ({', '.join(defined)}); "
                "name one: FILE.py:OBJECT"
            )
        name, found = defined[0], getattr(module, defined[0])
    found.source = {"file": str(path), "object": name, "sha256": digest}
    add_study(found)
    return f"{module_name}:{name}", found


@cache
def commands() -> dict[str, Command]:
    """CLI path ("eval garage", "meta-eval conflictbank") -> its declaration, from every
    plugin, importing no framework that declares its commands in a plugin module."""
    found: dict[str, Command] = {}
    for plugin in plugins():
        for command in plugin.commands:
            found.setdefault(command.path, command)
    return found
