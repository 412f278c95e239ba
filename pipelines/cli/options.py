"""What every framework command shares, declared once: the evaluator and run options, the
YAML + flags configuration, and turning expected failures into one line and an exit code.

A framework's command declares only its own options and returns them as overrides of its
``Options``; ``framework_command`` adds the shared options (one help group) and runs the study.

    @framework_command(GARAGE)
    def eval_garage(input: Annotated[Path, typer.Argument()], limit: ... = None) -> dict:
        return {"input": input, "limit": limit}
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pipelines.api import request_from  # the one configuration builder, CLI and API
from pipelines.runtime.config import UserError
from pipelines.runtime.costs import BudgetReached
from pipelines.runtime.lines import FileChanged
from pipelines.runtime.protocol import RunRequest, Study
from pipelines.runtime.roles import parse_role_options
from pipelines.runtime.runstore import RunStoreError
from serving.client import EndpointError
from serving.embedded import EmbeddedModelMissing
from serving.launcher import ServerStartError
from serving.registry import UnknownModelError

PANEL = "Evaluator and run options (shared by every framework)"
USER_ERRORS = (UserError, RunStoreError, UnknownModelError, EmbeddedModelMissing, FileChanged)
RUNTIME_ERRORS = (ServerStartError, EndpointError)
console = Console(stderr=True)


def clean_errors(command: Callable) -> Callable:
    """One line on stderr and a non-zero exit instead of a traceback for expected failures."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except USER_ERRORS as exc:  # bad input or configuration: nothing was written
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except BudgetReached as exc:  # the run is partial on purpose: a distinct exit code
            console.print(f"stopped: {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None
        except RUNTIME_ERRORS as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            console.print("finished items are saved; rerun the same command to resume")
            raise typer.Exit(1) from None

    return wrapper


def parse_loras(values: list[str] | None) -> dict[str, str]:
    """NAME=PATH, or NAME of an adapter registered with `finetune claims register`."""
    from serving.adapters import registered

    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep and name and (found := registered(name)) is not None:
            path, sep = str(found), "="
        if not sep or not name or not path:
            raise UserError(f"--lora expects NAME=PATH or a registered adapter name, got {value!r}")
        out[name] = path
    return out


def _opt(kind: Any, help: str, *decls: str) -> Any:
    return Annotated[kind, typer.Option(*decls, help=help, rich_help_panel=PANEL)]


# name -> (annotation, default); the order is the order in --help.
SHARED_OPTIONS: dict[str, tuple[Any, Any]] = {
    "config": (_opt(Path | None, "YAML config file (flags win)"), None),
    "model": (_opt(str | None, "evaluator: preset, directory, hub id, or MODEL:ADAPTER"), None),
    "endpoint": (_opt(str | None, "OpenAI-compatible URL; none: start vLLM here"), None),
    "adapter": (_opt(str | None, "LoRA adapter every request goes to"), None),
    "role": (
        _opt(
            list[str] | None,
            "ROLE=MODEL, ROLE=MODEL@URL, ROLE=MODEL:ADAPTER or ROLE=:ADAPTER: another model for "
            "one role (repeat; see the framework's roles in docs/roles.md)",
        ),
        None,
    ),
    "lora": (_opt(list[str] | None, "NAME=PATH of an adapter to serve (repeat)"), None),
    "adapter_prefix": (
        _opt(str | None, "prefix of adapter names at an endpoint ('BASE:' for a Ray Serve app)"),
        None,
    ),
    "run_dir": (_opt(Path | None, "default: runs/<framework>-<fingerprint>"), None),
    "replicas": (_opt(int | None, "model replicas behind one URL (Ray Serve LLM)"), None),
    "ray_address": (
        _opt(str | None, "Ray cluster for replicas and NLI actors (default: local)"),
        None,
    ),
    "concurrency": (
        _opt(str | None, "requests (and items) in flight: N, or auto (AIMD, up to 256)"),
        None,
    ),
    "max_tokens": (_opt(int | None, "default completion budget"), None),
    "temperature": (_opt(float | None, "sampling temperature (default 0)"), None),
    "prices": (_opt(Path | None, "YAML: model -> $ per million tokens, or per GPU-hour"), None),
    "max_cost": (_opt(float | None, "dollars: admit no item that could pass this"), None),
    "max_run_tokens": (
        _opt(int | None, "tokens of the whole run: admit no item that could pass this"),
        None,
    ),
    "repeats": (
        _opt(int | None, "K judgements per item, one seed each (needs a temperature above 0)"),
        None,
    ),
    "dry_run": (
        _opt(bool, "check inputs, print what each run would still ask; start nothing", "--dry-run"),
        False,
    ),
    "pilot": (
        _opt(int | None, "solve K missing items for real (kept), then estimate the rest"),
        None,
    ),
    "no_cache": (_opt(bool, "skip the response cache", "--no-cache"), False),
    "quiet": (_opt(bool, "no progress bar"), False),
}


@dataclass
class Shared:
    config: Path | None = None
    model: str | None = None
    endpoint: str | None = None
    adapter: str | None = None
    role: list[str] | None = None
    lora: list[str] | None = None
    adapter_prefix: str | None = None
    run_dir: Path | None = None
    replicas: int | None = None
    ray_address: str | None = None
    concurrency: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    prices: Path | None = None
    max_cost: float | None = None
    max_run_tokens: int | None = None
    repeats: int | None = None
    dry_run: bool = False
    pilot: int | None = None
    no_cache: bool = False
    quiet: bool = False

    def overrides(self) -> dict[str, Any]:
        """Dotted config keys; None means 'not given' (the YAML file or the default stands)."""
        roles = {f"roles.{r}": spec for r, spec in parse_role_options(self.role).items()}
        return roles | {
            "evaluator.model": self.model,
            "evaluator.endpoint": self.endpoint,
            "evaluator.adapter": self.adapter,
            "evaluator.adapters": parse_loras(self.lora) or None,
            "evaluator.adapter_prefix": self.adapter_prefix,
            "evaluator.replicas": self.replicas,
            "evaluator.ray_address": self.ray_address,
            "evaluator.concurrency": self.concurrency,
            "evaluator.max_tokens": self.max_tokens,
            "evaluator.temperature": self.temperature,
            "run.run_dir": self.run_dir and str(self.run_dir),
            "run.prices": self.prices and str(self.prices),
            "run.max_cost": self.max_cost,
            "run.max_run_tokens": self.max_run_tokens,
            "run.repeats": self.repeats,
        }


def load_request(study: Study, own: dict[str, Any], shared: Shared) -> RunRequest:
    """The command's configuration; a command's ``roles.<role>`` keys (``--extractor``) set a
    role like ``--role`` does, which wins over them."""
    overrides = {
        key if key.startswith("roles.") else f"{study.name}.{key}": _plain(value)
        for key, value in own.items()
    }
    return request_from(study, shared.config, overrides | shared.overrides())


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def framework_command(study: Study) -> Callable[[Callable[..., dict]], Callable[..., None]]:
    """Turn ``fn(**own options) -> overrides`` into a command with the shared options added."""

    def decorate(fn: Callable[..., dict]) -> Callable[..., None]:
        own = inspect.signature(fn, eval_str=True)

        def command(**kwargs: Any) -> None:
            from pipelines.runtime.runner import execute

            shared = Shared(**{name: kwargs.pop(name) for name in SHARED_OPTIONS})
            request = load_request(study, fn(**kwargs), shared)
            if shared.pilot is not None and (shared.pilot < 1 or shared.dry_run):
                raise UserError("--pilot K needs K >= 1 and no --dry-run (a pilot runs items)")
            execute(
                study,
                request,
                no_cache=shared.no_cache,
                quiet=shared.quiet,
                dry_run=shared.dry_run,
                pilot=shared.pilot,
            )

        shared_params = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
            for name, (annotation, default) in SHARED_OPTIONS.items()
        ]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()]
        command.__signature__ = own.replace(parameters=params + shared_params)  # type: ignore
        command.__annotations__ = {p.name: p.annotation for p in params + shared_params}
        roles = "; ".join(f"{role}: {what}" for role, what in study.roles.items())
        command.__name__ = fn.__name__
        command.__doc__ = f"{fn.__doc__ or ''}\n\nRoles (--role=ROLE=MODEL...): {roles}."
        return clean_errors(command)

    return decorate


# ---- where a cross-encoder runs (pipelines.runtime.nli_placement) ----

NliReplicasOpt = Annotated[
    int | None, typer.Option(help="NLI on a Ray Serve app of N replicas (0: here)")
]
NliAppOpt = Annotated[
    str | None, typer.Option(help="NLI on the running Serve app NAME (`serve --nli`)")
]
NliBulkOpt = Annotated[
    bool | None, typer.Option("--nli-bulk", help="NLI replicas as Ray Data actors per call")
]
NliWaitOpt = Annotated[
    float | None, typer.Option(help="seconds to wait for a live NLI replica, then stop (120)")
]
NliResourcesOpt = Annotated[
    str | None, typer.Option(help='Ray resources per NLI replica, JSON: {"CPU": 4, "nli": 1}')
]


def nli_overrides(
    replicas: int | None,
    app: str | None,
    bulk: bool | None,
    resources: str | None,
    wait: float | None,
) -> dict[str, Any]:
    """The NLI placement options a command was given (None: not given, the config's value
    stays; ``pipelines.runtime.nli_placement``)."""
    given = {"replicas": replicas, "app": app, "bulk": bulk, "resources": resources, "wait": wait}
    return {f"nli_{name}": value for name, value in given.items()}
