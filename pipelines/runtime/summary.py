"""A run's summary: status counts, mean score, usage and cost of its records, computed at the
end of every invocation (and by ``report``), and the tables printed after it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from .records import RunSummary
from .results import FAILED_STATUSES, STATUSES, ItemResult
from .runstore import invocation_seconds

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .protocol import Framework, RunOutcome
    from .running import Run, Solving
    from .runstore import RunStore

# reasoning_tokens: the part of completion_tokens a reasoning model spent reasoning
# attempts at the endpoint = requests + retries + failures (each failed attempt is retried or final)
USAGE_KEYS = (
    "calls",
    "requests",
    "cache_hits",
    "retries",
    "failures",
    "backoff_seconds",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
)


def summarise(framework: str, task: str, n_items: int, results: Iterable[ItemResult]) -> RunSummary:
    """Status counts over every item and the mean score over the scored ones, in one pass."""
    statuses = dict.fromkeys(STATUSES, 0)
    scores = []
    failed = []
    for r in results:
        statuses[r.status] += 1
        if r.score is not None:
            scores.append(r.score)
        if r.status in FAILED_STATUSES:
            failed.append(r.id)
    recorded = sum(statuses.values())
    summary = RunSummary(
        framework=framework,
        task=task,
        items=n_items,
        recorded=recorded,
        partial=recorded < n_items,
        statuses=statuses,
    )
    if scores:  # over items with a defined score; every status is counted above
        summary.add(mean_score=sum(scores) / len(scores), scored_items=len(scores))
    if failed:
        shown = sorted(failed)[:FAILED_SHOWN]
        by_status = {s: statuses[s] for s in FAILED_STATUSES if statuses[s]}
        summary.add(failed={"count": len(failed), "by_status": by_status, "ids": shown})
    return summary


FAILED_SHOWN = 50  # failed ids a summary lists (the count is always whole)


def failed_line(failed: dict[str, Any], where: str) -> str:
    """One line naming a run's failed items and how to retry just those."""
    kinds = ", ".join(f"{s} {n}" for s, n in failed["by_status"].items())
    ids = ", ".join(failed["ids"]) + (" ..." if failed["count"] > len(failed["ids"]) else "")
    return (
        f"{where}: {failed['count']} items failed ({kinds}): {ids}; the same command retries "
        "just those"
    )


def recorded_usage(results: Iterable[ItemResult]) -> dict[str, dict[str, float]]:
    """Model usage per stage summed over the recorded items (what the results cost)."""
    total: dict[str, dict[str, float]] = {}
    for result in results:
        for stage, usage in result.usage.items():
            into = total.setdefault(stage, dict.fromkeys(USAGE_KEYS, 0))
            for key in USAGE_KEYS:
                into[key] += usage.get(key, 0)
    return total


def recorded_cost(
    fw: Framework[Any, Any],
    usage: dict[str, dict[str, Any]],
    roles: dict[str, dict[str, Any]],
    prices: dict[str, Any],
    run_dir: Path,
) -> dict[str, Any]:
    """What a run's recorded items cost: their usage, and the GPU time of every invocation."""
    from .costs import cost_table

    return cost_table(fw, usage, roles, prices, invocation_seconds(run_dir))


def usage_by_role(
    fw: Framework[Any, Any], usage: dict[str, dict[str, Any]], roles: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per-stage usage summed per role (the framework's stage_roles), each with its model."""
    out: dict[str, dict[str, Any]] = {}
    for stage, u in usage.items():
        role = fw.role_of(stage, "unknown")  # "unknown": a stage an older version recorded
        into = out.setdefault(
            role,
            {"model": (roles.get(role) or {}).get("request_model"), **dict.fromkeys(USAGE_KEYS, 0)},
        )
        for key in USAGE_KEYS:
            into[key] += u.get(key, 0)
    return out


def usage_cell(key: str, value: float) -> str:
    return f"{value:.1f}" if key.endswith("seconds") else str(round(value))


def print_summary(summary: RunSummary, out: Console) -> None:
    if summary.failed:  # first: a run with failed items is not a clean run
        out.print(f"[red]FAILED[/red] {failed_line(summary.failed, summary.task)}", soft_wrap=True)
    title = f"{summary.task}: {summary.recorded}/{summary.items} recorded"
    if summary.partial:
        title += " (partial run)"
    table = Table("status", "items", title=title)
    for status, count in summary.statuses.items():
        if count:
            table.add_row(status, str(count))
    out.print(table)
    if summary.mean_score is not None:
        out.print(f"mean score {summary.mean_score:.4f} over {summary.scored_items} scored items")
    for usage, title in (
        (summary.usage_this_invocation, "model usage (this invocation)"),
        (summary.usage_recorded, "model usage (recorded items)"),
    ):
        if usage:
            stages = Table("stage", *(k.replace("_", " ") for k in USAGE_KEYS), title=title)
            for stage, u in usage.items():
                stages.add_row(stage, *(usage_cell(k, u.get(k, 0)) for k in USAGE_KEYS))
            out.print(stages)
    this_invocation = "usage_by_role_this_invocation" in summary.model_fields_set
    by_role = summary.usage_by_role_this_invocation if this_invocation else summary.usage_by_role
    if by_role:
        title = "model usage by role" + (" (this invocation)" if this_invocation else "")
        roles = Table("role", "model", *(k.replace("_", " ") for k in USAGE_KEYS), title=title)
        for role, u in by_role.items():
            roles.add_row(
                role, str(u.get("model") or "-"), *(usage_cell(k, u.get(k, 0)) for k in USAGE_KEYS)
            )
        out.print(roles)
    for cost, title in (
        (summary.cost_this_invocation, "cost in $ (this invocation)"),
        (summary.cost_recorded, "cost in $ (recorded items)"),
    ):
        if cost:
            print_cost(cost, title, out)
    if summary.drivers_this_invocation:
        print_drivers(summary.drivers_this_invocation, out)
    if summary.budget_stop:
        out.print(f"budget: stopped admitting items ({summary.budget_stop})")
    for pair in summary.self_judging:
        out.print(
            f"self-judging: the {pair['judge']} role is the {pair['system']} model {pair['model']}"
        )


def print_cost(cost: dict[str, Any], title: str, out: Console) -> None:
    table = Table("role / stage", "$", title=title)
    for role, dollars in cost["by_role"].items():
        table.add_row(f"role {role}", f"{dollars:.4f}")
    for stage, dollars in cost["by_stage"].items():
        table.add_row(f"  stage {stage}", f"{dollars:.4f}")
    table.add_row("total", f"{cost['total']:.4f}")
    out.print(table)
    if cost["unpriced"]:
        out.print(f"no price for {', '.join(cost['unpriced'])}: not in the total")


def records_for_tables(
    fw: Framework[Any, Any], options: BaseModel, records: Sequence[ItemResult]
) -> Sequence[ItemResult]:
    """A framework with tables gets its records parsed once, as a list (its aggregate makes
    many passes); one without keeps them on disk, read when used (a 100,000-item run)."""
    return list(records) if fw.tables_file(options) is not None else records


def tables_of(
    fw: Framework[Any, Any], options: BaseModel, results: Sequence[ItemResult]
) -> dict[str, Any] | None:
    """The framework's tables (None for a framework or options without tables)."""
    if fw.tables_file(options) is None:
        return None
    # records_for_tables gave a list to a framework with tables; a plain sequence is read once
    return fw.aggregate(results if isinstance(results, list) else list(results), options)


def print_drivers(rows: list[dict[str, Any]], out: Console) -> None:
    """What each driver of a ``--drivers N`` invocation did, and on which node."""
    table = Table(
        "driver", "node", "items", "calls", "calls/s", "restarts", title="drivers (this invocation)"
    )
    for row in rows:
        rate = row.get("calls_per_s")
        table.add_row(
            str(row["driver"]),
            f"{row['ip']} {str(row['node'])[:12]}",
            str(row["items"]),
            str(row["calls"]),
            "-" if rate is None else f"{rate:.1f}",
            str(row.get("restarts", 0)),
        )
    out.print(table)


def summarise_run(
    run: Run, store: RunStore, ids: list[str], solving: Solving | None, started: float
) -> RunOutcome:
    """The run's last step: its records in id order (tables and bootstrap intervals equal what
    ``report`` rebuilds), its summary with what this invocation used and cost, written and
    printed; ``BudgetReached`` when a cap stopped it with items left."""
    import time

    from .costs import BudgetReached, cost_table
    from .estimate import print_estimate
    from .planning import estimate_from_disk
    from .protocol import RunOutcome

    fw, plan, planned = run.fw, run.plan, run.planned
    results = records_for_tables(fw, plan.options, store.results(sorted(ids)))
    tables = tables_of(fw, plan.options, results)
    summary = summarise(fw.name, plan.task, len(run.items), results)
    solved = solving.solved if solving is not None else None
    usage = solved.usage if solved is not None else {}
    summary.add(
        usage_this_invocation=usage,
        usage_by_role_this_invocation=usage_by_role(fw, usage, store.manifest().roles),
        self_judging=run.self_judging,
        concurrency_this_invocation=solved.limits if solved is not None else {},
        seconds_this_invocation=round(time.time() - started, 3),
    )
    if solved is not None and solved.where is not None:  # which replicas answered the NLI
        summary.add(nli_placement_this_invocation=solved.where)
    if solved is not None and solved.spread:  # requests over the replicas the run started
        summary.add(replicas_this_invocation=solved.spread)
    if solving is not None and solving.drivers is not None:  # --drivers N: each one's work
        summary.add(drivers_this_invocation=solving.drivers)
    if planned.prices:
        seconds = summary.seconds_this_invocation or 0.0
        summary.add(
            cost_this_invocation=cost_table(fw, usage, run.records, planned.prices, seconds),
            cost_recorded=recorded_cost(
                fw, recorded_usage(results), run.records, planned.prices, store.dir
            ),
        )
    remaining = len(store.pending(ids))
    budget = solving.budget if solving is not None else None
    if budget is not None and budget.stopped and remaining:
        summary.add(budget_stop=budget.stopped)
    if run.pilot is not None:  # what the rest will ask, from every item recorded so far
        derived = len(planned.items) if plan.items is not None else None
        summary.add(
            estimate_of_the_rest=estimate_from_disk(
                fw, plan.options, store.dir, run.items, ids, run.records, planned.prices, derived
            )
        )
    store.write_summary(summary)
    name = fw.tables_file(plan.options)
    if tables is not None and name:
        from .runstore import atomic_write_json

        atomic_write_json(store.dir / name, tables)
    print_summary(summary, Console())
    if tables is not None:
        fw.render(tables, Console())
    if run.pilot is not None:
        label = f"after the pilot, {store.dir}"
        print_estimate(label, summary.estimate_of_the_rest or {}, Console())
    if summary.budget_stop:
        raise BudgetReached(
            f"{store.dir}: stopped admitting items ({summary.budget_stop}); {remaining} of "
            f"{len(run.items)} items remain: rerun with a higher cap to resume"
        )
    return RunOutcome(store.dir, results, tables, summary, fw)
