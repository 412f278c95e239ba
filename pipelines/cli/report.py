"""`groundcover report` and `compare`: runs rebuilt and compared from what is on disk (no model
calls); ``--html`` writes the page (``reports.pages``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import FrameworkFiles, TrustFiles, clean_errors

console = terminal(stderr=True)


@clean_errors
def report(
    run_dir: Annotated[list[Path], typer.Argument(help="run directories (or a study's root)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per run")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            help="also write one self-contained HTML page to this file (--html alone: beside "
            "the run, RUN.html)"
        ),
    ] = None,
    export: Annotated[
        Path | None,
        typer.Option(
            help="also write every item's record: FILE.csv or FILE.parquet (flat, with "
            "FILE.tables.json beside), FILE.eval or FILE.json (an inspect_ai log)"
        ),
    ] = None,
    format: Annotated[
        str | None,
        typer.Option(help="export format: csv | parquet | inspect (default: by FILE's suffix)"),
    ] = None,
    prices: Annotated[
        Path | None, typer.Option(help="YAML: model -> $ per million tokens or GPU-hour")
    ] = None,
    track: Annotated[
        str | None, typer.Option(help="also log the runs to mlflow or wandb (as --track of eval)")
    ] = None,
    track_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (default ./mlruns) or W&B directory")
    ] = None,
    track_project: Annotated[
        str, typer.Option(help="the MLflow experiment or W&B project")
    ] = "groundcover",
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """Rebuild and print the summary and tables of runs from what is on disk (no model calls;
    partial runs too); optionally an HTML page (--html), every item's record (--export: CSV,
    Parquet or an inspect_ai log) and a tracker's runs (--track mlflow|wandb)."""
    from ..runtime.contract.plugins import trust_files

    trust_files(framework_file, trust)
    from ..reports.exports.export import export_format
    from ..reports.report import report as rebuild
    from ..runtime.budget.costs import load_prices

    kind = export_format(export, format) if export is not None else None
    if track is not None and track not in ("mlflow", "wandb"):
        raise UserError(f"--track must be mlflow or wandb, got {track!r}")
    priced = load_prices(prices)
    check_outputs(run_dir, html, export, kind)
    rebuild(run_dir, as_json, terminal(), priced)
    if html is not None:
        from ..reports.pages.report_html import write_html
        from ..runtime.store.run_dir import run_directories

        out, within = page_path(html, run_dir)
        written = write_html(run_directories(run_dir), out, prices=priced, within=within)
        terminal(stderr=True).print(f"html: {written}", highlight=False, soft_wrap=True)
    if export is not None and kind is not None:
        from ..reports.exports.export import export_runs

        for path in export_runs(run_dir, export, kind):
            # a path is one line however long (a wrapped one cannot be pasted back)
            terminal(stderr=True).print(f"export: {path}", highlight=False, soft_wrap=True)
    if track is not None:
        from ..reports.exports.tracking import Tracking
        from ..reports.exports.tracking import track as log_runs

        log_runs(run_dir, Tracking(track, track_uri, track_project))  # type: ignore[arg-type]


def check_outputs(
    runs: list[Path], html: Path | None, export: Path | None = None, kind: str | None = None
) -> None:
    """A name made here for an output (the page beside the run, the tables beside an export)
    that is a link, or an output whose folder is not there, is refused in one line before
    anything is read or printed."""
    from ...serving.files import NoFolder, check_within
    from ..reports.exports.export import made_beside

    typed = [export]
    if html is not None:
        out, within = page_path(html, runs)
        if within is not None:
            check_within(out, within)
        else:
            typed.append(out)
    if export is not None and kind is not None:
        for made in made_beside(export, kind):
            check_within(made, export.parent)
    for path in typed:
        if path is not None and not path.parent.is_dir():  # said before anything is printed
            raise NoFolder(f"{path}: no folder {path.parent} to write it in")


def page_path(html: Path, runs: list[Path]) -> tuple[Path, Path | None]:
    """Where ``--html`` writes the page, and the folder a link at it is refused in: the path
    given (the user's: no such folder), or (``--html`` alone) beside the first run or study
    directory, named after it (a name the user never typed: a link there is refused)."""
    if str(html) not in ("", "."):
        return html, None
    # as typed, not resolved: a run that is a link (a sent bundle's run -> a run of the reader's
    # elsewhere) has its page beside the link, never beside where the link leads
    first = Path(os.path.abspath(runs[0]))
    return first.parent / f"{first.name}.html", first.parent


@clean_errors
def compare(
    run_dir: Annotated[list[Path], typer.Argument(help="two or more runs over the same items")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            help="also write an HTML page: this comparison, then each run (--html alone: "
            "beside the first run)"
        ),
    ] = None,
    top: Annotated[int, typer.Option(help="largest per-item differences printed per pair")] = 10,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 10_000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """Compare runs item by item: each run's mean with a 95% BCa interval; per pair the paired
    mean difference with a paired BCa interval, win/tie/loss, sign and Wilcoxon p-values, the
    largest per-item differences, and items only one run has. Runs of different frameworks or
    protocols are refused. No model is called."""
    from ..runtime.contract.plugins import trust_files

    trust_files(framework_file, trust)
    from ..reports.compare import compare_runs, print_comparison, run_dirs

    if resamples < 100:
        raise UserError(f"--resamples {resamples}: use at least 100")
    check_outputs(run_dir, html)
    result = compare_runs(run_dir, resamples, seed)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_comparison(result, terminal(), top)
    if html is not None:
        from ..reports.pages.report_html import write_html

        pages = [page for run in result["runs"] for page in run_dirs(Path(run["run"]))]
        out, within = page_path(html, run_dir)
        page = write_html(pages, out, result, within=within)
        terminal(stderr=True).print(f"html: {page}", highlight=False, soft_wrap=True)
