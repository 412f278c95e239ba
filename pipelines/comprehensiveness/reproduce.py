"""Reproducing the paper's meta-evaluation: a model x method grid on WikiContradict and
ConflictBank, printed in the layout of Figures 3-5 with the published values beside ours.

Each cell (model, method, dataset) is an ordinary meta-evaluation run in its own directory under
the study root, so an interrupted grid resumes cell by cell (and item by item inside a cell).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import InputFile, RunOutcome, RunPlan, RunRequest, Study
from groundcover.inputs import NotContent
from groundcover.models import EvaluatorConfig, responder_config

from . import meta
from .common import (
    DEFAULT_DATA,
    ComprehensivenessOptions,
    Item,
    Method,
)
from .framework import COMPREHENSIVENESS

# Published values we know exactly (SPEC §1): (model name fragment, method) -> figure values.
PAPER_VALUES: dict[tuple[str, str], dict[str, float]] = {
    ("gpt-oss-20b", "qa"): {"wikicontradict": 0.745, "conflictbank": 0.876, "average": 0.811},
    ("llama-4-maverick", "e2e"): {"average": 0.8545},
}


# How the paper's appendix ran its evaluators (paper protocol): the gpt-oss models at reasoning
# effort medium and without the units tool (its engine had no tool calls in their format), the
# Llama and Qwen models with the tool. Model name fragment -> settings.
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "gpt-oss": {"reasoning": "medium", "tools": False},
    "llama": {"tools": True},
    "qwen": {"tools": True},
}


def paper_settings(model: str) -> dict[str, Any]:
    """The appendix's settings for an evaluator (none for a model the paper did not run)."""
    name = model.lower()
    return next((s for fragment, s in PAPER_SETTINGS.items() if fragment in name), {})


def paper_value(model: str, method: str, column: str) -> float | None:
    name = model.lower().replace("_", "-")
    for (fragment, m), values in PAPER_VALUES.items():
        if m == method and fragment in name:
            return values.get(column)
    return None


class ReproduceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: Annotated[
        list[str], NotContent("each becomes a role's model, known by its revision")
    ] = Field(min_length=1, description="MODEL or MODEL@URL, one per grid row")
    methods: list[Method] = Field(
        default=["nli", "qa", "e2e"], min_length=1, description="the grid's methods"
    )
    wikicontradict: InputFile | None = Field(
        None, description="file or dataset name (wikicontradict-humaneval)"
    )
    conflictbank: InputFile | None = Field(None, description="file or dataset name (conflictbank)")
    metric: ComprehensivenessOptions = Field(default_factory=ComprehensivenessOptions)

    @model_validator(mode="after")
    def _default_data(self) -> ReproduceOptions:
        """Neither dataset given: both, by their catalogue names (the paper's grid)."""
        if self.wikicontradict is None and self.conflictbank is None:
            self.wikicontradict = Path(DEFAULT_DATA["wikicontradict"])
            self.conflictbank = Path(DEFAULT_DATA["conflictbank"])
        return self


def _datasets(options: ReproduceOptions) -> dict[str, Path]:
    found = {"wikicontradict": options.wikicontradict, "conflictbank": options.conflictbank}
    return {name: path for name, path in found.items() if path is not None}


def _cell_options(
    options: ReproduceOptions, dataset: str, method: str | None = None
) -> ComprehensivenessOptions:
    update = {"dataset": dataset, "input": _datasets(options)[dataset]}
    return options.metric.model_copy(update=update | ({"method": method} if method else {}))


def _items_of(items: dict[str, Any], dataset: str, outcomes: dict[str, RunOutcome]) -> Any:
    return items[dataset]


def _cell(model: str, method: str, dataset: str) -> str:
    return f"{model}/{method}/{dataset}"


class Reproduce(Study[ReproduceOptions]):
    name = "reproduce-comprehensiveness"
    Options = ReproduceOptions

    def load(self, options: ReproduceOptions) -> list[Item]:
        """Every dataset's items (read now, so a bad file stops the grid before any call)."""
        return [
            item
            for dataset in _datasets(options)
            for item in COMPREHENSIVENESS.load(_cell_options(options, dataset))
        ]

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        options: ReproduceOptions = request.options
        items = {d: COMPREHENSIVENESS.load(_cell_options(options, d)) for d in _datasets(options)}
        plans = []
        paper = options.metric.rules.appendix_evaluator_settings
        for spec in options.models:
            name, evaluator = responder_config(spec, request.evaluator)
            settings = paper_settings(evaluator.model) if paper else {}
            if "reasoning" in settings and evaluator.reasoning is None:
                evaluator = evaluator.model_copy(update={"reasoning": settings["reasoning"]})
            for method in options.methods:
                for dataset in _datasets(options):
                    cell = _cell_options(options, dataset, method)
                    if "tools" in settings:
                        cell = cell.model_copy(update={"tools": settings["tools"]})
                    cell_items = functools.partial(_items_of, items, dataset)
                    plans.append(
                        RunPlan(
                            _cell(name, method, dataset),
                            f"meta-{dataset}-{method}",
                            cell,
                            framework=COMPREHENSIVENESS,
                            roles={"judge": evaluator},
                            items=cell_items,
                        )
                    )
        return plans

    def combine(self, outcomes: dict[str, RunOutcome], options: ReproduceOptions) -> dict:
        protocol, resamples = options.metric.protocol, options.metric.resamples
        rows = []
        for spec in options.models:
            name, _ = responder_config(spec, EvaluatorConfig())
            for method in options.methods:
                row: dict[str, Any] = {"model": name, "method": method}
                if options.metric.rules.appendix_evaluator_settings:
                    row["settings"] = paper_settings(name)
                wc = outcomes.get(_cell(name, method, "wikicontradict"))
                cb = outcomes.get(_cell(name, method, "conflictbank"))
                if wc is not None and wc.results:
                    row["wikicontradict"] = _entry(wc.tables)
                if cb is not None and cb.tables and cb.tables.get("lmr") is not None:
                    extra = ("strict", "lax", "moderate", "main")
                    row["conflictbank"] = _entry(cb.tables) | {
                        k: cb.tables[k] for k in extra if k in cb.tables
                    }
                if "wikicontradict" in row and "conflictbank" in row:
                    rules = options.metric.rules
                    wc_values = meta.wc_matches(wc.results, rules)  # type: ignore[union-attr]
                    terms = meta.cb_terms(cb.results, rules)["terms"]  # type: ignore[union-attr]
                    cb_values = [(strict + lax) / 2 for _, strict, lax, _ in terms]
                    row["average"] = meta.combined_lmr(wc_values, cb_values, resamples)
                for column in ("wikicontradict", "conflictbank", "average"):
                    published = paper_value(name, method, column)
                    if published is not None:
                        row.setdefault("paper", {})[column] = published
                rows.append(row)
        return {"protocol": protocol, "rows": rows}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        table = Table(
            "model",
            "method",
            "WikiContradict LMR",
            "ConflictBank strict / lax (moderate; main)",
            "ConflictBank LMR",
            "average",
            title=f"Comprehensiveness meta-evaluation ({combined['protocol']} protocol; "
            "paper value in parentheses)",
        )
        for row in combined["rows"]:
            paper = row.get("paper", {})
            cb = row.get("conflictbank")
            split = _split_text(cb)
            settings = row.get("settings") or {}
            shown = ", ".join(
                ([f"effort {settings['reasoning']}"] if "reasoning" in settings else [])
                + ([f"tool {'on' if settings['tools'] else 'off'}"] if "tools" in settings else [])
            )
            table.add_row(
                f"{row['model']} ({shown})" if shown else row["model"],
                row["method"],
                _cell_text(row.get("wikicontradict"), paper.get("wikicontradict")),
                split,
                _cell_text(cb, paper.get("conflictbank")),
                _cell_text(row.get("average"), paper.get("average")),
            )
        console.print(table)


def _split_text(cb: dict[str, Any] | None) -> str:
    """strict / lax, and the reference code's moderate and main scores where computed."""
    if not cb:
        return "-"
    text = f"{cb['strict']:.3f} / {cb['lax']:.3f}"
    if "main" in cb:
        text += f" ({cb['moderate']:.3f}; {cb['main']:.3f})"
    return text


def _entry(tables: dict[str, Any] | None) -> dict[str, Any]:
    tables = tables or {}
    return {"lmr": tables.get("lmr"), "ci95": tables.get("ci95")}


def _cell_text(entry: dict[str, Any] | None, published: float | None) -> str:
    if not entry or entry.get("lmr") is None:
        text = "-"
    else:
        ci = entry.get("ci95") or {}
        text = f"{entry['lmr']:.3f}"
        if ci:
            text += f" [{ci['low']:.3f}, {ci['high']:.3f}]"
    return text + (f" ({published:g})" if published is not None else "")


REPRODUCE = Reproduce()
