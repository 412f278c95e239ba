"""``report``: a run's summary and every framework's tables rebuilt from what is on disk.

``report`` makes no model call: it reads a run directory's manifest and results once, finds the
framework by the name the manifest records, and calls its pure ``aggregate`` with the options
the run was made with, so a partial or resumed run's tables can be looked at any time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from ..runtime.store.contained import study_runs
from ..runtime.store.provenance import manifest_provenance, short
from ..runtime.store.run_dir import (
    MANIFEST,
    RESULTS,
    STUDY_FILE,
    read_manifest,
    read_study,
    results_by_id,
)
from ..runtime.store.summary import (
    print_summary,
    recorded_cost,
    recorded_usage,
    records_for_tables,
    summarise,
    tables_of,
    usage_by_role,
)


def report(
    paths: list[Path], as_json: bool, out: Console, prices: dict[str, Any] | None = None
) -> None:
    """Print each run's summary and tables (``as_json``: one JSON object per line instead); a
    study root also gets the study's combined tables."""
    from ..runtime.contract.plugins import recorded_options
    from ..runtime.contract.plugins import study as find_study

    for path in paths:
        study_file = path / STUDY_FILE
        if (path / MANIFEST).is_file() or not study_file.is_file():
            _print(load_outcome(path, prices), as_json, out, label=str(path))
            continue
        meta = read_study(path)
        study = find_study(meta.study, meta.source)
        outcomes = {
            key: load_outcome(run, prices) for key, run in study_runs(path, meta.runs).items()
        }
        for key, outcome in outcomes.items():
            _print(outcome, as_json, out, label=str(path / key))
        if meta.repeats:
            from ..runtime.execution.repeats import print_repeats, repeats_table

            table = repeats_table(outcomes)
            if as_json:
                print(json.dumps({"study": str(path), "repeats": table}, default=str))
            else:
                print_repeats(table, out)
            continue
        options = recorded_options(study.Options, meta.options, study_file)
        combined = study.combine(outcomes, options)
        if combined is None:
            continue
        if as_json:
            print(json.dumps({"study": str(path), "combined": combined}, default=str))
        else:
            study.render_combined(combined, out)


def load_outcome(run_dir: Path, prices: dict[str, Any] | None = None):
    """A run's outcome rebuilt from disk: summary and tables from manifest and results (and
    with ``prices``, what the recorded items cost)."""
    from ..runtime.contract.plugins import run_framework, run_options
    from ..runtime.contract.protocol import RunOutcome

    manifest = read_manifest(run_dir / MANIFEST)
    fw = run_framework(manifest, run_dir)
    options = run_options(fw, manifest, run_dir)
    results = records_for_tables(fw, options, results_by_id(run_dir / RESULTS))
    summary = summarise(fw.name, manifest.task, manifest.items, results)
    usage = recorded_usage(results)
    summary.add(
        usage_recorded=usage,
        usage_by_role=usage_by_role(fw, usage, manifest.roles),
        self_judging=manifest.self_judging,
    )
    if prices:
        summary.add(cost_recorded=recorded_cost(fw, usage, manifest.roles, prices, run_dir))
    return RunOutcome(run_dir, results, tables_of(fw, options, results), summary, fw)


def _print(outcome, as_json: bool, out: Console, label: str) -> None:
    from .audits.cascade import run_cascade
    from .people.overrides import override_line, override_summary

    judges = panel_agreement(outcome)
    cost = getattr(outcome.summary, "cost_recorded", None)  # with --prices: dollars too
    cascaded = run_cascade(outcome.dir, outcome.results, cost)
    rests_on = manifest_provenance(read_manifest(outcome.dir / MANIFEST))
    overrides = override_summary(outcome.dir, outcome.results)
    from ...serving.batch import read_ledgers  # aiohttp: not for --help

    bought = read_ledgers(outcome.dir)
    if as_json:  # plain print: rich would wrap long lines inside the JSON
        summary = outcome.summary.to_json() if outcome.summary else None
        payload = {"run": label, "summary": summary, "tables": outcome.tables}
        payload["provenance"] = rests_on
        if bought:
            payload["batches"] = bought
        if judges:
            payload["agreement"] = judges
        if cascaded:
            payload["cascade"] = cascaded
        if overrides:
            payload["overrides"] = overrides
        print(json.dumps(payload, default=str))
        return
    if outcome.summary is not None:
        print_summary(outcome.summary, out)
    if overrides:
        out.print(override_line(overrides), highlight=False)
    print_provenance(rests_on, out)
    if bought:
        out.print(batch_line(bought, outcome.summary), highlight=False)
    if outcome.tables is not None:
        outcome.framework.render(outcome.tables, out)
    if judges:
        from .audits.agreement import render

        render({"runs": [judges]}, out)
    if cascaded:
        from .audits.cascade import render_run

        render_run(cascaded, out)


def batch_line(bought: dict[str, Any], summary: Any) -> str:
    """The calls bought as batch jobs, in one line: rounds, batches, lines, failures, the wait
    and (with prices) the saving."""
    line = (
        f"batch jobs: {bought['rounds']} rounds, {bought['batches']} batches, "
        f"{bought['lines']:,} lines ({bought['failed_lines']:,} failed and asked again), "
        f"waited {bought['waited_s'] / 60:.1f} min"
    )
    causes = bought.get("causes") or {}
    if causes:  # what came of the lines that had no answer, by cause (serving.batch.CAUSES)
        line += "; unanswered lines: " + ", ".join(f"{k} {n:,}" for k, n in causes.items())
    if bought["pending"]:
        line += f"; {bought['pending']} pending (the same command waits for them)"
    cost = getattr(summary, "cost_recorded", None) or {}
    if "saving" in cost:
        line += f"; ${cost['saving']:.4f} saved against online prices"
    return line


def print_provenance(rests_on: dict[str, Any], out: Console) -> None:
    """What the run's numbers rest on: each input by digest, each role's model by revision."""
    from rich.table import Table

    table = Table("", "name", "path or model", "digest / revision", "size", title="rests on")
    for entry in rests_on["inputs"]:
        size = entry.get("size")
        shown = "-" if size is None else f"{size:,} B"
        table.add_row("input", entry["name"], str(entry["path"]), short(entry["sha256"]), shown)
    for m in rests_on["models"]:
        where = m.get("served") or ""
        source = f" ({m['source']})" if m.get("source") else ""
        table.add_row(
            "model", m["role"], f"{m['model']} @ {where}", short(m["revision"]) + source, "-"
        )
        if m.get("adapter"):
            table.add_row("adapter", m["role"], m["adapter"], short(m["adapter_revision"]), "-")
    out.print(table)
    if rests_on.get("note"):
        out.print(f"note: {rests_on['note']}", highlight=False, soft_wrap=True)


def panel_agreement(outcome) -> dict[str, Any] | None:
    """A judge panel's agreement per stage (``groundcover agreement``), for a run with one."""
    if not any("panel" in r.details for r in outcome.results):
        return None
    from .audits.agreement import run_agreement

    return run_agreement(outcome.dir, None)
