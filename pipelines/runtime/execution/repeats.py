"""Judge variance (``--repeats K``): K runs of the same items, the judging roles sampled with seed
1..K at a temperature above 0, in ``repeat-1`` ... ``repeat-K`` under one root.

Each repeat is a whole run (its own records, resumable, reported on its own). Over them, per
item: the mean score and the between-repeat standard deviation; overall: the mean of the item
means with a 95% BCa interval, the mean between-repeat SD, the share of items whose score
changes from one repeat to another, and each repeat's mean. ``compare`` scores such a root by
its item means.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from ..contract.config import UserError
from ..contract.protocol import RunOutcome, RunPlan, RunRequest, Study
from ..contract.results import ItemResult
from ..contract.roles import SYSTEM_ROLES
from ..stats import bca_interval


def repeat_key(r: int) -> str:
    return f"repeat-{r}"


def repeat_plans(study: Study, request: RunRequest, plans: list[RunPlan]) -> list[RunPlan]:
    """The one run of ``plans``, K times, the judging roles seeded 1..K. The answering roles
    keep one seed, so every repeat judges the same answers."""
    k = request.run.repeats
    if len(plans) != 1 or plans[0].items is not None:
        raise UserError(
            f"--repeats: {study.name} makes {len(plans)} runs; repeats are for a study of one run"
        )
    (plan,) = plans
    fw: Any = plan.framework or study
    used = fw.roles_used(plan.options)
    judging = [role for role in used if role not in SYSTEM_ROLES]
    if not judging:
        raise UserError(f"--repeats: {study.name} asks no judging model")
    for role in judging:
        if request.role(role).temperature == 0:
            raise UserError(
                f"--repeats {k}: the {role} role samples at temperature 0, so every "
                "repeat would give the same judgement; set --temperature above 0"
            )
    fixed = {
        role: request.role(role).model_copy(update={"seed": 0})
        for role in used
        if role in SYSTEM_ROLES and request.role(role).temperature > 0
    }
    return [
        RunPlan(
            repeat_key(r),
            plan.task,
            plan.options,
            plan.framework,
            roles=fixed
            | {role: request.role(role).model_copy(update={"seed": r}) for role in judging},
            systems=plan.systems,
        )
        for r in range(1, k + 1)
    ]


def item_scores(runs: Iterable[Iterable[ItemResult]]) -> dict[str, list[float | None]]:
    """Per item id, its score in each repeat (None: recorded without a score, or missing)."""
    found: list[dict[str, float | None]] = [{r.id: r.score for r in run} for run in runs]
    ids = sorted(set().union(*found)) if found else []
    return {i: [run.get(i) for run in found] for i in ids}


def repeats_table(outcomes: dict[str, RunOutcome], resamples: int = 2000) -> dict[str, Any]:
    per_item = item_scores(o.results for o in outcomes.values())
    means, spreads, changed = [], [], 0
    rows: dict[str, dict[str, Any]] = {}  # per item: its scores, mean and between-repeat SD
    for item_id, scores in per_item.items():
        defined = [s for s in scores if s is not None]
        row: dict[str, Any] = {"scores": scores, "mean": None, "sd": None}
        if defined:
            row["mean"] = statistics.fmean(defined)
            means.append(row["mean"])
        if len(defined) > 1:
            row["sd"] = statistics.stdev(defined)
            spreads.append(row["sd"])
            changed += max(defined) - min(defined) > 1e-9
        rows[item_id] = row
    interval = bca_interval(means, resamples).as_dict() if len(means) > 1 else None
    return {
        "repeats": len(outcomes),
        "items": len(per_item),
        "scored_items": len(means),
        "mean_of_item_means": statistics.fmean(means) if means else None,
        "ci95": interval,
        "mean_between_repeat_sd": statistics.fmean(spreads) if spreads else None,
        "items_with_two_scores": len(spreads),
        "items_changed": changed,
        "repeat_means": {
            key: o.summary.mean_score if o.summary else None for key, o in outcomes.items()
        },
        "per_item": rows,
    }


def print_repeats(table: dict[str, Any], out: Console, top: int = 10) -> None:
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    grid = Table("", "value", title=f"judge variance over {table['repeats']} repeats")
    ci = table["ci95"]
    grid.add_row(
        "mean of item means",
        num(table["mean_of_item_means"]) + (f" [{ci['low']:.4f}, {ci['high']:.4f}]" if ci else ""),
    )
    grid.add_row("items scored (in some repeat)", f"{table['scored_items']} of {table['items']}")
    grid.add_row("mean between-repeat SD", num(table["mean_between_repeat_sd"]))
    grid.add_row(
        "items whose score changed", f"{table['items_changed']} of {table['items_with_two_scores']}"
    )
    for key, mean in table["repeat_means"].items():
        grid.add_row(f"{key} mean", num(mean))
    out.print(grid)
    spread = sorted((r["sd"], i) for i, r in table["per_item"].items() if r["sd"])[::-1][:top]
    if spread:
        items = Table("item", "scores", "mean", "SD", title="items the judge scored least alike")
        for sd, item_id in spread:
            row = table["per_item"][item_id]
            items.add_row(
                item_id, " ".join(num(s) for s in row["scores"]), num(row["mean"]), num(sd)
            )
        out.print(items)
