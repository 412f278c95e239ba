"""What every framework command shares, declared once: the evaluator and run options, the
YAML + flags configuration, and turning expected failures into one line and an exit code. The
framework commands themselves are built from their declarations in ``frameworks``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ...serving.redact import redact
from ..runtime.terminal import labelled, terminal

if TYPE_CHECKING:
    from ..runtime.contract.protocol import RunRequest, Study

PANEL = "Evaluator and run options (shared by every framework)"
console = terminal(stderr=True)


# Exit codes, one per way a command ends (README "Faults"): 0 a clean run, 1 a server, endpoint or
# cluster failed (resumable), 2 bad input or configuration (nothing written), 3 a budget cap
# stopped admitting items, 4 the run ended with failed items (the same command retries them).
EXIT_RUNTIME, EXIT_USER, EXIT_BUDGET, EXIT_FAILED_ITEMS = 1, 2, 3, 4


def expected_errors() -> tuple[
    tuple[type[Exception], ...], type[Exception], tuple[type[Exception], ...], type[Exception]
]:
    """(bad input or configuration, a budget reached, a server or endpoint failing, failed
    items), imported when a command runs, not when the CLI starts."""
    from ...serving.client import EndpointError
    from ...serving.files import UnsafePath
    from ...serving.launch.embedded import EmbeddedModelMissing
    from ...serving.launch.registry import UnknownModelError
    from ...serving.launch.server import ServerStartError
    from ..runtime.budget.costs import BudgetReached
    from ..runtime.contract.errors import ItemsFailed, UserError
    from ..runtime.store.lines import FileChanged
    from ..runtime.store.run_dir import RunStoreError

    user = (
        UserError,
        RunStoreError,
        UnknownModelError,
        EmbeddedModelMissing,
        FileChanged,
        UnsafePath,
    )
    return user, BudgetReached, (ServerStartError, EndpointError), ItemsFailed


# ``--framework FILE`` of every command that opens runs (report, compare, agreement, view,
# labels export), and ``--trust`` to keep those files trusted
FrameworkFiles = Annotated[
    list[Path] | None,
    typer.Option(
        "--framework",
        metavar="FILE",
        help="a framework file you trust, imported to read runs made with it (a run's own "
        "record of its file is never trusted: `groundcover trust FILE` or this)",
    ),
]
TrustFiles = Annotated[
    bool,
    typer.Option(
        "--trust", help="also add the --framework files to your trust list (groundcover trust)"
    ),
]


def _say(label: str, exc: BaseException) -> None:
    """The one line a failure is: its label in red, then its words, no key in them."""
    console.print(labelled(label, "red", redact(str(exc))), highlight=False, soft_wrap=True)


def clean_errors(command: Callable) -> Callable:
    """One line on stderr and a non-zero exit instead of a traceback for expected failures."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        user_errors, budget_reached, runtime_errors, items_failed = expected_errors()
        try:
            return command(*args, **kwargs)
        except user_errors as exc:  # bad input or configuration: nothing was written
            _say("error:", exc)
            raise typer.Exit(EXIT_USER) from None
        except budget_reached as exc:  # the run is partial on purpose: a distinct exit code
            console.print(f"stopped: {redact(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BUDGET) from None
        except runtime_errors as exc:
            _say("error:", exc)
            if not getattr(exc, "nothing_written", False):
                console.print("finished items are saved; rerun the same command to resume")
            raise typer.Exit(EXIT_RUNTIME) from None
        except items_failed as exc:  # the run finished, but not cleanly
            _say("failed:", exc)
            raise typer.Exit(EXIT_FAILED_ITEMS) from None

    return wrapper


def parse_loras(values: list[str] | None) -> dict[str, str]:
    """NAME=PATH, or NAME of an adapter registered with `finetune claims register`."""
    from ...serving.launch.adapters import registered
    from ..runtime.contract.errors import UserError

    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep and name and (found := registered(name)) is not None:
            path, sep = str(found), "="
        if not sep or not name or not path:
            raise UserError(f"--lora expects NAME=PATH or a registered adapter name, got {value!r}")
        out[name] = path
    return out


class Shared:
    """The shared options one invocation was given (None or False: not given, so the YAML file
    or the field's default stands)."""

    def __init__(self, **given: Any) -> None:
        from ..runtime.contract.config import SHARED_OPTIONS

        unknown = set(given) - {o.name for o in SHARED_OPTIONS}
        if unknown:
            raise TypeError(f"not shared options: {sorted(unknown)}")
        self.given = {o.name: given.get(o.name) for o in SHARED_OPTIONS}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["given"][name]
        except KeyError:
            raise AttributeError(name) from None

    def overrides(self) -> dict[str, Any]:
        """Dotted config keys; None means 'not given' (the YAML file or the default stands)."""
        from ..runtime.contract.config import SHARED_OPTIONS
        from ..runtime.contract.roles import parse_role_options, with_revisions

        out: dict[str, Any] = {}
        for option in SHARED_OPTIONS:
            value = self.given[option.name]
            if option.field is None:
                continue  # how this invocation runs: read by the command itself
            if option.field == "roles":
                out |= {f"roles.{r}": s for r, s in parse_role_options(value).items()}
            elif option.field == "roles.revision":
                out = with_revisions(out, value)
            elif option.field == "evaluator.adapters":
                out[option.field] = parse_loras(value) or None
            elif value is False:
                out[option.field] = None  # a switch not given
            else:
                out[option.field] = str(value) if isinstance(value, Path) else value
        return out


def load_request(study: Study[Any], own: dict[str, Any], shared: Shared) -> RunRequest:
    """The command's ``RunRequest``: its own options (dotted keys of the study's options; a
    ``roles.<role>`` key sets a role like ``--role`` does, which wins over it), the shared
    options and the YAML file, by the one configuration builder of the CLI and the API."""
    from ..api import request_from

    overrides = {
        key if key.startswith("roles.") else f"{study.name}.{key}": value
        for key, value in own.items()
    }
    return request_from(study, shared.config, overrides | shared.overrides())
