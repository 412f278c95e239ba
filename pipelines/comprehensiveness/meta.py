"""Meta-evaluation of comprehensiveness scores: label match rates (LMR) with BCa intervals.

WikiContradict: one item per (row, response); labels Correct / Partially correct / Incorrect.
ConflictBank: for each sample, the default fact R_D and the counterfactual statement R_C are scored
against all four contexts (S) and against each context alone (S_X), then SPEC's strict and lax LMR.
A score that is undefined or unparseable never matches: it stays in the denominator and is counted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import stats

from pipelines.comprehensiveness.common import Item
from pipelines.config import UserError, iter_jsonl
from pipelines.results import ItemResult

LABELS = {"correct": "C", "partially correct": "PC", "incorrect": "I"}
SINGLE_CONTEXT_RESPONSES = (1, 2)  # answer1/answer2 were generated from one context only


# ---- statistics ------------------------------------------------------------------------------


@dataclass
class Interval:
    low: float
    high: float
    method: str

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "method": self.method}


def bca_interval(values: Sequence[float], resamples: int = 10_000, seed: int = 0) -> Interval:
    """95% BCa bootstrap interval of the mean (scipy). Constant data has a zero-width interval."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    if np.all(data == data[0]):  # BCa is undefined without variance
        return Interval(float(data[0]), float(data[0]), "degenerate (all values equal)")
    result = stats.bootstrap(
        (data,), np.mean, confidence_level=0.95, n_resamples=resamples, method="BCa",
        random_state=np.random.default_rng(seed),
    )  # fmt: skip
    ci = result.confidence_interval
    return Interval(float(ci.low), float(ci.high), f"BCa, {resamples} resamples")


# ---- WikiContradict --------------------------------------------------------------------------


PAPER_SEED = 42  # the reference's bootstrap seed
EPSILON = 1e-5  # the reference's thresholds: C if S > 1 - eps, PC if S > eps, else I


def wc_match(score: float | None, label: str) -> int:
    """spec: exact S = 1 / 0 < S < 1 / S = 0; no score never matches."""
    if score is None:
        return 0
    return int({"C": score == 1.0, "PC": 0.0 < score < 1.0, "I": score == 0.0}[label])


def wc_predicted(score: float) -> str:
    """paper: the label the reference predicts from S."""
    return "C" if score > 1 - EPSILON else "PC" if score > EPSILON else "I"


def paper_score(record: ItemResult) -> float | None:
    """The reference returns 0 where nothing relevant is left: undefined counts as S = 0."""
    return 0.0 if record.status == "undefined" else record.score


def wikicontradict_items(path: Path, limit: int | None = None) -> list[Item]:
    """Five items per row (responses answer0..4) with the SPEC label rule applied."""
    items = []
    for lineno, row in iter_jsonl(path, limit):
        fields = ["question", "context1_self_contained", "context2_self_contained"]
        _require_strings(path, lineno, row, fields + [f"answer{k}" for k in range(5)])
        for k in range(5):
            raw_label = row.get(f"label{k}")
            label = LABELS.get(str(raw_label).strip().lower())
            if label is None:
                raise UserError(f"{path}:{lineno}: field label{k}: unknown label {raw_label!r}")
            if label == "C" and k in SINGLE_CONTEXT_RESPONSES:
                label = "PC"  # full marks for one context is partial for both
            items.append(
                Item(
                    id=f"{lineno}-{k}", query=row["question"], response=row[f"answer{k}"],
                    contexts=[row["context1_self_contained"], row["context2_self_contained"]],
                    label=label, original_label=raw_label, model=row.get("model"),
                )
            )  # fmt: skip
    return items


def _require_strings(path: Path, lineno: int, row: dict, fields: list[str]) -> None:
    for field in fields:
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise UserError(f"{path}:{lineno}: field {field}: missing or not a string")


def _label(record: ItemResult) -> str:
    return record.details["meta"]["label"]


def lmr_wikicontradict(
    records: list[ItemResult], resamples: int = 10_000, protocol: str = "paper"
) -> dict[str, Any]:
    """LMR_WC over every record; a record without a score stays in the denominator (the paper
    protocol scores an undefined one 0 first, as the reference does, and counts them)."""
    if protocol == "paper":
        scores = [paper_score(r) for r in records]
        matches = [int(s is not None and wc_predicted(s) == _label(r))
                   for s, r in zip(scores, records, strict=True)]  # fmt: skip
        seed = PAPER_SEED
    else:
        matches = [wc_match(r.score, _label(r)) for r in records]
        seed = 0
    out: dict[str, Any] = {
        "n": len(matches),
        "protocol": protocol,
        "lmr": float(np.mean(matches)) if matches else None,
        "ci95": bca_interval(matches, resamples, seed).as_dict() if matches else None,
        "not_scored": _not_scored(records),
        "by_label": {},
    }
    if protocol == "paper":
        out["undefined_scored_as_zero"] = sum(r.status == "undefined" for r in records)
    for label in ("C", "PC", "I"):
        subset = [m for m, r in zip(matches, records, strict=True) if _label(r) == label]
        if subset:
            out["by_label"][label] = {"n": len(subset), "lmr": float(np.mean(subset))}
    return out


# ---- ConflictBank ----------------------------------------------------------------------------

# Field names of the published QA release; override with a mapping if a release renames them.
CB_FIELDS = {
    "question": "question",
    "default_fact": "correct_pair",
    "counterfactual": "fact_conflict_pair",
    "D": "default_evidence",
    "C1": "misinformation_conflict_evidence",
    "C2": "temporal_conflict_evidence",
    "C3": "semantic_conflict_evidence",
}
CB_CONTEXTS = ("D", "C1", "C2", "C3")
CB_RESPONSES = {"RD": "default_fact", "RC": "counterfactual"}


def conflictbank_items(
    path: Path, fields: dict[str, str] | None = None, limit: int | None = None
) -> list[Item]:
    """Per sample and response (RD, RC): one item against all contexts ("all") and one per
    context alone (D, C1, C2, C3)."""
    names = CB_FIELDS | (fields or {})
    items = []
    for lineno, row in iter_jsonl(path, limit):
        _require_strings(path, lineno, row, list(names.values()))
        values = {key: row[field] for key, field in names.items()}
        sample = str(row.get("id", lineno))
        for rid, key in CB_RESPONSES.items():
            for ctx_set in ("all", *CB_CONTEXTS):
                contexts = (
                    [values[c] for c in CB_CONTEXTS] if ctx_set == "all" else [values[ctx_set]]
                )
                items.append(
                    Item(
                        id=f"{sample}:{rid}:{ctx_set}", query=values["question"],
                        response=values[key], contexts=contexts,
                        sample=sample, response_kind=rid, context_set=ctx_set,
                    )
                )  # fmt: skip
    return items


def _lt(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a < b


def cb_pair_scores(scores: dict[str, float | None], response: str) -> tuple[float, float]:
    """Strict and lax LMR terms for one (sample, response) from its S ('all') and S_X."""
    strict = int(scores["all"] is not None and 0.0 < scores["all"] < 1.0)
    for x in CB_CONTEXTS:
        matches_x = (response == "RD") == (x == "D")  # R = R_X
        strict += int(scores[x] is not None and scores[x] == float(matches_x))
    lax = 0
    for x in CB_CONTEXTS[1:]:
        if response == "RD":
            lax += int(_lt(scores[x], scores["D"]))
        else:
            lax += int(_lt(scores["D"], scores[x]))
    return strict / (1 + len(CB_CONTEXTS)), lax / (len(CB_CONTEXTS) - 1)


def lmr_conflictbank(records: list[ItemResult], resamples: int = 10_000) -> dict[str, Any]:
    grouped: dict[tuple[str, str], dict[str, float | None]] = {}
    for r in records:
        meta = r.details["meta"]
        grouped.setdefault((meta["sample"], meta["response_kind"]), {})[meta["context_set"]] = (
            r.score
        )
    complete = {k: v for k, v in grouped.items() if len(v) == 1 + len(CB_CONTEXTS)}
    if not complete:  # e.g. a partial run: nothing to report yet, said so
        return {"n_pairs": 0, "incomplete_pairs": len(grouped), "lmr": None, "ci95": None,
                "not_scored": _not_scored(records)}  # fmt: skip
    strict, lax = zip(*(cb_pair_scores(v, k[1]) for k, v in sorted(complete.items())), strict=True)
    mean = [(s + x) / 2 for s, x in zip(strict, lax, strict=True)]
    return {
        "n_pairs": len(complete),
        "incomplete_pairs": len(grouped) - len(complete),
        "strict": float(np.mean(strict)),
        "lax": float(np.mean(lax)),
        "lmr": float(np.mean(mean)),
        "ci95": bca_interval(mean, resamples).as_dict(),
        "strict_ci95": bca_interval(strict, resamples).as_dict(),
        "lax_ci95": bca_interval(lax, resamples).as_dict(),
        "not_scored": _not_scored(records),
    }


def _not_scored(records: list[ItemResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if r.score is None:
            counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def print_lmr(result: dict[str, Any], console: Console) -> None:
    table = Table("measure", "value", title=f"LMR on {result['dataset']} ({result['method']})")
    ci = result.get("ci95")
    lmr = "undefined (no complete item yet)" if result["lmr"] is None else f"{result['lmr']:.4f}"
    if ci:
        lmr += f"  [{ci['low']:.4f}, {ci['high']:.4f}] ({ci['method']})"
    table.add_row("LMR", lmr)
    for key in ("strict", "lax"):
        if key in result:
            table.add_row(f"LMR {key}", f"{result[key]:.4f}")
    for label, entry in result.get("by_label", {}).items():
        table.add_row(f"label {label}", f"{entry['lmr']:.4f} (n={entry['n']})")
    table.add_row("not scored", json.dumps(result["not_scored"]))
    if "undefined_scored_as_zero" in result:
        table.add_row("undefined, scored 0 (paper)", str(result["undefined_scored_as_zero"]))
    console.print(table)
