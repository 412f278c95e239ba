"""How wide is the prediction-powered interval at N labels, by how the labelled items are drawn?

For a finished run whose dataset ships human grades of every answer (WikiContradict's
Correct / Partially correct / Incorrect, as 1 / 0.5 / 0), this draws N items to "label" the way
``groundcover agreement RUN --sample N --strategy S --seed K`` draws them, takes the shipped
grades of exactly those items as the labels, and computes the mean score by PPI++ as
``agreement`` does (``score_estimates``: the queue's weights, ``ppi_py``). Per N and strategy, the
median 95% half-width over the same seeds, with the labels-only (classical) half-width beside::

    .venv/bin/python scripts/fig_ppi_sampling.py RUN_DIR --out figures/ppi-sampling

writes ``ppi-sampling.json`` (every draw's numbers) and ``ppi-sampling.svg``. The run decides
the judge: the figure is only as informative as the judge's scores are correlated with the
grades (a judge the grades do not follow gets lambda near 0: PPI's interval is the classical
one, whatever the draw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from groundcover.pipelines.reports.audits.agreement import score_estimates
from groundcover.pipelines.reports.people.labels import STRATEGIES, draw
from groundcover.pipelines.runtime.contract.plugins import framework
from groundcover.pipelines.runtime.store.run_dir import (
    MANIFEST,
    RESULTS,
    read_manifest,
    results_by_id,
)


def shipped_grades(run_dir: Path) -> tuple[list[Any], dict[str, float]]:
    """The run's records and, per item, the dataset's human grade of its score."""
    manifest = read_manifest(run_dir / MANIFEST)
    fw = framework(manifest.framework)
    options = fw.Options.model_validate(manifest.options)
    records = list(results_by_id(run_dir / RESULTS))
    grades = {
        r.id: float(label.human)
        for r in records
        for label in fw.human_labels(r, options)
        if label.stage == "score"
    }
    return records, grades


def half_width(interval: Any) -> float | None:
    return None if not interval else (interval[2] - interval[1]) / 2


def widths(
    records: list[Any], grades: dict[str, float], size: int, strategy: str, seed: int
) -> dict[str, Any]:
    queue = draw(records, size, strategy, seed)
    labels = {(d.id, "score", 0): grades[d.id] for d in queue.items if d.id in grades}
    weights = {d.id: d.weight for d in queue.items}
    found = score_estimates(records, labels, weights) or {}
    return {
        "labels": len(labels),
        "ppi": half_width(found.get("ppi")),
        "classical": half_width(found.get("human")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--seeds", type=int, default=50, help="draws per N and strategy")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--out", type=Path, default=Path("figures/ppi-sampling"))
    args = parser.parse_args(argv)
    records, grades = shipped_grades(args.run)
    scored = [r for r in records if r.score is not None]
    if not grades or not scored:
        print(f"{args.run}: no item has both a score and a shipped grade", file=sys.stderr)
        return 1
    draws: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for strategy in args.strategies:
        for size in args.sizes:
            runs = [widths(records, grades, size, strategy, seed) for seed in range(args.seeds)]
            draws.setdefault(strategy, {})[size] = runs
    table = {
        strategy: {size: medians(runs) for size, runs in by_size.items()}
        for strategy, by_size in draws.items()
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"run": str(args.run), "items": len(records), "scored": len(scored)}
    meta |= {"graded": len(grades), "seeds": args.seeds}
    record = {"meta": meta, "median_half_width": table, "draws": draws}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    plot(table, meta, args.out.with_suffix(".svg"))
    for strategy, by_size in table.items():
        cells = "  ".join(
            f"N={n}: {_f(v['ppi'])} (labels only {_f(v['classical'])})" for n, v in by_size.items()
        )
        print(f"{strategy:>10}  {cells}")
    return 0


def medians(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median half-width of PPI and of the labels alone over the draws (None: undefined)."""
    out: dict[str, float | None] = {}
    for key in ("ppi", "classical"):
        given = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(given) if given else None
    return out


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(table: dict[str, Any], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.5, 3.4), dpi=100)
    for strategy, by_size in table.items():
        sizes = [n for n, v in by_size.items() if v["ppi"] is not None]
        axes.plot(sizes, [by_size[n]["ppi"] for n in sizes], marker="o", label=f"PPI++, {strategy}")
    first = table.get("random") or next(iter(table.values()))
    sizes = [n for n, v in first.items() if v["classical"] is not None]
    axes.plot(
        sizes, [first[n]["classical"] for n in sizes], ls="--", color="grey", label="labels only"
    )
    axes.set_xlabel("labelled items N")
    axes.set_ylabel("median 95% half-width")
    axes.set_title(f"{meta['scored']} scored answers, {meta['seeds']} draws per point", fontsize=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="svg")
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
