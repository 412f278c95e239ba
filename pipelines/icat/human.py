"""Validating ICAT against people (the paper's Table 2): per-query coverage (and ICAT_β) of an ICAT
run against human coverage scores, as Pearson, Spearman and Kendall correlations with p-values
and paired bootstrap intervals. No model is called: it reads a finished (or partial) run.

Human file: JSONL {"query_id", "system"?, "coverage"} with coverage in [0, 1] (the share of the
query's aspects the annotators found in that response).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from groundcover import UserError
from groundcover.inputs import iter_jsonl
from groundcover.runs import atomic_write_json

from .framework import NAMES

# scipy.stats functions by name (scipy imported when first used: the CLI imports this module)
MEASURES = {"pearson": "pearsonr", "spearman": "spearmanr", "kendall": "kendalltau"}
OUTPUT = "icat-human.json"


def load_human(path: Path) -> dict[tuple[str, str], float]:
    scores: dict[tuple[str, str], float] = {}
    for lineno, row in iter_jsonl(path):
        qid = row.get("query_id")
        if qid is None or isinstance(qid, bool) or not isinstance(qid, int | str):
            raise UserError(f"{path}:{lineno}: field query_id: missing")
        key = (str(row.get("system", "response")), str(qid))
        value = row.get("coverage")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise UserError(f"{path}:{lineno}: record {key[1]!r}: field coverage: not in [0, 1]")
        if key in scores:
            raise UserError(f"{path}:{lineno}: record {key[1]!r}: duplicate (system, query_id)")
        scores[key] = float(value)
    if not scores:
        raise UserError(f"{path}: no human scores")
    return scores


def correlate(x: list[float], y: list[float], resamples: int, seed: int = 0) -> dict[str, Any]:
    """Each measure with its p-value and a 95% paired bootstrap (BCa) interval; None where the
    data cannot give one (fewer than 3 pairs, or a constant side)."""
    out: dict[str, Any] = {"n": len(x)}
    constant = len(set(x)) < 2 or len(set(y)) < 2
    from scipy import stats

    for name, scipy_name in MEASURES.items():
        if len(x) < 3 or constant:
            out[name] = None
            continue
        function = getattr(stats, scipy_name)
        result = function(x, y)
        entry: dict[str, Any] = {"r": float(result.statistic), "p": float(result.pvalue)}
        try:  # a resample can be constant: its NaN and the warnings about it are expected
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                boot = stats.bootstrap(
                    (np.asarray(x), np.asarray(y)),
                    lambda a, b, f=function: f(a, b).statistic,
                    paired=True,
                    vectorized=False,
                    n_resamples=resamples,
                    method="BCa",
                    random_state=np.random.default_rng(seed),
                )
            low, high = boot.confidence_interval
            if math.isfinite(low) and math.isfinite(high):
                entry["ci95"] = {"low": float(low), "high": float(high)}
        except ValueError:  # e.g. degenerate resamples; the point estimate still stands
            pass
        out[name] = entry
    return out


def human_table(
    results: list[dict[str, Any]],
    human: dict[tuple[str, str], float],
    betas: list[float],
    variants: list[str],
    resamples: int,
) -> dict[str, Any]:
    """Per variant, S_cov and ICAT_β (first β) against the human coverage of the same response."""
    beta = str(betas[0])
    table: dict[str, Any] = {"beta": betas[0], "variants": {}}
    matched = 0
    for variant in variants:
        pairs: dict[str, tuple[list[float], list[float]]] = {"s_cov": ([], []), "icat": ([], [])}
        for record in results:
            details = record.get("details", {})
            key = (str(details.get("system", "response")), str(details.get("query_id")))
            found = details.get("variants", {}).get(variant)
            if key not in human or not found:
                continue
            matched += variant == variants[0]
            for measure, value in (("s_cov", found["s_cov"]), ("icat", found["icat"].get(beta))):
                if value is not None:
                    pairs[measure][0].append(value)
                    pairs[measure][1].append(human[key])
        table["variants"][NAMES[variant]] = {
            measure: correlate(x, y, resamples) for measure, (x, y) in pairs.items()
        }
    table["matched_responses"] = matched
    table["human_without_run_record"] = len(human) - matched
    return table


def render(table: dict[str, Any], console: Console) -> None:
    out = Table("variant", "score", "n", *MEASURES, title="ICAT vs human coverage (r [95% BCa], p)")
    for variant, by_measure in table["variants"].items():
        for measure, entry in by_measure.items():
            label = "S_cov" if measure == "s_cov" else f"ICAT_{table['beta']:g}"
            cells = []
            for name in MEASURES:
                value = entry[name]
                if value is None:
                    cells.append("-")
                    continue
                ci = value.get("ci95")
                bounds = f" [{ci['low']:.3f}, {ci['high']:.3f}]" if ci else ""
                cells.append(f"{value['r']:.3f}{bounds} p={value['p']:.3g}")
            out.add_row(variant, label, str(entry["n"]), *cells)
    console.print(out)


def validate(run_dir: Path, human: Path, resamples: int) -> dict[str, Any]:
    """Correlation of an ICAT run's coverage (and ICAT_beta) with human coverage, per variant;
    written to icat-human.json in the run directory."""
    from groundcover.runs import MANIFEST, RESULTS, read_manifest, results_by_id

    manifest = read_manifest(run_dir / MANIFEST)
    if manifest.framework != "icat":
        raise UserError(f"{run_dir}: not an ICAT run (framework {manifest.framework!r})")
    results = [r.model_dump(mode="json") for r in results_by_id(run_dir / RESULTS)]
    options = manifest.options
    table = human_table(
        results, load_human(human), options["betas"], options["variants"], resamples
    )
    atomic_write_json(run_dir / OUTPUT, table, within=run_dir)
    return table
