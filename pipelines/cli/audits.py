"""`groundcover agreement`: how far to trust the judges (``reports.audits``), from run
directories, and the audits that ask the judge again (``--swap-audit``, ``--rerun``,
``--paraphrase``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import FrameworkFiles, TrustFiles, clean_errors


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
        typer.Option(
            help="with --sample: random | stratified | balanced (by the judge's verdict) | "
            "active (each item by the judge's confidence)"
        ),
    ] = "stratified",
    label_cost: Annotated[
        float | None,
        typer.Option(
            help="with --strategy active: what a person's label costs (with --judge-cost: "
            "the cost-optimal share of items labelled; --sample then caps it)"
        ),
    ] = None,
    judge_cost: Annotated[
        float | None,
        typer.Option(help="with --strategy active: what one judgement of the judge costs"),
    ] = None,
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
            "(default: recorded, and then sent no API key: $OPENAI_API_KEY goes only to an "
            "endpoint named here)"
        ),
    ] = None,
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """How far to trust the judges: agreement within a judge panel (Cohen's kappa,
    Krippendorff's alpha, Kendall / Spearman, bootstrap intervals over items), between runs
    judged by different models, with human labels (--human: also the members' error
    correlation and the effective number of independent judges), and the mean score corrected
    by them (prediction-powered inference). Reads run directories only, except the audits that
    ask the judge again (--swap-audit, --rerun, --paraphrase)."""
    from ..runtime.contract.plugins import trust_files

    trust_files(framework_file, trust)
    if (label_cost is None) != (judge_cost is None):
        raise UserError("--label-cost and --judge-cost: both or neither")
    costs = None
    if label_cost is not None and judge_cost is not None:
        if strategy != "active":
            raise UserError("--label-cost and --judge-cost: with --strategy active")
        from ..reports.people.active import Costs

        try:
            costs = Costs(judge_cost, label_cost)
        except ValueError as exc:
            raise UserError(f"--{exc}") from None
    if sample is not None or costs is not None:
        from ..reports.people.labels import draw_for_runs

        draw_for_runs(run_dir, sample, strategy, seed, terminal(), costs)
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
    from ..reports.audits.agreement import agreement as measure
    from ..reports.audits.agreement import render

    if human_sample is not None and human_sample < 1:
        raise UserError(f"--human-sample must be at least 1, got {human_sample}")
    found = measure(run_dir, human, human_sample)
    from ..reports.audits.reask import recorded_audits

    for run in found["runs"]:  # the audits that asked the judge again, read back
        audits = recorded_audits(Path(run["run"]))
        if audits:
            run["audits"] = audits
    if bias:
        from ..reports.audits.agreement import read_human
        from ..reports.audits.bias import length_audit
        from ..runtime.store.run_dir import run_directories

        runs = run_directories(run_dir)
        labels = read_human(human, runs) if human is not None else None
        found["bias"] = [length_audit(d, labels) for d in runs]
    if as_json:
        print(json.dumps(found, default=str))
        return
    render(found, terminal())
    if bias:
        from ..reports.audits.bias import render_bias

        render_bias(found["bias"], terminal())


def audit_swaps(
    run_dir: list[Path], k: int, seed: int, model: str | None, endpoint: str | None, as_json: bool
) -> None:
    from ..reports.audits.swap import audit_runs, render_swap

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
    from ..reports.audits.reask import audit_runs, render_reask

    if k < 1:
        raise UserError(f"--{kind} must be at least 1, got {k}")
    found = audit_runs(run_dir, kind, k, seed, model, endpoint)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps({kind: found}, default=str))
    else:
        render_reask(found, kind, terminal())  # type: ignore[arg-type]
    if sum(run.get("unparseable", 0) for run in found):  # counted apart; still missing
        raise typer.Exit(1)


cascade_app = typer.Typer(
    help="Trust or escalate: judges in tiers, cheapest first, each trusted above a confidence "
    "threshold calibrated on human labels (agreement at least 1 - alpha with probability at "
    "least 1 - delta).",
    no_args_is_help=True,
)


@cascade_app.command("calibrate")
@clean_errors
def cascade_calibrate(
    run_dir: Annotated[
        list[Path],
        typer.Argument(help="one recorded run per tier, cheapest first, over the same items"),
    ],
    alpha: Annotated[float, typer.Option(help="the disagreement with people allowed")] = 0.1,
    delta: Annotated[float, typer.Option(help="the chance the guarantee may fail")] = 0.1,
    human: Annotated[
        Path | None,
        typer.Option(
            help="JSON Lines of human labels {id, stage, label[, key]} (beside the "
            "run's own and its dataset's)"
        ),
    ] = None,
    check_share: Annotated[
        float, typer.Option(help="the share of labelled items kept apart to check the result")
    ] = 0.3,
    seed: Annotated[int, typer.Option(help="which items are kept apart")] = 0,
    grid: Annotated[
        str,
        typer.Option(
            help="which thresholds are tested: steps (where the exact test first allows one "
            "more disagreement) | every (each distinct confidence)"
        ),
    ] = "steps",
    out: Annotated[
        Path | None,
        typer.Option(help="where the calibration goes (default: LAST_RUN/cascade/)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    framework_file: FrameworkFiles = None,
    trust: TrustFiles = False,
) -> None:
    """Each tier's confidence threshold from its recorded run (confidence: the share of its
    panel -- K samples or K paraphrased prompts of one model -- that gave the verdict) by
    fixed-sequence testing with the exact binomial bound; checked on the labels kept apart;
    what the cascade would ask of each tier. Written as a file known by its SHA-256."""
    from ..reports.audits.agreement import read_human
    from ..reports.audits.cascade import (
        GRIDS,
        Guarantee,
        calibrate_runs,
        content_digest,
        read_tier,
        render,
    )
    from ..runtime.contract.cascade import NLI_TIER
    from ..runtime.contract.plugins import trust_files

    if not 0 <= check_share < 1:
        raise UserError(f"--check-share {check_share}: want a share from 0 to below 1")
    try:
        guarantee = Guarantee(alpha, delta)
    except ValueError as exc:
        raise UserError(f"--{exc}") from None
    if grid not in GRIDS:
        raise UserError(f"--grid {grid}: want one of {', '.join(GRIDS)}")
    trust_files(framework_file, trust)
    labels = read_human(human, run_dir) if human is not None else None
    tiers = [read_tier(d, labels) for d in run_dir]
    for directory, tier in list(zip(run_dir, tiers, strict=True))[1:]:
        if tier.members == [NLI_TIER]:
            raise UserError(
                f"{directory}: its pairs were scored by an NLI model: an NLI model is the "
                "cascade's tier 1, give its run first"
            )
    made = calibrate_runs(tiers, guarantee, check_share, seed, GRIDS[grid])
    if not made["stages"]:  # nothing to calibrate: no file, one line saying why
        had = "; ".join(
            f"{d}: {', '.join(sorted(t.units)) or 'none'}"
            for d, t in zip(run_dir, tiers, strict=True)
        )
        raise UserError(
            "cascade calibrate: no label or rating stage has a confidence in every tier's run "
            f"({had}); a panel records its members' share, a lone judge or an NLI model its "
            "probability with --confidence logprobs"
        )
    made["sha256"] = content_digest(made)
    from ...serving.files import make_dirs, write_atomic

    folder = out or run_dir[-1] / "cascade"
    make_dirs(folder, within=None if out else run_dir[-1])  # in the run: cascade/ not a link
    path = folder / f"calibration-{made['sha256'][:12]}.json"  # a name made here
    write_atomic(path, json.dumps(made, indent=1, ensure_ascii=False) + "\n", within=folder)
    if as_json:
        print(json.dumps(made | {"file": str(path)}, ensure_ascii=False))
        return
    console = terminal()
    render(made, console)
    console.print(f"calibration {made['sha256'][:12]} written to {path}")
