"""Meta-evaluation of comprehensiveness scores: label match rates (LMR) with BCa intervals.

WikiContradict: one item per (row, response); labels Correct / Partially correct / Incorrect.
ConflictBank: per sampled row, the default claim R_D and the conflict claim R_C are scored against
the four evidence texts. paper: one run per claim, S_X from its context nodes by source; spec: one
run against all (S) and one per text alone (S_X). Then strict and lax LMR (paper Figure 7).
A score that is undefined or unparseable never matches: it stays in the denominator and is counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from groundcover import ItemResult, UserError, not_scored
from groundcover.inputs import iter_jsonl
from groundcover.serving.redact import clipped
from groundcover.stats import Interval, bca_interval

from .common import Item
from .rules import Rules, rules_for

LABELS = {"correct": "C", "partially correct": "PC", "incorrect": "I"}
SINGLE_CONTEXT_RESPONSES = (1, 2)  # answer1/answer2 were generated from one context only


# ---- WikiContradict --------------------------------------------------------------------------


PAPER = rules_for("paper")
EPSILON = 1e-5  # the reference's thresholds: C if S > 1 - eps, PC if S > eps, else I


def wc_match(score: float | None, label: str) -> int:
    """spec: exact S = 1 / 0 < S < 1 / S = 0; no score never matches."""
    if score is None:
        return 0
    return int({"C": score == 1.0, "PC": 0.0 < score < 1.0, "I": score == 0.0}[label])


def wc_predicted(score: float) -> str:
    """paper: the label the reference predicts from S."""
    return "C" if score > 1 - EPSILON else "PC" if score > EPSILON else "I"


def predicted_label(score: float | None, rules: Rules) -> str | None:
    """The WikiContradict label a score predicts: the reference's thresholds (paper) or exact
    S = 1 / 0 < S < 1 / S = 0 (spec); None without a score."""
    if score is None:
        return None
    if rules.wikicontradict_thresholds:
        return wc_predicted(score)
    return "C" if score == 1.0 else "PC" if score > 0.0 else "I"


# the annotators' labels, worst to best; as numbers for a mean (Partially correct: half)
LABEL_ORDER = ("I", "PC", "C")
LABEL_VALUE = {"I": 0.0, "PC": 0.5, "C": 1.0}


def paper_score(record: ItemResult) -> float | None:
    """The reference returns 0 where nothing relevant is left: undefined counts as S = 0."""
    return 0.0 if record.status == "undefined" else record.score


def table_score(record: ItemResult, rules: Rules) -> float | None:
    """A record's S in the tables: undefined scores 0 where the rules say so."""
    return paper_score(record) if rules.undefined_scored_zero else record.score


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
                    id=f"{lineno}-{k}",
                    query=row["question"],
                    response=row[f"answer{k}"],
                    contexts=[row["context1_self_contained"], row["context2_self_contained"]],
                    label=label,
                    original_label=raw_label,
                    model=row.get("model"),
                )
            )
    if not items:
        raise UserError(f"{path}: no records")
    return items


def _require_strings(path: Path, lineno: int, row: dict, fields: list[str]) -> None:
    for field in fields:
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise UserError(f"{path}:{lineno}: field {field}: missing or not a string")


def _label(record: ItemResult) -> str:
    return record.details["meta"]["label"]


def lmr_wikicontradict(
    records: list[ItemResult], resamples: int = 10_000, rules: Rules = PAPER
) -> dict[str, Any]:
    """LMR_WC over every record; a record without a score stays in the denominator (the paper
    protocol scores an undefined one 0 first, as the reference does, and counts them)."""
    matches = wc_matches(records, rules)
    seed = rules.bootstrap_seed
    out: dict[str, Any] = {
        "n": len(matches),
        "protocol": rules.protocol,
        "lmr": float(np.mean(matches)) if matches else None,
        "ci95": bca_interval(matches, resamples, seed).as_dict() if matches else None,
        "not_scored": not_scored(records),
        "by_label": {},
    }
    if rules.undefined_scored_zero:
        out["undefined_scored_as_zero"] = sum(r.status == "undefined" for r in records)
    for label in ("C", "PC", "I"):
        subset = [m for m, r in zip(matches, records, strict=True) if _label(r) == label]
        if subset:
            out["by_label"][label] = {"n": len(subset), "lmr": float(np.mean(subset))}
    return out


# ---- ConflictBank ----------------------------------------------------------------------------

# The HF release the paper used (Warrieryes/CB_qa_v2, train split), exported to JSONL or Parquet.
CB_QUESTION = "question"
CB_RESPONSES = {"RD": "default_claim", "RC": "misinformation_conflict_claim"}
CB_CONTEXTS = {  # role -> field; in this order they are the item's contexts c1..c4
    "D": "default_evidence",
    "C1": "misinformation_conflict_evidence",
    "C2": "temporal_conflict_evidence",
    "C3": "semantic_conflict_evidence",
}
CB_ROLES = tuple(CB_CONTEXTS)
CB_SAMPLE = 500  # the reference: train split shuffled with seed 42, first 500 rows
CB_SEED = 42


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(row number, record) from JSONL, or from Parquet (row numbers from 1)."""
    if path.suffix.lower() != ".parquet":
        return list(iter_jsonl(path))
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise UserError(f"{path}: not a readable Parquet file: {clipped(str(exc), 120)}") from exc
    return list(enumerate(table.to_pylist(), 1))


def cb_sample(n_rows: int, size: int | None) -> list[int]:
    """Row indices the reference evaluated: HF ``Dataset.shuffle(seed=42)`` (a numpy
    default_rng(42) permutation of the rows), then the first ``size`` (500)."""
    order = np.random.default_rng(CB_SEED).permutation(n_rows)
    return [int(i) for i in order[: size or CB_SAMPLE]]


def conflictbank_items(path: Path, limit: int | None = None, rules: Rules = PAPER) -> list[Item]:
    """Items for the sampled rows (``limit`` rows, default 500). paper: one item per claim
    (default and misinformation-conflict) against all four evidence texts in one run. spec: per
    claim one item against all four ("all") and one per evidence text alone (S_X by plain reading).
    """
    rows = read_rows(path)
    if not rows:
        raise UserError(f"{path}: no records")
    needed = [CB_QUESTION, *CB_RESPONSES.values(), *CB_CONTEXTS.values()]
    missing = [f for f in needed if f not in rows[0][1]]
    if missing:
        raise UserError(
            f"{path}:{rows[0][0]}: field {missing[0]}: missing; ConflictBank needs the CB_qa_v2 "
            f"fields {', '.join(needed)}"
        )
    items = []
    for index in sorted(cb_sample(len(rows), limit)):
        lineno, row = rows[index]
        _require_strings(path, lineno, row, needed)
        contexts = [row[field] for field in CB_CONTEXTS.values()]
        for kind, field in CB_RESPONSES.items():
            common = {
                "query": row[CB_QUESTION],
                "response": row[field],
                "sample": str(lineno),
                "response_kind": kind,
                "roles": list(CB_ROLES),
            }
            if rules.conflictbank_one_run_per_claim:
                items.append(Item(id=f"{lineno}:{kind}", contexts=contexts, **common))
                continue
            for ctx_set in ("all", *CB_ROLES):
                chosen = contexts if ctx_set == "all" else [row[CB_CONTEXTS[ctx_set]]]
                roles = list(CB_ROLES) if ctx_set == "all" else [ctx_set]
                items.append(
                    Item(
                        id=f"{lineno}:{kind}:{ctx_set}",
                        contexts=chosen,
                        **(common | {"roles": roles}),
                        context_set=ctx_set,
                    )
                )
    return items


CB_EPS = 1e-9  # the reference's S_X = covered / (nodes + 1e-9): kept, it orders full sources
CB_REL_TOL = 1e-6  # S_X "equal" to 0 or 1 under the 1e-9 term


@dataclass(frozen=True)
class ClaimTerms:
    """paper: one claim's ConflictBank terms and how many sources it had."""

    strict: float
    lax: float
    moderate: float
    sources: int

    @property
    def main(self) -> float:
        """The reference code's "main score": mean(lax, moderate, strict)."""
        return (self.lax + self.moderate + self.strict) / 3


def cb_claim_terms(
    score: float | None, sources: dict[str, dict[str, int]], claim: str
) -> ClaimTerms:
    """paper: strict, lax and moderate terms of one claim run over all four evidence texts (SPEC
    §1, reference behaviour).

    ``sources`` maps a role (D, C1..C3) to its context-node counts {"nodes", "covered"}.
    S_X = covered / (nodes + 1e-9) over the texts with at least one node, and the default text is
    always a source (S_D = 0 without a node: the reference reads its count before counting). A
    source "matches" the claim when it states it (D for the default claim RD, C1..C3 for RC).
    strict: S in (1e-6, 1 - 1e-6), plus per source S_X = 1 if matching else 0 (isclose, rel 1e-6);
    over sources + 1. lax: per conflict source S_X < S_D (RD) or S_X > S_D (RC); over sources - 1
    (the reference divides by ~0 with the default alone: we divide by 1, ``lmr_conflictbank``
    counts it). moderate: S in (0.2, 0.8), plus per source S_X > 0.8 if matching else < 0.2;
    over sources + 1.
    """
    s = {role: c["covered"] / (c["nodes"] + CB_EPS) for role, c in sources.items() if c["nodes"]}
    s.setdefault("D", 0.0)
    default_claim = claim == "RD"
    strict = int(score is not None and 1e-6 < score < 1 - 1e-6)
    moderate = int(score is not None and 0.2 < score < 0.8)
    lax = 0
    for role, value in s.items():
        matching = (role == "D") == default_claim  # the claim states what this source says
        strict += int(math.isclose(value, float(matching), rel_tol=CB_REL_TOL))
        moderate += int(value > 0.8 if matching else value < 0.2)
        if role != "D":
            lax += int(value < s["D"] if default_claim else value > s["D"])
    n = len(s)
    return ClaimTerms(strict / (n + 1), lax / max(n - 1, 1), moderate / (n + 1), n)


def _lt(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a < b


def cb_pair_scores(scores: dict[str, float | None], response: str) -> tuple[float, float]:
    """spec: strict and lax terms for one (sample, response) from its S ('all') and the S_X of
    separate runs per evidence text (paper Figure 7 by plain reading)."""
    strict = int(scores["all"] is not None and 0.0 < scores["all"] < 1.0)
    for x in CB_ROLES:
        matches_x = (response == "RD") == (x == "D")  # R = R_X
        strict += int(scores[x] is not None and scores[x] == float(matches_x))
    lax = 0
    for x in CB_ROLES[1:]:
        if response == "RD":
            lax += int(_lt(scores[x], scores["D"]))
        else:
            lax += int(_lt(scores["D"], scores[x]))
    return strict / (1 + len(CB_ROLES)), lax / (len(CB_ROLES) - 1)


def cb_terms(records: Sequence[ItemResult], rules: Rules = PAPER) -> dict[str, Any]:
    """Per claim: (id, strict, lax, moderate), moderate None in the spec protocol; a record
    without a score or source counts stays in with terms from what it has (an unparseable claim
    scores 0, and is counted as not scored)."""
    terms: list[tuple[str, float, float, float | None]] = []
    if rules.conflictbank_one_run_per_claim:
        one_source, no_default = 0, 0
        for r in records:
            meta = r.details["meta"]
            sources = _role_counts(r, meta["roles"])
            claim = cb_claim_terms(table_score(r, rules), sources, meta["response_kind"])
            one_source += claim.sources == 1
            no_default += not sources["D"]["nodes"]
            terms.append((r.id, claim.strict, claim.lax, claim.moderate))
        return {
            "terms": terms,
            "single_source_lax": one_source,
            "default_source_without_nodes": no_default,
        }
    grouped: dict[tuple[str, str], dict[str, float | None]] = {}
    for r in records:
        meta = r.details["meta"]
        key = (meta["sample"], meta["response_kind"])
        grouped.setdefault(key, {})[meta["context_set"]] = r.score
    complete = {k: v for k, v in grouped.items() if len(v) == 1 + len(CB_ROLES)}
    terms = [
        (f"{k[0]}:{k[1]}", *cb_pair_scores(v, k[1]), None) for k, v in sorted(complete.items())
    ]
    return {"terms": terms, "incomplete": len(grouped) - len(complete)}


def _role_counts(record: ItemResult, roles: list[str]) -> dict[str, dict[str, int]]:
    """Context-node counts by evidence role from the record's per-context counts."""
    by_context = record.details.get("sources") or {}
    return {
        role: by_context.get(f"c{i}", {"nodes": 0, "covered": 0}) for i, role in enumerate(roles, 1)
    }


def lmr_conflictbank(
    records: list[ItemResult], resamples: int = 10_000, rules: Rules = PAPER
) -> dict[str, Any]:
    """Strict, lax and their mean per claim (the paper's figure), averaged, each with a BCa
    interval; paper protocol: also the reference code's moderate and main (mean of lax, moderate,
    strict) scores."""
    found = cb_terms(records, rules)
    terms = found["terms"]
    seed = rules.bootstrap_seed
    out: dict[str, Any] = {
        "protocol": rules.protocol,
        "n_claims": len(terms),
        "not_scored": not_scored(records),
    }
    if rules.conflictbank_one_run_per_claim:
        out["undefined_scored_as_zero"] = sum(r.status == "undefined" for r in records)
        out["single_source_lax"] = found["single_source_lax"]
        out["default_source_without_nodes"] = found["default_source_without_nodes"]
    else:
        out["incomplete_pairs"] = found["incomplete"]
    if not terms:  # e.g. a partial run: nothing to report yet, said so
        return out | {"lmr": None, "ci95": None}
    ids, strict, lax, moderate = zip(*terms, strict=True)
    mean = [(s + x) / 2 for s, x in zip(strict, lax, strict=True)]
    if rules.conflictbank_one_run_per_claim:
        main = [(s + x + m) / 3 for s, x, m in zip(strict, lax, moderate, strict=True)]
        out |= {
            "moderate": float(np.mean(moderate)),
            "moderate_ci95": bca_interval(list(moderate), resamples, seed).as_dict(),
            "main": float(np.mean(main)),
            "main_ci95": bca_interval(main, resamples, seed).as_dict(),
        }
    by_claim = {}
    for kind in CB_RESPONSES:  # default claim (RD) and conflict claim (RC) apart
        picked = [i for i, claim_id in enumerate(ids) if claim_id.endswith(f":{kind}")]
        if picked:
            by_claim[kind] = {
                "n": len(picked),
                "strict": float(np.mean([strict[i] for i in picked])),
                "lax": float(np.mean([lax[i] for i in picked])),
            }
    return out | {
        "by_claim": by_claim,
        "strict": float(np.mean(strict)),
        "lax": float(np.mean(lax)),
        "lmr": float(np.mean(mean)),
        "ci95": bca_interval(mean, resamples, seed).as_dict(),
        "strict_ci95": bca_interval(strict, resamples, seed).as_dict(),
        "lax_ci95": bca_interval(lax, resamples, seed).as_dict(),
    }


# ---- both datasets ---------------------------------------------------------------------------


def wc_matches(records: Sequence[ItemResult], rules: Rules = PAPER) -> list[int]:
    """1 per WikiContradict record whose score matches its label, else 0."""
    scores = [table_score(r, rules) for r in records]
    if rules.wikicontradict_thresholds:
        return [
            int(s is not None and wc_predicted(s) == _label(r))
            for s, r in zip(scores, records, strict=True)
        ]
    return [wc_match(s, _label(r)) for s, r in zip(scores, records, strict=True)]


def combined_lmr(
    wc: Sequence[float],
    cb: Sequence[float],
    resamples: int = 10_000,
    seed: int = PAPER.bootstrap_seed,
) -> dict[str, Any]:
    """Figure 5: the mean of the WikiContradict LMR and the ConflictBank mean LMR, with a BCa
    interval from an unpaired bootstrap (each dataset resampled on its own)."""
    x, y = np.asarray(wc, dtype=float), np.asarray(cb, dtype=float)
    value = float((x.mean() + y.mean()) / 2)
    if np.all(x == x[0]) and np.all(y == y[0]):
        return {"lmr": value, "ci95": Interval(value, value, "degenerate").as_dict()}
    from scipy import stats  # here: the CLI imports this module, few runs compute an interval

    result = stats.bootstrap(
        (x, y),
        lambda a, b, axis=-1: (a.mean(axis=axis) + b.mean(axis=axis)) / 2,
        paired=False,
        vectorized=True,
        confidence_level=0.95,
        n_resamples=resamples,
        method="BCa",
        random_state=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    interval = Interval(float(ci.low), float(ci.high), f"BCa unpaired, {resamples} resamples")
    return {"lmr": value, "ci95": interval.as_dict()}


def print_lmr(result: dict[str, Any], console: Console) -> None:
    table = Table("measure", "value", title=f"LMR on {result['dataset']} ({result['method']})")
    ci = result.get("ci95")
    lmr = "undefined (no complete item yet)" if result["lmr"] is None else f"{result['lmr']:.4f}"
    if ci:
        lmr += f"  [{ci['low']:.4f}, {ci['high']:.4f}] ({ci['method']})"
    table.add_row("LMR", lmr)
    for key in ("strict", "lax", "moderate", "main"):
        if key in result:
            name = "main (reference: lax, moderate, strict)" if key == "main" else f"LMR {key}"
            table.add_row(name, f"{result[key]:.4f}")
    for label, entry in result.get("by_label", {}).items():
        table.add_row(f"label {label}", f"{entry['lmr']:.4f} (n={entry['n']})")
    for claim, entry in result.get("by_claim", {}).items():
        table.add_row(
            f"claim {claim} strict / lax",
            f"{entry['strict']:.4f} / {entry['lax']:.4f} (n={entry['n']})",
        )
    table.add_row("not scored", json.dumps(result["not_scored"]))
    if "undefined_scored_as_zero" in result:
        table.add_row("undefined, scored 0 (paper)", str(result["undefined_scored_as_zero"]))
    if result.get("single_source_lax"):
        table.add_row("lax over one source (÷1)", str(result["single_source_lax"]))
    if result.get("default_source_without_nodes"):
        table.add_row("claims without a default node", str(result["default_source_without_nodes"]))
    console.print(table)
