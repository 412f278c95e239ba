"""Summaries of a run, and ``report``: every framework's tables rebuilt from what is on disk.

``report`` makes no model call: it reads a run directory's manifest and results once, finds the
framework by the name the manifest records, and calls its pure ``aggregate`` with the options
the run was made with, so a partial or resumed run's tables can be looked at any time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipelines.results import STATUSES, ItemResult
from pipelines.runstore import (
    MANIFEST,
    RESULTS,
    STUDY_FILE,
    invocation_seconds,
    read_manifest,
    results_by_id,
)

USAGE_KEYS = ("calls", "requests", "cache_hits", "retries", "prompt_tokens", "completion_tokens")


def summarise(framework: str, task: str, n_items: int, results: Iterable[ItemResult]) -> dict:
    """Status counts over every item and the mean score over the scored ones, in one pass."""
    statuses = dict.fromkeys(STATUSES, 0)
    scores = []
    for r in results:
        statuses[r.status] += 1
        if r.score is not None:
            scores.append(r.score)
    recorded = sum(statuses.values())
    summary: dict[str, Any] = {
        "framework": framework,
        "task": task,
        "items": n_items,
        "recorded": recorded,
        "partial": recorded < n_items,
        "statuses": statuses,
    }
    if scores:  # over items with a defined score; every status is counted above
        summary["mean_score"] = sum(scores) / len(scores)
        summary["scored_items"] = len(scores)
    return summary


def recorded_usage(results: Iterable[ItemResult]) -> dict[str, dict[str, float]]:
    """Model usage per stage summed over the recorded items (what the results cost)."""
    total: dict[str, dict[str, float]] = {}
    for result in results:
        for stage, usage in result.usage.items():
            into = total.setdefault(stage, dict.fromkeys(USAGE_KEYS, 0))
            for key in USAGE_KEYS:
                into[key] += usage.get(key, 0)
    return total


def recorded_cost(fw: Any, usage: dict[str, dict[str, Any]], roles: dict[str, dict[str, Any]],
                  prices: dict[str, Any], run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """What a run's recorded items cost: their usage, and the GPU time of every invocation."""
    from pipelines.costs import cost_table

    return cost_table(fw, usage, roles, prices, invocation_seconds(run_dir))


def usage_by_role(fw: Any, usage: dict[str, dict[str, Any]],
                  roles: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per-stage usage summed per role (the framework's stage_roles), each with its model."""
    out: dict[str, dict[str, Any]] = {}
    for stage, u in usage.items():
        role = fw.role_of(stage, "unknown")  # "unknown": a stage an older version recorded
        into = out.setdefault(role, {"model": (roles.get(role) or {}).get("request_model"),
                                     **dict.fromkeys(USAGE_KEYS, 0)})  # fmt: skip
        for key in USAGE_KEYS:
            into[key] += u.get(key, 0)
    return out


def print_summary(summary: dict[str, Any], out: Console) -> None:
    title = f"{summary['task']}: {summary['recorded']}/{summary['items']} recorded"
    if summary.get("partial"):
        title += " (partial run)"
    table = Table("status", "items", title=title)
    for status, count in summary["statuses"].items():
        if count:
            table.add_row(status, str(count))
    out.print(table)
    if "mean_score" in summary:
        out.print(f"mean score {summary['mean_score']:.4f} over {summary['scored_items']} "
                  "scored items")  # fmt: skip
    for key, title in (("usage_this_invocation", "model usage (this invocation)"),
                       ("usage_recorded", "model usage (recorded items)")):  # fmt: skip
        usage = summary.get(key) or {}
        if usage:
            stages = Table("stage", *(k.replace("_", " ") for k in USAGE_KEYS), title=title)
            for stage, u in usage.items():
                stages.add_row(stage, *(str(round(u.get(k, 0))) for k in USAGE_KEYS))
            out.print(stages)
    this_invocation = "usage_by_role_this_invocation" in summary
    by_role = summary.get("usage_by_role_this_invocation", summary.get("usage_by_role")) or {}
    if by_role:
        title = "model usage by role" + (" (this invocation)" if this_invocation else "")
        roles = Table("role", "model", *(k.replace("_", " ") for k in USAGE_KEYS), title=title)
        for role, u in by_role.items():
            roles.add_row(role, str(u.get("model") or "-"),
                          *(str(round(u.get(k, 0))) for k in USAGE_KEYS))  # fmt: skip
        out.print(roles)
    for key, title in (("cost_this_invocation", "cost in $ (this invocation)"),
                       ("cost_recorded", "cost in $ (recorded items)")):  # fmt: skip
        if summary.get(key):
            print_cost(summary[key], title, out)
    if summary.get("budget_stop"):
        out.print(f"budget: stopped admitting items ({summary['budget_stop']})")
    for pair in summary.get("self_judging") or []:
        out.print(f"self-judging: the {pair['judge']} role is the {pair['system']} model "
                  f"{pair['model']}")  # fmt: skip


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


def report(
    paths: list[Path], as_json: bool, out: Console, prices: dict[str, Any] | None = None
) -> None:
    """Print each run's summary and tables (``as_json``: one JSON object per line instead); a
    study root also gets the study's combined tables."""
    from pipelines.registry import study as find_study

    for path in paths:
        study_file = path / STUDY_FILE
        if (path / MANIFEST).is_file() or not study_file.is_file():
            _print(load_outcome(path, prices), as_json, out, label=str(path))
            continue
        meta = json.loads(study_file.read_text())
        study = find_study(meta["study"])
        outcomes = {key: load_outcome(path / key, prices) for key in meta["runs"]
                    if (path / key / MANIFEST).is_file()}  # fmt: skip
        for key, outcome in outcomes.items():
            _print(outcome, as_json, out, label=str(path / key))
        if meta.get("repeats"):
            from pipelines.repeats import print_repeats, repeats_table

            table = repeats_table(outcomes)
            if as_json:
                print(json.dumps({"study": str(path), "repeats": table}, default=str))
            else:
                print_repeats(table, out)
            continue
        combined = study.combine(outcomes, study.Options.model_validate(meta["options"]))
        if combined is None:
            continue
        if as_json:
            print(json.dumps({"study": str(path), "combined": combined}, default=str))
        else:
            study.render_combined(combined, out)


def load_outcome(run_dir: Path, prices: dict[str, Any] | None = None):
    """A run's outcome rebuilt from disk: summary and tables from manifest and results (and
    with ``prices``, what the recorded items cost)."""
    from pipelines.protocol import RunOutcome
    from pipelines.registry import framework

    manifest = read_manifest(run_dir / MANIFEST)
    fw = framework(manifest["framework"])
    options = fw.Options.model_validate(manifest["options"])
    results = records_for_tables(fw, options, results_by_id(run_dir / RESULTS))
    summary = summarise(fw.name, manifest["task"], manifest["items"], results)
    summary["usage_recorded"] = recorded_usage(results)
    summary["usage_by_role"] = usage_by_role(fw, summary["usage_recorded"],
                                             manifest.get("roles") or {})  # fmt: skip
    summary["self_judging"] = manifest.get("self_judging") or []
    if prices:
        summary["cost_recorded"] = recorded_cost(
            fw, summary["usage_recorded"], manifest.get("roles") or {}, prices, run_dir
        )
    return RunOutcome(run_dir, results, tables_of(fw, options, results), summary, fw)


def records_for_tables(
    fw: Any, options: Any, records: Sequence[ItemResult]
) -> Sequence[ItemResult]:
    """A framework with tables gets its records parsed once, as a list (its aggregate makes
    many passes); one without keeps them on disk, read when used (a 100,000-item run)."""
    return list(records) if fw.tables_file(options) is not None else records


def tables_of(fw: Any, options: Any, results: Sequence[ItemResult]) -> dict[str, Any] | None:
    """The framework's tables (None for a framework or options without tables)."""
    if fw.tables_file(options) is None:
        return None
    return fw.aggregate(results, options)


def _print(outcome, as_json: bool, out: Console, label: str) -> None:
    if as_json:  # plain print: rich would wrap long lines inside the JSON
        payload = {"run": label, "summary": outcome.summary, "tables": outcome.tables}
        print(json.dumps(payload, default=str))
        return
    print_summary(outcome.summary, out)
    if outcome.tables is not None:
        outcome.framework.render(outcome.tables, out)
