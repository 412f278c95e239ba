"""The framework commands, built from their declarations (``pipelines.runtime.contract.commands``).

A flag's name, type, help and default come from a field of the study's options model, so an
option is declared once, in the framework; every command gets the shared evaluator and run
options (``runtime.contract.config.SHARED_OPTIONS``). A command group lists its commands from the
declarations alone: a framework is imported only when one of its commands runs or shows its own
help.
"""

from __future__ import annotations

import inspect
import re
import shlex
import sys
import types
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import typer
from typer import _click as click  # the click typer vendors (0.29+): its groups' base
from typer.core import TyperCommand, TyperGroup

from ..runtime.contract.commands import Command, Flag
from .options import PANEL, Shared, clean_errors, load_request

if TYPE_CHECKING:
    from ..runtime.contract.protocol import Study

SCALARS = (bool, int, float, str, Path)
# set by `groundcover cluster` while it checks a command: the command builds its request (its
# flags parsed, its options validated) and hands it over instead of running
INSPECTED: ContextVar[list[tuple[Any, Any]] | None] = ContextVar("INSPECTED", default=None)


def option_field(model: Any, dotted: str) -> Any:
    """The pydantic ``FieldInfo`` at a dotted path (``metric.protocol``)."""
    *parents, name = dotted.split(".")
    for part in parents:
        model = _without_none(model.model_fields[part].annotation)
    if name not in model.model_fields:
        raise KeyError(f"{model.__name__} has no field {name!r}")
    return model.model_fields[name]


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``, and of ``Annotated[X, ...]`` (a content marker, say)."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation
    if get_origin(annotation) is Annotated:
        return get_args(annotation)[0]
    return annotation


def _scalar(annotation: Any) -> tuple[Any, list[str] | None]:
    """The command-line type of one value, and its choices where the field lists them."""
    if get_origin(annotation) is Literal:
        return str, [str(choice) for choice in get_args(annotation)]
    return (annotation, None) if annotation in SCALARS else (str, None)


def cli_type(annotation: Any, flag: Flag) -> tuple[Any, list[str] | None]:
    """``X | None`` for a single value, ``list[X] | None`` for a repeatable flag."""
    annotation = _without_none(annotation)
    if get_origin(annotation) is list:
        kind, choices = _scalar(get_args(annotation)[0])
        if flag.comma:
            return str | None, choices
        return list[kind] | None, choices  # type: ignore[valid-type]
    kind, choices = _scalar(annotation)
    return kind | None, choices


def default_text(info: Any) -> str | None:
    """The model's default, shown in --help (the flag itself defaults to 'not given')."""
    if info.is_required():
        return None
    default = info.get_default(call_default_factory=True)
    if default is None or default is False or default in ([], {}, ""):
        return None
    if isinstance(default, list):
        return ",".join(map(str, default))
    return str(default)


def flag_parameter(study: Study[Any], flag: Flag) -> inspect.Parameter:
    """One keyword parameter of the command function, annotated for typer."""
    decls = [f"--{flag.name}"] if flag.name and not flag.argument else []
    if flag.role is not None:
        kind: Any = str | None
        help_text, choices, shown = flag.help or f"adapter of role {flag.role}", None, None
    else:
        info = option_field(study.Options, flag.field)
        kind, choices = cli_type(info.annotation, flag)
        help_text = flag.help or info.description or ""
        shown = default_text(info)
        answers = getattr(study, "answer_file", None)
        if flag.field == "answers" and answers is not None:  # the format the framework reads
            help_text += f": {answers.shape}; an item without one: {answers.missing}"
    if flag.argument:
        info_obj: Any = typer.Argument(help=help_text, show_default=shown or False)
    else:
        metavar = f"[{'|'.join(choices)}]" if choices and not flag.comma else None
        info_obj = typer.Option(
            *decls, help=help_text, show_default=shown or False, metavar=metavar
        )
    default = inspect.Parameter.empty if flag.required else None
    if flag.required:
        kind = _without_none(kind)
    return inspect.Parameter(
        flag.param,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, info_obj],
    )


def shared_parameters() -> list[inspect.Parameter]:
    """The shared options as keyword parameters for typer, from their one declaration
    (``runtime.contract.config.SHARED_OPTIONS``): a field's type, description and default."""
    from ..runtime.contract.config import SHARED_OPTIONS

    found = []
    for option in SHARED_OPTIONS:
        kind, help_text, shown = option.kind, option.help, None
        if option.model is not None:
            info = option_field(option.model, option.field.partition(".")[2])  # type: ignore[union-attr]
            kind = kind or cli_type(info.annotation, Flag(option.name))[0]
            help_text, shown = help_text or info.description or "", default_text(info)
        switch = kind is bool or kind == bool | None
        flag = "--" + option.name.replace("_", "-")
        decls = [flag] if switch else []  # a switch: given or not, never --no-...
        info_obj = typer.Option(
            *decls, help=help_text, show_default=shown or False, rich_help_panel=PANEL
        )
        kind = bool if switch else kind
        found.append(
            inspect.Parameter(
                option.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=False if switch else None,
                annotation=Annotated[kind, info_obj],
            )
        )
    return found


def build(spec: Command) -> click.Command:
    """The click command of a declaration (imports its study)."""
    study = spec.load_study()
    own = [flag_parameter(study, flag) for flag in spec.flags]
    shared = shared_parameters()
    clash = {p.name for p in own} & {p.name for p in shared}
    if clash:
        raise ValueError(f"{spec.path}: flags {sorted(clash)} are shared options")

    def command(**given: Any) -> None:
        from ..reports.exports.tracking import track_outcomes
        from ..runtime.contract.config import MissingFields, UserError
        from ..runtime.execution.execute import execute, raise_for_failures

        common = Shared(**{p.name: given.pop(p.name) for p in shared})
        try:
            request = load_request(study, spec.overrides(given), common)
        except MissingFields as exc:  # the flags that give them, not the config's field names
            raise UserError(missing_line(spec, study, exc.fields)) from None
        if common.pilot is not None and (common.pilot < 1 or common.dry_run):
            raise UserError("--pilot K needs K >= 1 and no --dry-run (a pilot runs items)")
        if (inspected := INSPECTED.get()) is not None:  # `cluster plan`: the request, no run
            inspected.append((study, request))
            return
        outcomes = execute(
            study,
            request,
            no_cache=common.no_cache,
            quiet=common.quiet,
            dry_run=common.dry_run,
            pilot=common.pilot,
        )
        if not common.dry_run:
            track_outcomes(outcomes, request)
        raise_for_failures(outcomes, request, shlex.join(["groundcover", *sys.argv[1:]]))

    command.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in own + shared}
    roles = "; ".join(f"{role}: {what}" for role, what in study.roles.items())
    text = "\n\n".join(
        part
        for part in (spec.summary, spec.help, f"Roles (--role=ROLE=MODEL...): {roles}.")
        if part
    )
    app = typer.Typer(add_completion=False)
    app.command(spec.name, help=text)(clean_errors(command))
    built = typer.main.get_command(app)
    built.name = spec.name
    built.declaration = spec  # type: ignore[attr-defined]  # a framework's: `cluster` builds its request
    return built


def build_from_file(spec: str) -> click.Command:
    """``eval PATH.py[:OBJECT]``: the framework in that file, with the command an installed one
    of its kind gets (a flag per field of its options, ``input`` positional); a file that does
    not load is one line."""
    import dataclasses

    from ..runtime.contract.errors import UserError
    from ..runtime.contract.plugins import default_command, from_file
    from ..runtime.terminal import labelled
    from .options import EXIT_USER, console

    try:
        ref, found = from_file(spec, remember=True)  # the user runs it: they trust it
    except UserError as exc:
        console.print(labelled("error:", "red", str(exc)), highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USER) from None
    if found.commands:  # its own declaration, pointed at the object loaded from the file
        return build(dataclasses.replace(found.commands[0], study=ref))
    return build(default_command(ref, found))


def flag_text(flag: Flag) -> str:
    """How a flag is given: ``INPUT`` for a positional one, else ``--name``."""
    if flag.argument:
        return flag.param.upper()
    return "--" + (flag.name or flag.field.rpartition(".")[2]).replace("_", "-")


def missing_line(spec: Command, study: Study[Any], fields: list[str]) -> str:
    """One line naming what to give for missing fields: the command's flags (or the field, for
    --config, where no flag sets it), and the one flag that would give all of them at once where
    the options have one (``supplied_by``: CRUX's --data folder)."""
    from typer._click.globals import get_current_context

    prefix = f"{study.name}."
    own = [f.removeprefix(prefix) for f in fields if f.startswith(prefix)]
    by_field = {flag.field: flag for flag in spec.flags}
    wanted = [flag_text(by_field[f]) if f in by_field else f"{f} (in --config)" for f in own]
    wanted += [f"{f} (in --config)" for f in fields if not f.startswith(prefix)]
    text = wanted[0] if len(wanted) == 1 else f"{', '.join(wanted[:-1])} and {wanted[-1]}"
    supplied_by = getattr(study.Options, "supplied_by", {})
    instead = {supplied_by.get(f) for f in own}
    if len(instead) == 1 and (one := instead.pop()) in by_field:
        text += f", or {flag_text(by_field[one])}"
    return f"{get_current_context().command_path} needs {text} (see --help)"


def paragraphs(text: str | None) -> str | None:
    """Help written as paragraphs, rendered as paragraphs: a docstring's line breaks inside a
    paragraph become spaces; blank lines, indented lines and list items stay."""
    if not text:
        return text
    out = []
    for block in inspect.cleandoc(text).split("\n\n"):
        lines = block.splitlines()
        kept = any(line.startswith(("  ", "- ", "* ", "\b")) for line in lines)
        out.append(block if kept else " ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def first_sentence(text: str | None) -> str | None:
    """The first sentence of the first paragraph, on one line (a command list's entry)."""
    first = (paragraphs(text) or "").split("\n\n")[0]
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", first, maxsplit=1)[0] or None


class LazyGroup(TyperGroup):
    """A group whose declared framework commands are built when invoked, not when listed;
    every command's help reflowed as paragraphs, its entry in the list one sentence."""

    path = ""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **kwargs: Any,
    ) -> Any:
        """A usage error (a missing option or argument, an unknown flag) is one line naming the
        command and what to give, like every other error, not a framed usage block."""

        def run(standalone: bool) -> Any:
            return super(LazyGroup, self).main(
                args, prog_name, complete_var, standalone, windows_expand_args, **kwargs
            )

        if not standalone_mode:
            return run(False)
        try:
            returned = run(False)
        except click.exceptions.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "groundcover"
            sys.stderr.write(f"error: {where}: {exc.format_message()} (see --help)\n")
            sys.exit(exc.exit_code)
        except click.exceptions.ClickException as exc:
            sys.stderr.write(f"error: {exc.format_message()}\n")
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.stderr.write("aborted\n")
            sys.exit(1)
        # without standalone mode typer hands back an Exit's code; a command's own value is None
        sys.exit(returned if isinstance(returned, int) and not isinstance(returned, bool) else 0)

    def declared(self) -> dict[str, Command]:
        from ..runtime.contract.plugins import commands

        return {c.name: c for c in commands().values() if c.group == self.path}

    def list_commands(self, ctx: click.Context) -> list[str]:
        own = super().list_commands(ctx)
        return own + [name for name in self.declared() if name not in own]

    def format_help(self, ctx: click.Context, formatter: Any) -> None:
        self.help = paragraphs(self.help)
        super().format_help(ctx, formatter)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            found.help = paragraphs(found.help)
            found.short_help = found.short_help or first_sentence(found.help)
            return found
        spec = self.declared().get(cmd_name)
        if spec is None:
            return None
        # listed by its summary alone; ``resolve_command`` builds it when it is asked for
        return TyperCommand(cmd_name, help=spec.summary, short_help=spec.summary)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and args[0] in self.declared():
            self.commands[args[0]] = build(self.declared()[args[0]])
        elif self.path == "eval" and args and args[0] not in self.commands:
            from ..runtime.contract.plugins import is_file_spec

            if is_file_spec(args[0]):  # a framework run from its file, not installed
                self.commands[args[0]] = build_from_file(args[0])
        name, command, rest = super().resolve_command(ctx, args)
        return name, command, optional_values(self.path, name, rest)


# Options whose value may be left out (click has none): ``report RUN --html`` writes the page
# beside the run. Left out means: last, or followed by another option or an existing directory
# (a run, which a page path never is); the command then gets "".
OPTIONAL_VALUE = {("", "report"): ("--html",), ("", "compare"): ("--html",)}


def optional_values(group: str, name: str | None, args: list[str]) -> list[str]:
    """``args`` with "" after each optional-value option given without its value."""
    flags = OPTIONAL_VALUE.get((group, name or ""), ())
    out = []
    for k, arg in enumerate(args):
        out.append(arg)
        if arg in flags:
            following = args[k + 1] if k + 1 < len(args) else None
            if following is None or following.startswith("-") or Path(following).is_dir():
                out.append("")
    return out


def lazy_group(path: str) -> type[LazyGroup]:
    """The group class of ``groundcover PATH`` ("" for the top level)."""
    return type(f"LazyGroup[{path}]", (LazyGroup,), {"path": path})
