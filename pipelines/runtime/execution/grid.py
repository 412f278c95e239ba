"""A paper's results table as a grid: every answering model (a row) x the framework's own runs,
each cell an ordinary run under ``<root>/<model>/<run>/``, the paper's values beside ours.

A framework's ``reproduce`` command subclasses ``ModelGrid`` with its columns, how its tables
read as one flat row, and the published rows (matched to a model by name fragments).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console
from rich.table import Table

from ..contract.protocol import (
    Framework,
    OptionsT,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
)
from ..contract.roles import responder_config

Published = dict[str, dict[str, tuple[float, ...]]]  # run -> model fragment -> column values


def published_row(model: str, run: str, table: Published, columns: tuple[str, ...]) -> dict | None:
    """The first published row whose fragment's words all occur in the model's name (so list
    longer fragments first: "gpt-4-turbo" before "gpt-4")."""
    name = model.lower().replace("_", "-")
    for fragment, values in table.get(run, {}).items():
        if all(part in name for part in fragment.split()):
            return dict(zip(columns, values, strict=True))
    return None


class ModelGrid(Study[OptionsT]):
    """A paper's table as a grid: one run of ``framework`` per answering model (a row) x the
    framework's own runs, each row flattened to ``columns`` (``flat``) beside the published
    values (``paper``), titled ``title``; ``field`` names the framework's options inside the
    grid's."""

    framework: ClassVar[Framework]
    field: ClassVar[str]  # the framework's options inside the grid's options
    columns: ClassVar[tuple[str, ...]]  # keys of ``flat`` shown, in the paper's order
    title: ClassVar[str]

    def inner(self, options: OptionsT) -> Any:
        return getattr(options, self.field)

    def flat(self, tables: dict[str, Any] | None) -> dict[str, float | None]:
        """A run's tables as one row of ``columns`` (in the paper's units)."""
        raise NotImplementedError

    def paper(self, model: str, run: str) -> dict[str, float] | None:
        raise NotImplementedError

    def load(self, options: OptionsT) -> Any:
        return self.framework.load(self.inner(options))

    def check_inputs(self, options: OptionsT) -> None:
        self.framework.check_inputs(self.inner(options))

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        plans = []
        for spec in request.options.models:
            name, answerer = responder_config(spec, request.evaluator)
            inner = RunRequest(answerer, request.run, self.inner(request.options), request.roles)
            for plan in self.framework.plan(inner, root):
                key = f"{name}/{plan.key}" if plan.key else name
                plans.append(
                    RunPlan(
                        key,
                        plan.task,
                        plan.options,
                        framework=self.framework,
                        roles={"answer": answerer},
                    )
                )
        return plans

    def combine(self, outcomes: dict[str, RunOutcome], options: OptionsT) -> dict[str, Any]:
        rows = []
        for key, outcome in outcomes.items():
            model, _, run = key.partition("/")
            row: dict[str, Any] = {
                "model": model,
                "run": run,
                "n": (outcome.tables or {}).get("n"),
                "ours": self.flat(outcome.tables),
            }
            if (published := self.paper(model, run)) is not None:
                row["paper"] = published
            rows.append(row)
        data = getattr(self.inner(options), "input", None)
        return {"data": Path(str(data)).name if data else None, "rows": rows}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        table = Table(
            "model",
            "run",
            "n",
            *self.columns,
            title=f"{self.title}: ours on {combined['data']}; the paper's value in parentheses",
        )
        for row in combined["rows"]:
            ours, paper = row["ours"], row.get("paper") or {}
            cells = [cell_text(ours.get(c), paper.get(c)) for c in self.columns]
            table.add_row(row["model"], row["run"] or "-", str(row.get("n") or 0), *cells)
        console.print(table)


def cell_text(ours: float | None, paper: float | None) -> str:
    """Ours (``absent`` if not computed), the paper's value in parentheses where it has one."""
    text = "absent" if ours is None else f"{ours:.3f}"
    return text if paper is None else f"{text} ({paper:.3f})"
