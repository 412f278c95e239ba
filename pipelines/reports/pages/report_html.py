"""One self-contained HTML page for one or more run directories (``report --html``, ``view``).

Per run: manifest (task, models and adapters, prompt ids, options), status counts, model usage
by stage, the framework's tables, a score-distribution plot (matplotlib SVG, inline), and every
item with a drill-down (explanation, failing stage, details as JSON) that can be filtered by
status and score and searched by text. Several runs on the same items: a side-by-side table of
per-item score differences, largest first. Nothing is fetched from anywhere: no CDN, no fonts.

Every value from a run (model outputs included) reaches the page escaped: through Jinja's
autoescape, or as JSON inside a ``<script type="application/json">`` block whose ``<`` are
written as ``\\u003c``, so a model that writes ``</script><script>...`` shows that text.
"""

from __future__ import annotations

import html
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from jinja2 import Environment, select_autoescape
from markupsafe import Markup

from ....serving.files import write_atomic
from ...runtime.store.manifest import RunManifest
from ...runtime.store.provenance import manifest_provenance
from ...runtime.store.run_dir import MANIFEST, read_manifest
from ...runtime.terminal import UNPRINTABLE, UNPRINTABLE_CLASS, printable
from ..audits.cascade import run_cascade
from ..audits.reask import recorded_audits
from ..report import load_outcome, panel_agreement

TEMPLATE = Path(__file__).parent / "report_html.html.j2"


def page_environment() -> Environment:
    """Jinja for every page: each value escaped for HTML, and each character the terminal shows
    as an escape (``printable``: controls, bidirectional overrides and isolates) shown as that
    escape here too, so text is never seen in another order than it is. The pages' scripts do
    the same to what they fetch (their ``visible``, with ``unprintable``: the same class)."""
    environment = Environment(
        autoescape=select_autoescape(default=True, default_for_string=True), finalize=_visible
    )
    environment.globals["unprintable"] = UNPRINTABLE_CLASS
    environment.filters["safe_json"] = _safe_json
    return environment


def _visible(value: Any) -> Any:
    if isinstance(value, Markup):  # made safe already (JSON, a plot): a JSON escape is valid
        return Markup(UNPRINTABLE.sub(_json_escape, str(value)))  # inside its strings, and seen
    return printable(value) if isinstance(value, str) else value


def _json_escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found[0]):04x}"


def _safe_json(value: Any) -> str:
    """JSON that cannot close the script element it sits in."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def score_range(scores: list[float]) -> tuple[float, float]:
    """The plot's axis: the score's range, [0, 1] for every framework here (wider only if a
    score is), so a run of all 1.0 is a bar at 1, not a bar in the middle of 0.5-1.5."""
    return min(0.0, float(np.min(scores))), max(1.0, float(np.max(scores)))


def score_plot(scores: list[float]) -> str | None:
    """An inline SVG histogram of the scores (None without scores)."""
    if not scores:
        return None
    import matplotlib

    from .plots import own_style

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with own_style():  # not a matplotlibrc of the folder the command runs in
        figure, axes = plt.subplots(figsize=(5, 2.4), dpi=100)
        low, high = score_range(scores)
        axes.hist(np.asarray(scores, dtype=float), bins=20, range=(low, high), color="#4a7ab5")
        axes.set_xlim(low, high)
        axes.set_xlabel("score")
        axes.set_ylabel("items")
        figure.tight_layout()
        figure.savefig(buffer, format="svg")
        plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def terminal_tables(framework, tables: dict[str, Any] | None) -> str | None:
    """The framework's tables exactly as `report` prints them (paper layouts), as HTML: the
    plain text the terminal shows (no markup read, no control character kept: ``terminal``),
    escaped into one ``<pre>``. Never rich's HTML export, which writes a link's target and a
    style's name into attributes as they are."""
    if tables is None:
        return None
    from ...runtime.terminal import terminal

    console = terminal(record=True, width=120, file=io.StringIO(), color_system=None)
    framework.render(tables, console)
    return f'<pre class="rich">{html.escape(console.export_text(styles=False))}</pre>'


def run_view(
    path: Path, prices: dict[str, Any] | None = None, served: bool = False
) -> dict[str, Any]:
    """What the page shows of one run; ``served`` (``view``): without its items, which the
    page fetches by page from the server."""
    manifest = read_manifest(path / MANIFEST)
    outcome = load_outcome(path, prices)
    items = [] if served else [r.model_dump(mode="json") for r in outcome.results]
    for item in items:  # the fact graph written by the run, for the drill-down's drawing
        item["graph"] = _graph(path, item.get("details", {}))
    scores = [r.score for r in outcome.results if r.score is not None]
    summary = outcome.summary
    from . import plots

    figures = [
        (title, plots.draw(spec)) for title, spec in outcome.framework.figures(outcome.tables)
    ]
    return {
        "headline": headline(outcome, manifest, scores),
        "figures": figures,
        "tables_html": terminal_tables(outcome.framework, outcome.tables),
        "agreement": panel_agreement(outcome),
        "cascade": run_cascade(path, outcome.results, summary.cost_recorded),
        "reliability": recorded_audits(path),
        "batches": _bought(path),
        "path": str(path),
        "manifest": manifest.model_dump(mode="json"),
        "provenance": manifest_provenance(manifest),
        "summary": summary.model_dump(mode="json", exclude_none=True),  # absent: "-"
        "partial": summary.partial or summary.recorded < manifest.items,
        "tables_json": json.dumps(outcome.tables, indent=1, default=str),
        "usage": summary.usage_recorded,
        "plot": score_plot(scores),
        "items": items,
        "served": served,
    }


def _bought(path: Path) -> dict[str, Any] | None:
    from ....serving.batch import read_ledgers  # aiohttp: imported where a page is made

    return read_ledgers(path)


LIGHT_INTERVAL = 200_000  # scores up to which the light page bootstraps its interval


def light_view(path: Path, rows: Sequence[Any]) -> dict[str, Any]:
    """What the served page shows of a run before its tables are made: the headline, statuses,
    provenance and score histogram from the records' first fields (``rows``: each with id,
    status, score and explanation); tables, figures, usage and agreement come with the whole
    page."""
    from ...runtime.store.summary import summarise

    manifest = read_manifest(path / MANIFEST)
    summary = summarise(manifest.framework, manifest.task, manifest.items, rows)
    summary.add(self_judging=manifest.self_judging)
    scores = [row.score for row in rows if row.score is not None]
    outcome = SimpleNamespace(summary=summary, dir=path, results=rows)
    shown = headline(outcome, manifest, scores if len(scores) <= LIGHT_INTERVAL else [])
    shown |= {"scored": len(scores), "mean": summary.mean_score}
    return {
        "headline": shown,
        "figures": [],
        "tables_html": None,
        "agreement": None,
        "cascade": None,
        "reliability": {},
        "path": str(path),
        "manifest": manifest.model_dump(mode="json"),
        "provenance": manifest_provenance(manifest),
        "summary": summary.model_dump(mode="json", exclude_none=True),
        "partial": summary.partial or summary.recorded < manifest.items,
        "tables_json": "null",
        "usage": {},
        "plot": score_plot(scores),
        "items": [],
        "served": True,
        "pending": True,
    }


def headline(outcome: Any, manifest: RunManifest, scores: list[float]) -> dict[str, Any]:
    """What a reader looks for first: the mean with its interval, how many items are in it,
    the statuses, the model of each role and (with prices) the cost."""
    from ...runtime.stats import bca_interval, percentile_interval

    summary = outcome.summary
    interval = None
    if len(scores) > 1:  # BCa's jackknife is quadratic: a large run gets the percentile one
        interval = (
            bca_interval(scores, 2000) if len(scores) <= 5000 else percentile_interval(scores, 2000)
        ).as_dict()
    from ..people.overrides import override_summary

    roles = manifest.roles or {"judge": manifest.models or {}}
    cost = summary.cost_recorded
    return {
        "overrides": override_summary(outcome.dir, outcome.results),
        "mean": summary.mean_score,
        "interval": interval,
        "scored": len(scores),
        "recorded": summary.recorded,
        "items": manifest.items,
        "statuses": {s: n for s, n in summary.statuses.items() if n},
        "failed": summary.failed,
        "roles": {role: m.get("request_model") or m.get("model") for role, m in roles.items()},
        "cost": cost["total"] if cost else None,
        "unpriced": cost["unpriced"] if cost else [],
    }


def _graph(run_dir: Path, details: dict[str, Any]) -> dict[str, Any] | None:
    """Nodes (id, source, status, component) and entailment edges of an item's fact graph, from
    the node-link file the run exported (None when there is none). The record names the file,
    and a run can come from anyone: it is read only from inside the run directory, its links
    resolved (``contained.inside_run``); a name that leads elsewhere is left out with a note."""
    from ...runtime.store.contained import inside_run

    files = details.get("graph_files") if isinstance(details, dict) else None
    name = files.get("node_link") if isinstance(files, dict) else None
    if not name:
        return None
    path = inside_run(run_dir, name)
    if path is None or not path.is_file():
        note = f"fact graph left out: {name} is not a file inside the run directory"
        return {"nodes": [], "edges": [], "note": note}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    if not isinstance(data, dict):
        return None
    nodes = [
        {k: n.get(k) for k in ("id", "source", "status", "component", "text")}
        for n in data.get("nodes") or []
        if isinstance(n, dict)
    ]
    edges = [
        [e.get("source"), e.get("target")] for e in data.get("edges") or [] if isinstance(e, dict)
    ]
    return {"nodes": nodes, "edges": edges}


def comparison(runs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Per-item scores of every run side by side, sorted by the largest difference."""
    if len(runs) < 2:
        return None
    scores = [{i["id"]: i["score"] for i in run["items"]} for run in runs]
    shared = sorted(set.intersection(*(set(s) for s in scores)))
    rows = []
    for item_id in shared:
        values = [s[item_id] for s in scores]
        defined = [v for v in values if v is not None]
        spread = max(defined) - min(defined) if len(defined) > 1 else None
        rows.append({"id": item_id, "scores": values, "spread": spread})
    return sorted(rows, key=lambda r: (r["spread"] is None, -(r["spread"] or 0), r["id"]))


def render(
    paths: list[Path],
    compared: dict[str, Any] | None = None,
    prices: dict[str, Any] | None = None,
    served: bool = False,
    light: Mapping[int, Sequence[Any]] | None = None,
) -> str:
    """The page of ``paths``; with ``compared`` (``compare_runs`` of the same paths) the paired
    comparison comes first, each item linked to its drill-down below. ``served``: the items
    are fetched from the viewer by page (``reports.pages.viewer``), not embedded;
    ``light``: each run's records' first fields (the viewer's light pass), for the page shown
    while the whole one is made."""
    if light is not None:
        runs = [light_view(p, light[k]) for k, p in enumerate(paths)]
    else:
        runs = [run_view(p, prices, served) for p in paths]
    template = page_environment().from_string(TEMPLATE.read_text(encoding="utf-8"))
    return template.render(
        runs=runs,
        comparison=None if compared or served else comparison(runs),  # paired view replaces it
        compared=compared,
        index=page_index(paths, compared),
    )


def page_index(paths: list[Path], compared: dict[str, Any] | None) -> dict[str, int]:
    """Where each run is on the page; a compared --repeats root links to its first repeat."""
    index = {str(p): k for k, p in enumerate(paths)}
    for run in (compared or {}).get("runs", []):
        if run["run"] not in index:
            inside = [k for k, p in enumerate(paths) if Path(run["run"]) in p.parents]
            index[run["run"]] = inside[0] if inside else 0
    return index


def write_html(
    paths: list[Path],
    out: Path,
    compared: dict[str, Any] | None = None,
    prices: dict[str, Any] | None = None,
    within: Path | None = None,
) -> Path:
    """The page as ``out``, whole or not at all; ``within``: the folder ``out`` was chosen in
    for the user (``--html`` alone: beside the run), where a link at ``out`` is refused."""
    write_atomic(out, render(paths, compared, prices), within=within)
    return out
