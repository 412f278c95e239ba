"""The Python API beside the ``groundcover`` command: run a framework (or a study) on its items and
get the typed results back, or score one item outside a run.

One configuration, three ways in: the sections a YAML file holds (``evaluator``, ``roles``,
``run`` and the study's own options under its name) are keyword arguments here, a YAML file may
give them first, and the command line's flags are the same fields. A run made here is an
ordinary run directory: it resumes, and ``groundcover report`` reads it.

    from .api import evaluate

    done = evaluate(
        "comprehensiveness",
        options={"input": "examples/comprehensiveness.jsonl", "method": "qa"},
        evaluator={"model": "gpt-oss-20b", "endpoint": "http://gpu:8000/v1"},
        roles={"judge": "Qwen2.5-72B-Instruct@http://judge:8000/v1"},
    )
    print(done.summary.mean_score, [r.score for r in done.results])
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..serving.client import EvalClient
from .datasets.names import resolve_names
from .reports.exports.tracking import track_outcomes
from .runtime.contract.config import load_config
from .runtime.contract.plugins import add_study, framework, study
from .runtime.contract.protocol import (
    Framework,
    ItemContext,
    RunOutcome,
    RunRequest,
    Study,
    request_model,
)
from .runtime.contract.results import ItemResult
from .runtime.execution.execute import execute, fixed_client
from .runtime.execution.solve import solve_item
from .runtime.store.manifest import RunSummary

__all__ = ["Evaluation", "ItemResult", "RunOutcome", "evaluate", "score_item"]


@dataclass(frozen=True)
class Evaluation:
    """What ``evaluate`` returns: every run of the study by its key (``""``: the only run of a
    plain framework), each with its directory, per-item results, summary and tables."""

    runs: dict[str, RunOutcome]
    log: str = ""  # what the run would have printed, kept instead (``evaluate(quiet=True)``)

    @property
    def only(self) -> RunOutcome:
        if len(self.runs) != 1:
            raise ValueError(f"{len(self.runs)} runs: pick one of {sorted(self.runs)}")
        return next(iter(self.runs.values()))

    @property
    def results(self) -> Sequence[ItemResult]:
        return self.only.results

    @property
    def summary(self) -> RunSummary | None:
        """The run's typed summary (None after a dry run, which records nothing)."""
        return self.only.summary

    @property
    def tables(self) -> dict[str, Any] | None:
        return self.only.tables

    @property
    def run_dir(self) -> Path:
        return self.only.dir


def evaluate(
    name: str | Study[Any],
    config: str | Path | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    evaluator: Mapping[str, Any] | None = None,
    roles: Mapping[str, str | Mapping[str, Any]] | None = None,
    run: Mapping[str, Any] | None = None,
    client: EvalClient | None = None,
    no_cache: bool = False,
    quiet: bool = True,
) -> Evaluation:
    """Run (or resume) framework or study ``name`` as ``groundcover eval NAME`` would; ``name``
    may be the ``Framework`` (or ``Study``) object itself, installed or not (its file's digest
    then enters the run's identity, as with ``groundcover eval FILE.py``).

    ``config``: a YAML file with the same sections, read first; the keyword sections override
    it field by field. ``roles``: ``{"judge": "MODEL@URL"}`` as ``--role`` takes them.
    ``client``: an open client that answers every role (a notebook's own ``EvalClient``);
    without it each role's model is connected or started as on the command line. ``quiet``:
    nothing is printed (what the command would print, its notes included, is kept in the
    result's ``log``). Bad input raises ``UserError`` with the same one line the command
    prints."""
    found = study(name) if isinstance(name, str) else add_study(name)
    overrides: dict[str, Any] = {}
    for section, values in (
        ("evaluator", evaluator),
        ("roles", roles),
        ("run", run),
        (found.name, options),
    ):
        for key, value in (values or {}).items():
            overrides[f"{section}.{key}"] = str(value) if isinstance(value, Path) else value
    request = request_from(found, Path(config) if config else None, overrides)
    opener = None if client is None else (lambda ev, run_dir: fixed_client(client))
    log = io.StringIO()
    with contextlib.ExitStack() as stack:
        if quiet:  # the runtime's consoles write to sys.stdout / sys.stderr as they are then
            stack.enter_context(contextlib.redirect_stdout(log))
            stack.enter_context(contextlib.redirect_stderr(log))
        outcomes = execute(found, request, no_cache=no_cache, quiet=quiet, open_client=opener)
        track_outcomes(outcomes, request)
    return Evaluation(outcomes, log.getvalue())


def request_from(found: Study, yaml_path: Path | None, overrides: dict[str, Any]) -> RunRequest:
    """The one way a run's configuration is built, for the command line and for ``evaluate``:
    the YAML file's sections, then dotted overrides (``evaluator.model``, ``<study>.input``),
    validated together; a dataset name given for a path becomes the catalogued file."""
    cfg: Any = load_config(request_model(found), yaml_path, overrides, (found.name,))
    options = resolve_names(getattr(cfg, found.name))
    return RunRequest(cfg.evaluator, cfg.run, options, dict(cfg.roles))


async def score_item(
    name: str,
    item: Any,
    clients: EvalClient | Mapping[str, EvalClient],
    options: Mapping[str, Any] | Any = None,
    *,
    resources: Any = None,
    run_dir: Path | None = None,
    answers: Mapping[str, str] | None = None,
) -> ItemResult:
    """One item scored outside a run, by the framework's own ``solve``: a stage that stays
    unparseable, or an error, is recorded in the result as a run records it. ``clients``: one
    client for every role, or one per role. ``options``: the framework's options (a mapping or
    its ``Options`` model); ``resources``: what the framework's ``setup`` returns, where it
    needs one (an index, an NLI scorer); ``answers``: answers made elsewhere (id -> answer),
    in place of the answering role, for a framework that reads an answers file."""
    fw: Framework = framework(name)
    if not isinstance(options, fw.Options):
        options = fw.Options.model_validate(dict(options or {}))
    ctx = ItemContext(
        str(item.id),
        clients if isinstance(clients, EvalClient) else dict(clients),
        options,
        resources,
        run_dir or Path("."),
        options.max_reasks,
        fw,
        answers,
    )
    return await solve_item(fw, item, ctx)
