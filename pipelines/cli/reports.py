"""`groundcover report`, `compare` and `view`: runs shown from what is on disk (no model calls)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..runtime.errors import UserError
from ..runtime.terminal import terminal
from .options import clean_errors
from .serve import api_key_from, authorised

console = Console(stderr=True)


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
) -> None:
    """Rebuild and print the summary and tables of runs from what is on disk (no model calls;
    partial runs too); optionally an HTML page (--html), every item's record (--export: CSV,
    Parquet or an inspect_ai log) and a tracker's runs (--track mlflow|wandb)."""
    from ..reports.export import export_format
    from ..reports.report import report as rebuild
    from ..runtime.costs import load_prices

    kind = export_format(export, format) if export is not None else None
    if track is not None and track not in ("mlflow", "wandb"):
        raise UserError(f"--track must be mlflow or wandb, got {track!r}")
    priced = load_prices(prices)
    rebuild(run_dir, as_json, terminal(), priced)
    if html is not None:
        from ..reports.report_html import write_html
        from ..runtime.runstore import run_directories

        written = write_html(run_directories(run_dir), page_path(html, run_dir), prices=priced)
        Console(stderr=True).print(f"html: {written}", highlight=False, soft_wrap=True)
    if export is not None and kind is not None:
        from ..reports.export import export_runs

        for path in export_runs(run_dir, export, kind):
            # a path is one line however long (a wrapped one cannot be pasted back)
            Console(stderr=True).print(f"export: {path}", highlight=False, soft_wrap=True)
    if track is not None:
        from ..reports.tracking import Tracking
        from ..reports.tracking import track as log_runs

        log_runs(run_dir, Tracking(track, track_uri, track_project))  # type: ignore[arg-type]


@clean_errors
def agreement(
    run_dir: Annotated[list[Path], typer.Argument(help="runs (or study roots) to read")],
    human: Annotated[
        Path | None,
        typer.Option(
            help="JSON Lines of human labels: {id, stage, label[, key]}; stage score "
            "labels an item's score"
        ),
    ] = None,
    human_sample: Annotated[
        int | None,
        typer.Option(help="use only N items' dataset labels for the score estimates (random)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    sample: Annotated[
        int | None,
        typer.Option(
            help="draw N items to label into RUN/labels/queue.jsonl and say the interval to "
            "expect (no agreement is computed)"
        ),
    ] = None,
    strategy: Annotated[
        str,
        typer.Option(help="with --sample: random | stratified | balanced (by the judge's verdict)"),
    ] = "stratified",
    seed: Annotated[
        int, typer.Option(help="with --sample or an audit that asks again: the draw's seed")
    ] = 0,
    bias: Annotated[
        bool,
        typer.Option(
            "--bias",
            help="also audit length bias: the score (and each panel stage, and the judge's "
            "error against human labels) against the judged answer's length",
        ),
    ] = False,
    swap_audit: Annotated[
        int | None,
        typer.Option(
            help="ask K of the run's model-decided comparisons of two texts of one kind again "
            "with the texts swapped and report the flip rate (only that is done)",
        ),
    ] = None,
    rerun: Annotated[
        int | None,
        typer.Option(
            help="self-consistency: ask K recorded judgements again of the same judge at its "
            "recorded sampling (the cache bypassed for them) and report the flip rate (only "
            "that is done)",
        ),
    ] = None,
    paraphrase: Annotated[
        int | None,
        typer.Option(
            help="rubric wording: ask K recorded judgements with each paraphrase the framework "
            "declares for their prompt and report the flips per paraphrase (only that is done)",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="with --swap-audit, --rerun or --paraphrase: the judge to ask (default: the "
            "run's, recorded)"
        ),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="with --swap-audit, --rerun or --paraphrase: where that judge is served "
            "(default: recorded)"
        ),
    ] = None,
) -> None:
    """How far to trust the judges: agreement within a judge panel (Cohen's kappa,
    Krippendorff's alpha, Kendall / Spearman, bootstrap intervals over items), between runs
    judged by different models, with human labels (--human: also the members' error
    correlation and the effective number of independent judges), and the mean score corrected
    by them (prediction-powered inference). Reads run directories only, except the audits that
    ask the judge again (--swap-audit, --rerun, --paraphrase)."""
    if sample is not None:
        from ..reports.labels import draw_for_runs

        draw_for_runs(run_dir, sample, strategy, seed, terminal())
        return
    audits = {"--swap-audit": swap_audit, "--rerun": rerun, "--paraphrase": paraphrase}
    asked = [name for name, k in audits.items() if k is not None]
    if len(asked) > 1:
        raise UserError(f"{' and '.join(asked)}: one audit at a time")
    if swap_audit is not None:
        audit_swaps(run_dir, swap_audit, seed, model, endpoint, as_json)
        return
    if rerun is not None or paraphrase is not None:
        kind = "rerun" if rerun is not None else "paraphrase"
        audit_reasks(run_dir, kind, rerun or paraphrase or 0, seed, model, endpoint, as_json)
        return
    from ..reports.agreement import agreement as measure
    from ..reports.agreement import render

    if human_sample is not None and human_sample < 1:
        raise UserError(f"--human-sample must be at least 1, got {human_sample}")
    found = measure(run_dir, human, human_sample)
    from ..reports.reask import recorded_audits

    for run in found["runs"]:  # the audits that asked the judge again, read back
        audits = recorded_audits(Path(run["run"]))
        if audits:
            run["audits"] = audits
    if bias:
        from ..reports.agreement import read_human
        from ..reports.bias import length_audit
        from ..runtime.runstore import run_directories

        labels = read_human(human) if human is not None else None
        found["bias"] = [length_audit(d, labels) for d in run_directories(run_dir)]
    if as_json:
        print(json.dumps(found, default=str))
        return
    render(found, terminal())
    if bias:
        from ..reports.bias import render_bias

        render_bias(found["bias"], terminal())


def page_path(html: Path, runs: list[Path]) -> Path:
    """Where ``--html`` writes the page: the path given, or (``--html`` alone) beside the first
    run or study directory, named after it."""
    if str(html) not in ("", "."):
        return html
    first = runs[0].resolve()
    return first.parent / f"{first.name}.html"


def audit_swaps(
    run_dir: list[Path], k: int, seed: int, model: str | None, endpoint: str | None, as_json: bool
) -> None:
    from ..reports.swap import audit_runs, render_swap

    if k < 1:
        raise UserError(f"--swap-audit must be at least 1, got {k}")
    found = audit_runs(run_dir, k, seed, model, endpoint)
    if as_json:
        print(json.dumps({"swap": found}, default=str))
    else:
        render_swap(found, terminal())
    unparseable = sum(run.get("unparseable", 0) for run in found)
    if unparseable:  # counted apart above; the command still says something is missing
        raise typer.Exit(1)


def audit_reasks(
    run_dir: list[Path],
    kind: str,
    k: int,
    seed: int,
    model: str | None,
    endpoint: str | None,
    as_json: bool,
) -> None:
    from ..reports.reask import audit_runs, render_reask

    if k < 1:
        raise UserError(f"--{kind} must be at least 1, got {k}")
    found = audit_runs(run_dir, kind, k, seed, model, endpoint)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps({kind: found}, default=str))
    else:
        render_reask(found, kind, terminal())  # type: ignore[arg-type]
    if sum(run.get("unparseable", 0) for run in found):  # counted apart; still missing
        raise typer.Exit(1)


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
) -> None:
    """Compare runs item by item: each run's mean with a 95% BCa interval; per pair the paired
    mean difference with a paired BCa interval, win/tie/loss, sign and Wilcoxon p-values, the
    largest per-item differences, and items only one run has. Runs of different frameworks or
    protocols are refused. No model is called."""
    from ..reports.compare import compare_runs, print_comparison, run_dirs

    if resamples < 100:
        raise UserError(f"--resamples {resamples}: use at least 100")
    result = compare_runs(run_dir, resamples, seed)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_comparison(result, terminal(), top)
    if html is not None:
        from ..reports.report_html import write_html

        pages = [page for run in result["runs"] for page in run_dirs(Path(run["run"]))]
        page = write_html(pages, page_path(html, run_dir), result)
        Console(stderr=True).print(f"html: {page}", highlight=False, soft_wrap=True)


@clean_errors
def view(
    run_dir: Annotated[list[Path], typer.Argument(help="run directories (or a study's root)")],
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8765,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    api_key_env: Annotated[
        str | None, typer.Option(help="variable holding the key (needed off loopback)")
    ] = None,
) -> None:
    """Serve the HTML report of the runs at http://127.0.0.1:PORT/ until Ctrl-C (rebuilt
    when a run changes on disk, so a running evaluation shows its progress; its items are
    filtered, searched and paged by the server), with a labelling page per run (/label?run=K:
    people's labels and overrides, written only from the page itself). Another --host needs a
    key, as `serve` does: a browser gives it as the password of the login it is asked for (any
    user name), a client as a Bearer token."""
    from ...serving.launcher import is_loopback
    from ..reports.report_html import render
    from ..reports.viewer import Viewer, serve

    key = api_key_from(api_key_env)
    if key is None and not is_loopback(host):
        raise UserError(
            f"--host {host} shows the runs beyond this machine: give it a key "
            "(--api-key-env NAME, the key in that variable)"
        )
    from ..runtime.runstore import run_directories

    run_dir = run_directories(run_dir)  # a study's root stands for its runs
    render(run_dir, served=True)  # bad run directories stop here, with one line
    allowed = None if key is None else (lambda header: authorised(header, key))
    serve(Viewer(run_dir), host, port, allowed, console.print)
