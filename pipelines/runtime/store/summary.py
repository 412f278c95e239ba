"""A run's summary: status counts, mean score, usage and cost of its records, computed at the
end of every invocation (and by ``report``), and the tables printed after it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..contract.results import FAILED_STATUSES, STATUSES, ItemResult
from ..terminal import labelled, usage_table
from .manifest import RunSummary
from .run_dir import invocation_seconds

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ..contract.protocol import Framework

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


# of the tokens, those a batch role bought online (``--batch-retry online``): priced online,
# summed with the usage but not a column of their own
PRICED_APART = ("online_prompt_tokens", "online_completion_tokens")


def recorded_usage(results: Iterable[ItemResult]) -> dict[str, dict[str, float]]:
    """Model usage per stage summed over the recorded items (what the results cost)."""
    total: dict[str, dict[str, float]] = {}
    keys = (*USAGE_KEYS, *PRICED_APART)
    for result in results:
        for stage, usage in result.usage.items():
            into = total.setdefault(stage, dict.fromkeys(keys, 0))
            for key in keys:
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
    from ..budget.costs import cost_table

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


# the usage columns as a terminal shows them: units in the header, never in the cells
USAGE_HEADERS = {
    "calls": "calls",
    "requests": "requests",
    "cache_hits": "cache hits",
    "retries": "retries",
    "failures": "failures",
    "backoff_seconds": "backoff s",
    "prompt_tokens": "prompt tok",
    "completion_tokens": "completion tok",
    "reasoning_tokens": "reasoning tok",
}


def usage_cell(key: str, value: float) -> str:
    return f"{value:,.1f}" if key.endswith("seconds") else f"{round(value):,}"


def print_summary(summary: RunSummary, out: Console) -> None:
    if summary.failed:  # first: a run with failed items is not a clean run
        out.print(
            labelled("FAILED", "red", f"{failed_line(summary.failed, summary.task)}"),
            soft_wrap=True,
        )
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
            stages = usage_table("stage", *(USAGE_HEADERS[k] for k in USAGE_KEYS), title=title)
            for stage, u in usage.items():
                stages.add_row(stage, *(usage_cell(k, u.get(k, 0)) for k in USAGE_KEYS))
            out.print(stages)
    this_invocation = "usage_by_role_this_invocation" in summary.model_fields_set
    by_role = summary.usage_by_role_this_invocation if this_invocation else summary.usage_by_role
    if by_role:
        title = "model usage by role" + (" (this invocation)" if this_invocation else "")
        roles = usage_table("role", "model", *(USAGE_HEADERS[k] for k in USAGE_KEYS), title=title)
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
        table.add_row(f"role {role}", f"{dollars:,.4f}")
    for stage, dollars in cost["by_stage"].items():
        table.add_row(f"  stage {stage}", f"{dollars:,.4f}")
    table.add_row("total", f"{cost['total']:,.4f}")
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
            f"{row['items']:,}",
            f"{row['calls']:,}",
            "-" if rate is None else f"{rate:.1f}",
            str(row.get("restarts", 0)),
        )
    out.print(table)
