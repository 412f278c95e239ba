"""What every framework command shares, declared once: the evaluator and run options, the
YAML + flags configuration, and turning expected failures into one line and an exit code. The
framework commands themselves are built from their declarations in ``frameworks``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from pipelines.runtime.protocol import RunRequest, Study

PANEL = "Evaluator and run options (shared by every framework)"
console = Console(stderr=True)


# Exit codes, one per way a command ends (README "Faults"): 0 a clean run, 1 a server, endpoint or
# cluster failed (resumable), 2 bad input or configuration (nothing written), 3 a budget cap
# stopped admitting items, 4 the run ended with failed items (the same command retries them).
EXIT_RUNTIME, EXIT_USER, EXIT_BUDGET, EXIT_FAILED_ITEMS = 1, 2, 3, 4


def expected_errors() -> tuple[
    tuple[type[Exception], ...], type[Exception], tuple[type[Exception], ...], type[Exception]
]:
    """(bad input or configuration, a budget reached, a server or endpoint failing, failed
    items), imported when a command runs, not when the CLI starts."""
    from pipelines.runtime.config import UserError
    from pipelines.runtime.costs import BudgetReached
    from pipelines.runtime.errors import ItemsFailed
    from pipelines.runtime.lines import FileChanged
    from pipelines.runtime.runstore import RunStoreError
    from serving.client import EndpointError
    from serving.embedded import EmbeddedModelMissing
    from serving.launcher import ServerStartError
    from serving.registry import UnknownModelError

    user = (UserError, RunStoreError, UnknownModelError, EmbeddedModelMissing, FileChanged)
    return user, BudgetReached, (ServerStartError, EndpointError), ItemsFailed


def clean_errors(command: Callable) -> Callable:
    """One line on stderr and a non-zero exit instead of a traceback for expected failures."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        user_errors, budget_reached, runtime_errors, items_failed = expected_errors()
        try:
            return command(*args, **kwargs)
        except user_errors as exc:  # bad input or configuration: nothing was written
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_USER) from None
        except budget_reached as exc:  # the run is partial on purpose: a distinct exit code
            console.print(f"stopped: {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BUDGET) from None
        except runtime_errors as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            if not getattr(exc, "nothing_written", False):
                console.print("finished items are saved; rerun the same command to resume")
            raise typer.Exit(EXIT_RUNTIME) from None
        except items_failed as exc:  # the run finished, but not cleanly
            console.print(f"[red]failed:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_FAILED_ITEMS) from None

    return wrapper


def parse_loras(values: list[str] | None) -> dict[str, str]:
    """NAME=PATH, or NAME of an adapter registered with `finetune claims register`."""
    from pipelines.runtime.config import UserError
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
            "one role (repeat; a judging role given again is a judge panel, docs/judges.md)",
        ),
        None,
    ),
    "lora": (_opt(list[str] | None, "NAME=PATH of an adapter to serve (repeat)"), None),
    "model_revision": (
        _opt(
            str | None,
            "the model's revision: a hub commit/branch to serve, or a label for what an "
            "endpoint serves (recorded; part of the run's identity)",
        ),
        None,
    ),
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
    "reasoning": (
        _opt(str | None, "off | low | medium | high: a reasoning model's effort (default: preset)"),
        None,
    ),
    "reasoning_tokens": (
        _opt(int | None, "reasoning tokens on top of each answer budget (default per effort)"),
        None,
    ),
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
    "drivers": (
        _opt(int | None, "driver actors on the Ray cluster (--ray-address) sharing the run"),
        None,
    ),
    "driver_resources": (
        _opt(str | None, "Ray resources per driver, JSON: one object, or a list of one each"),
        None,
    ),
    "allow_failures": (
        _opt(str | None, "failed items a run may end with and exit 0: N, or P% (default 0)"),
        None,
    ),
    "keep_reasoning": (
        _opt(bool, "keep each request's reasoning in the records (large)", "--keep-reasoning"),
        False,
    ),
    "supersede": (
        _opt(
            bool,
            "the run directory's inputs or models changed: move its records to superseded/ "
            "and solve it again in place",
            "--supersede",
        ),
        False,
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
    model_revision: str | None = None
    adapter_prefix: str | None = None
    run_dir: Path | None = None
    replicas: int | None = None
    ray_address: str | None = None
    concurrency: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    prices: Path | None = None
    max_cost: float | None = None
    max_run_tokens: int | None = None
    repeats: int | None = None
    drivers: int | None = None
    driver_resources: str | None = None
    allow_failures: str | None = None
    keep_reasoning: bool = False
    supersede: bool = False
    dry_run: bool = False
    pilot: int | None = None
    no_cache: bool = False
    quiet: bool = False

    def overrides(self) -> dict[str, Any]:
        """Dotted config keys; None means 'not given' (the YAML file or the default stands)."""
        from pipelines.runtime.roles import parse_role_options

        roles = {f"roles.{r}": spec for r, spec in parse_role_options(self.role).items()}
        return roles | {
            "evaluator.model": self.model,
            "evaluator.endpoint": self.endpoint,
            "evaluator.adapter": self.adapter,
            "evaluator.adapters": parse_loras(self.lora) or None,
            "evaluator.revision": self.model_revision,
            "evaluator.adapter_prefix": self.adapter_prefix,
            "evaluator.replicas": self.replicas,
            "evaluator.ray_address": self.ray_address,
            "evaluator.concurrency": self.concurrency,
            "evaluator.max_tokens": self.max_tokens,
            "evaluator.temperature": self.temperature,
            "evaluator.reasoning": self.reasoning,
            "evaluator.reasoning_tokens": self.reasoning_tokens,
            "run.run_dir": self.run_dir and str(self.run_dir),
            "run.prices": self.prices and str(self.prices),
            "run.max_cost": self.max_cost,
            "run.max_run_tokens": self.max_run_tokens,
            "run.repeats": self.repeats,
            "run.drivers": self.drivers,
            "run.driver_resources": self.driver_resources,
            "run.allow_failures": self.allow_failures,
            "run.keep_reasoning": self.keep_reasoning or None,
            "run.supersede": self.supersede or None,
        }


def load_request(study: Study[Any], own: dict[str, Any], shared: Shared) -> RunRequest:
    """The command's ``RunRequest``: its own options (dotted keys of the study's options; a
    ``roles.<role>`` key sets a role like ``--role`` does, which wins over it), the shared
    options and the YAML file, by the one configuration builder of the CLI and the API."""
    from pipelines.api import request_from

    overrides = {
        key if key.startswith("roles.") else f"{study.name}.{key}": value
        for key, value in own.items()
    }
    return request_from(study, shared.config, overrides | shared.overrides())
