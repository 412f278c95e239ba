"""``groundcover labels``: a run's labelling queue out to an annotation tool, people's labels
back into the run (``labels/labels.jsonl``; the records never change)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.terminal import terminal
from .frameworks import lazy_group
from .options import FrameworkFiles, TrustFiles, clean_errors

labels_app = typer.Typer(
    cls=lazy_group("labels"),
    help="People's labels of a run: export its labelling queue to Label Studio or CSV, import "
    "their labels.",
    no_args_is_help=True,
)


@labels_app.command("export")
@clean_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    out: Annotated[Path, typer.Argument(help="tasks.json (Label Studio) or labels.csv")],
    format: Annotated[
        str | None, typer.Option(help="label-studio | csv (default: by OUT's suffix)")
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            help="a judging stage: its judgements to label (a CSV with id, stage, key, label; "
            "or Label Studio tasks with a control named label)"
        ),
    ] = None,
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """The run's labelling queue (from agreement --sample; every scored item without one) as
    Label Studio tasks with their labelling configuration, or a CSV to fill in; with --stage,
    every judgement of that stage the same two ways (what a judge cascade calibrates on, and
    decides its abstentions by). Blind: the judge's verdicts are not in it."""
    from ..reports.people.exchange import export_stage, export_tasks
    from ..runtime.contract.plugins import trust_files

    trust_files(framework_file, trust)
    kind = format or ("csv" if out.suffix.lower() == ".csv" else "label-studio")
    made = export_stage(run_dir, out, stage, kind) if stage else export_tasks(run_dir, out, kind)
    for path in made:
        terminal(stderr=True).print(f"export: {path}", highlight=False, soft_wrap=True)


@labels_app.command("import")
@clean_errors
def import_(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    file: Annotated[
        Path,
        typer.Argument(
            help="Label Studio's JSON export, or a labels CSV (items' scores; or judgements' "
            "labels: the columns id, stage, key, label, or tasks of labels export --stage)"
        ),
    ],
    annotator: Annotated[
        str | None, typer.Option(help="who labelled (default: the file's completed_by)")
    ] = None,
) -> None:
    """Append people's labels to the run (labels/labels.jsonl), each with the judge's verdict
    beside it; `groundcover agreement RUN` and `cascade calibrate` then use them, and a judge
    cascade's abstained judgements they label are decided by them."""
    from ..reports.people.exchange import import_labels

    found = import_labels(run_dir, file, annotator)
    terminal(stderr=True).print(f"labels: {found} added to {run_dir / 'labels'}", highlight=False)


@labels_app.command("queue")
@clean_errors
def queue(
    for_calibration: Annotated[
        Path,
        typer.Option(
            "--for-calibration",
            help="a cascade calibration (each tier's run) or one run (a tier of its own)",
        ),
    ],
    size: Annotated[int, typer.Option(help="judgements to draw per tier and stage")] = 20,
    seed: Annotated[int, typer.Option(help="the draw's seed")] = 0,
    stage: Annotated[str | None, typer.Option(help="only this stage")] = None,
    alpha: Annotated[float, typer.Option(help="for one run: the disagreement allowed")] = 0.1,
    delta: Annotated[float, typer.Option(help="for one run: the chance it may fail")] = 0.1,
) -> None:
    """Draw the next judgements to label for a cascade's thresholds: at random among those
    reaching each tier, unlabelled, at or above the lowest confidence that could still be kept
    (the band); each draw recorded with its band and seed in the tier's run
    (labels/calibration-draws.jsonl), walked through by view's labelling page."""
    from ..reports.audits.cascade import Guarantee
    from ..reports.audits.cascade_queue import draw_for_calibration, render_draws
    from ..runtime.contract.errors import UserError

    try:
        guarantee = Guarantee(alpha, delta)
    except ValueError as exc:
        raise UserError(f"--{exc}") from None
    made = draw_for_calibration(for_calibration, size, seed, guarantee, stage)
    render_draws(made, terminal(stderr=True))


@labels_app.command("override")
@clean_errors
def override(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    item: Annotated[str, typer.Argument(help="the item's id")],
    score: Annotated[
        float | None, typer.Option(help="the score a person gives it (0 to 1)")
    ] = None,
    reason: Annotated[str, typer.Option(help="why the judge was wrong here")] = "",
    annotator: Annotated[str, typer.Option(help="who overrides")] = "unknown",
    withdraw: Annotated[
        bool, typer.Option("--withdraw", help="take the item's override back")
    ] = False,
) -> None:
    """Override one item's verdict, with a reason, as a layer over the records (never a
    rewrite): report, the HTML headline and compare show the judge's mean and the
    overridden mean apart. --withdraw takes it back; the history stays."""
    from ..reports.people.overrides import add_override, withdraw_override
    from ..runtime.contract.errors import UserError
    from ..runtime.store.run_dir import RESULTS, results_by_id

    if withdraw:
        withdraw_override(run_dir, item, annotator)
        terminal(stderr=True).print(f"override of {item!r} withdrawn", highlight=False)
        return
    if score is None:
        raise UserError("give --score (0 to 1) or --withdraw")
    records = {r.id: r for r in results_by_id(run_dir / RESULTS)}
    found = add_override(run_dir, records, item, score, reason, annotator)
    terminal(stderr=True).print(
        f"override: {item!r} {found.judge} -> {found.score} ({reason})", highlight=False
    )
