"""The ``groundcover`` command line: the groups, the plain commands of ``serve``, ``index``,
``data``, ``report``, ``audits``, ``pages``, ``people`` and ``finetune``, and every framework's
commands from the registry (``frameworks``: built when run, so ``--help`` imports no
framework)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from ..runtime.terminal import labelled, printable, terminal
from . import audits, finetune, pages, report, serve, trust
from .batch import batch_app
from .cache import cache_app
from .cluster import cluster_app
from .data import data_app
from .frameworks import lazy_group
from .index import index_app
from .options import clean_errors
from .people import labels_app

app = typer.Typer(
    cls=lazy_group(""),
    help="groundcover: grounding and coverage evaluation on a self-hosted vLLM stack.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def group(path: str, help: str) -> typer.Typer:
    """A command group whose framework commands come from the registry."""
    return typer.Typer(cls=lazy_group(path), help=help, no_args_is_help=True)


eval_app = group("eval", "Evaluate responses with one of the frameworks.")
reproduce_app = group("reproduce", "Reproduce a paper's tables (a grid of runs).")
meta_eval_app = group("meta-eval", "Meta-evaluate a metric against labels or human judgements.")
finetune_app = typer.Typer(
    cls=lazy_group("finetune"),
    help="Fine-tune models for the stack's stages.",
    no_args_is_help=True,
)
claims_app = group("finetune claims", "Claim extractors (ICAT's AC): data, training, evaluation.")
crux_app = group("crux", "CRUX evaluation data.")
app.add_typer(eval_app, name="eval")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(meta_eval_app, name="meta-eval")
finetune_app.add_typer(claims_app, name="claims")
app.add_typer(finetune_app, name="finetune")
app.add_typer(data_app, name="data")
app.add_typer(cache_app, name="cache")
app.add_typer(batch_app, name="batch")
app.add_typer(crux_app, name="crux")
app.add_typer(index_app, name="index")
app.add_typer(labels_app, name="labels")
app.add_typer(audits.cascade_app, name="cascade")
app.add_typer(cluster_app, name="cluster")
app.command()(serve.serve)
app.command()(report.report)
app.command()(report.compare)
app.command()(audits.agreement)
app.command()(pages.view)
app.command()(trust.trust)
claims_app.command("train")(finetune.finetune_claims_train)
claims_app.command("register")(finetune.finetune_claims_register)


# ---- registry and prompts --------------------------------------------------------------------


@app.command()
def models() -> None:
    """List model presets and registered LoRA adapters."""
    from ...serving.launch.registry import ADAPTER_PRESETS, PRESETS

    table = Table("max len", "dtype", "TP", "reasoning", "notes")
    table.columns.insert(0, Column("hub id", no_wrap=True))
    table.columns.insert(0, Column("name", no_wrap=True))
    for p in PRESETS.values():
        table.add_row(
            p.name,
            p.hub_id,
            str(p.max_model_len),
            p.dtype,
            str(p.tensor_parallel_size),
            f"{p.reasoning} ({p.reasoning_default})" if p.reasoning else "-",
            p.notes,
        )
    terminal().print(table)
    for preset in ADAPTER_PRESETS.values():
        terminal().print(
            f"adapter {preset.name}: base {preset.base}, rank {preset.rank} "
            f"(serve with --lora {preset.name}=PATH)"
        )
    from ...serving.launch.adapters import listing

    for entry in listing():  # trained and registered with `finetune claims register`
        name = entry["name"]
        terminal().print(
            f"registered adapter {name}: base {entry['base']}, rank {entry['rank']} "
            f"at {entry['path']} (serve with --lora {name})"
        )


def all_templates() -> dict[str, Any]:
    from ...serving.templates import REASK, load_dir

    templates = {REASK.name: REASK}
    for folder in sorted(Path(__file__).parents[1].rglob("prompts")):
        templates |= load_dir(folder)
    return templates


@app.command()
def prompts(name: Annotated[str | None, typer.Argument(help="print this template")] = None) -> None:
    """List the versioned prompt templates, or print one."""
    templates = all_templates()
    if name is None:
        for template in templates.values():  # shown, never acted on: a framework's file is data
            typer.echo(printable(f"{template.id}\t{template.path}"))
        return
    if name not in templates:
        terminal(stderr=True).print(
            labelled("error:", "red", f"no template {name!r}; have {', '.join(templates)}")
        )
        raise typer.Exit(2)
    typer.echo(printable(templates[name].text()))


@meta_eval_app.command("icat")
@clean_errors
def meta_eval_icat(
    run_dir: Annotated[Path, typer.Argument(help="an ICAT run directory")],
    human: Annotated[Path, typer.Option(help="JSONL: query_id, system, coverage in [0, 1]")],
    resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 2000,
) -> None:
    """Correlation of ICAT coverage (and ICAT_β) with human coverage, per variant: Pearson,
    Spearman, Kendall with p-values and paired BCa intervals (paper Table 2); writes
    icat-human.json into the run directory."""
    from ..icat.human import OUTPUT, render, validate

    console = terminal()
    render(validate(run_dir, human, resamples), console)
    console.print(f"written: {run_dir / OUTPUT}")


def main() -> None:  # pragma: no cover - console entry
    app()
