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
SHA-256), and the digest enters its runs' identity. A file is read once: those bytes are hashed,
compiled and run as a module of their own (``load_source``): no ``.pyc`` is read or written for
it, and its folder is not put on the import path.

Opening a run never runs code it holds or names (``run_framework``): ``report``, ``view``,
``compare``, ``agreement``, the exports and ``labels`` load a framework file again only when the
user named it on this command (``--framework FILE``) or trusted it on this machine (``trust``:
``groundcover eval FILE.py`` and ``groundcover trust FILE``). The run's recorded SHA-256 only
picks the trust list's entries to try: the file is read from the entry's own path, never the
run's, and loaded only when those bytes have the entry's SHA-256. Otherwise the run is read from
its records and summary alone (``RecordsOnly``: no tables, no item text), and one line says so
and how to trust the file.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import os
import stat
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
    roles: dict[str, dict[str, Any]] | None = None,
) -> Study[Any]:
    """The study named ``name``: given in this process (a file named with ``--framework``),
    installed (the package's own, whatever the run says of a file), or (``source``: what a run's
    manifest records of a study run from its file) a file the user trusts (``trusted_study``),
    else the run read from its records alone (``RecordsOnly``, with the run's ``roles``)."""
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
    found = trusted_study(name, source)
    if isinstance(found, str):
        return RecordsOnly.of(name, source, found, roles or {})
    return found


def framework(
    name: str,
    source: dict[str, Any] | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> Framework[Any, Any]:
    from .config import UserError
    from .protocol import Framework

    found = study(name, source, roles)
    if not isinstance(found, Framework):
        raise UserError(f"{name!r} is a study of several runs, not a framework")
    return found


def run_framework(manifest: Any, run_dir: Path) -> Framework[Any, Any]:
    """The framework of the run in ``run_dir`` (``manifest``: its manifest), as every reader of a
    run finds it: installed, named by the user, or a file the user trusts (never code the run
    holds or names: its directory plays no part in finding it)."""
    return framework(manifest.framework, manifest.source, manifest.roles)


def run_options(fw: Framework[Any, Any], manifest: Any, run_dir: Path) -> Any:
    """The options the run in ``run_dir`` recorded, as ``fw`` reads them; a record it does not
    read (a run from elsewhere, or of another version of the framework) is one line naming the
    field, never a traceback."""
    return recorded_options(fw.Options, manifest.options, Path(run_dir) / "manifest.json")


def recorded_options(model: type[Any], recorded: Any, record_file: Path) -> Any:
    """``recorded`` (the options a run's manifest or a study's ``study.json`` holds) as
    ``model`` reads them; what it does not read is one line naming the file and the field."""
    from pydantic import ValidationError

    from .config import UserError

    try:
        return model.model_validate(recorded)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise UserError(f"{record_file}: record: field options.{where}: {error['msg']}") from None


def trusted_study(name: str, source: dict[str, Any]) -> Study[Any] | str:
    """The study ``name`` from a file the user trusts whose SHA-256 is the one ``source`` (a
    run's record) names, or why there is none. The record picks entries of the trust list and
    nothing more: each is read at the path the entry records (the run's path is never read) and
    loaded only when those bytes hash to the entry's SHA-256."""
    from .protocol import Study
    from .trust import is_sha256, trusted_as

    wanted = source.get("sha256")
    if not is_sha256(wanted):
        return "the run records no SHA-256 of it"
    entries = trusted_as(wanted)
    if not entries:
        return "no file of its SHA-256 is in your trust list"
    changed = []
    for entry in entries:
        try:
            code = read_source(Path(entry.path))
        except OSError:
            changed.append(entry.path)
            continue
        if sha256_of(code) != entry.sha256:
            changed.append(entry.path)
            continue
        module = load_source(Path(entry.path), code)
        named = source.get("object")
        found = _study_in(module, named if isinstance(named, str) and named else None)
        if not isinstance(found, Study) or found.name != name:
            return f"the trusted file {entry.path} holds no framework {name!r}"
        found.source = {"file": entry.path, "object": named, "sha256": wanted}
        return found
    return f"the trusted file ({', '.join(changed)}) no longer has that SHA-256"


def _study_in(module: ModuleType, name: str | None) -> Any:
    """The study ``name`` of a module, or its only one (None when that is not one)."""
    from .protocol import Study

    if name:
        return getattr(module, name, None)
    defined = [value for value in vars(module).values() if isinstance(value, Study)]
    return defined[0] if len(defined) == 1 else None


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
            "its records and summary alone (no tables, no item text); `groundcover trust FILE` "
            "or --framework FILE loads a file you trust"
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


def trust_files(files: list[Path] | None, remember: bool = False) -> None:
    """``--framework FILE`` of the commands that open runs: each file loaded (the user names
    it: it is trusted for this command), known by its study's name from now on; ``remember``
    (``--trust``): also added to the trust list."""
    if remember and not files:
        from .config import UserError

        raise UserError("--trust keeps the --framework files trusted: name one (--framework FILE)")
    for path in files or ():
        from_file(str(path), remember=remember)


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


def from_file(spec: str, remember: bool = False) -> tuple[str, Study[Any]]:
    """``PATH.py[:OBJECT]`` loaded as a module of its own (``load_source``): its
    ``"module:OBJECT"`` reference and the study (``OBJECT``, or the file's only ``Study``
    object), known by name from now on. ``remember``: the user runs or names this file, so its
    SHA-256 (of the very bytes loaded) is added to the trust list."""
    from .config import UserError
    from .protocol import Study

    path_text, _, name = spec.partition(".py:") if ".py:" in spec else (spec[:-3], "", "")
    path = Path(path_text if path_text.endswith(".py") else path_text + ".py").resolve()
    try:
        code = read_source(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such framework file") from None
    except OSError as exc:
        raise UserError(f"{path}: not read: {exc.strerror or exc}") from None
    digest = sha256_of(code)
    module = load_source(path, code)
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
    if remember:
        from .trust import add_trusted

        add_trusted(path, digest)
    return f"{module.__name__}:{name}", found


def read_source(path: Path) -> bytes:
    """A framework file's bytes, read once (a regular file; a FIFO or device is refused, not
    waited on): what is hashed is what is compiled."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def sha256_of(code: bytes) -> str:
    return hashlib.sha256(code).hexdigest()


def module_name(digest: str) -> str:
    """The module a file's bytes run as, named by their whole SHA-256: the same bytes are one
    module per process, other bytes never take their place."""
    return f"groundcover_file_{digest}"


def load_source(path: Path, code: bytes) -> ModuleType:
    """``code`` (the bytes read from ``path``) compiled and run as a fresh module, registered
    under its digest's name (pydantic and dataclasses look their module up there). Nothing else
    is read: no ``.pyc`` beside the file, no second read of it, no folder added to the import
    path; a file importing a module beside it must have that module installed."""
    from .config import UserError

    name = module_name(sha256_of(code))
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    loaded_whole = False
    try:
        compiled = compile(code, str(path), "exec", dont_inherit=True)
        exec(compiled, module.__dict__)  # noqa: S102 - a file the user named or trusts
        loaded_whole = True
    except Exception as exc:  # the user's file: one line naming it
        raise UserError(f"{path}: did not load: {type(exc).__name__}: {exc}") from None
    finally:
        if not loaded_whole:  # half a module is never found again
            sys.modules.pop(name, None)
    return module


@cache
def commands() -> dict[str, Command]:
    """CLI path ("eval garage", "meta-eval conflictbank") -> its declaration, from every
    plugin, importing no framework that declares its commands in a plugin module."""
    found: dict[str, Command] = {}
    for plugin in plugins():
        for command in plugin.commands:
            found.setdefault(command.path, command)
    return found
