"""Does the judge's verdict follow the judged text's length? (``agreement RUN --bias``)

Long answers win with LLM judges (68% of the MT-Bench verdicts a reanalysis looked at). Per
run, read from its directory (no model call):

- the item's score against the length of the answer it judged (words of
  ``Framework.item_text``'s answer): Spearman's rho and Kendall's tau with a 95% bootstrap
  interval over items, and the mean score of the shortest and the longest third;
- per judging stage of a panel (``details["panel"]``), the combined verdict (ordered labels
  ranked, scores as they are) against the same length;
- with human ``score`` labels (the run's ``labels/``, ``--human``, or the dataset's), whether the
  judge's error (judge - human) follows the length too: a judge whose verdicts track length
  because the humans' do is not biased by it;
- a judge of the answering model's family (the same leading name: ``Qwen2.5-7B`` judging
  ``Qwen2.5-72B``), said, beside the self-judging a manifest already records.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.contract.roles import SYSTEM_ROLES
from .agreement import Unit, by_item_interval, rank_correlations


def words(text: str | None) -> int | None:
    return None if text is None else len(text.split())


def length_audit(run_dir: Path, human: dict[tuple[str, str, int], Any] | None = None) -> dict:
    from ..exports.rows import run_rows
    from ..people.labels import run_labels

    run = run_rows(run_dir)
    records = list(run.records)
    length = {r.id: words(t.answer) if (t := run.text(r)) else None for r in records}
    out: dict[str, Any] = {"run": str(run_dir), "task": run.manifest.task}
    if run.items is None:
        out["note"] = "; ".join(run.notes) or "the run's inputs cannot be read: no lengths"
        return out
    scored = {r.id: r.score for r in records if r.score is not None and length[r.id] is not None}
    out["score"] = correlation(scored, length)
    out["score"] |= thirds(scored, length)
    stages: dict[str, dict[str, Any]] = {}
    for stage, verdicts in panel_verdicts(run.framework, records).items():
        stages[stage] = correlation(verdicts, length)
    if stages:
        out["stages"] = stages
    labels = run_labels(run_dir) | dict(human or {})
    truth = {i: float(v) for (i, stage, _), v in labels.items() if stage == "score"}
    errors = {i: scored[i] - truth[i] for i in scored if i in truth}
    if errors:
        out["error"] = correlation(errors, length)
    family = same_family(run.manifest.roles or {})
    if family:
        out["same_family"] = family
    return out


def correlation(values: dict[str, Any], length: dict[str, int | None]) -> dict[str, Any]:
    """Spearman's rho and Kendall's tau of ``values`` with length, with a 95% bootstrap
    interval of rho over items."""
    units = [Unit(i, "length", 0, [float(v), float(length[i] or 0)]) for i, v in values.items()]

    def rho(found):
        return rank_correlations([u.values[0] for u in found], [u.values[1] for u in found])[1]

    tau, spearman = rank_correlations([u.values[0] for u in units], [u.values[1] for u in units])
    return {
        "units": len(units),
        "spearman": spearman,
        "kendall": tau,
        "spearman_ci": by_item_interval(units, rho),
    }


def thirds(scores: dict[str, float], length: dict[str, int | None]) -> dict[str, Any]:
    """The mean score of the shortest and the longest third of the answers."""
    ordered = sorted(scores, key=lambda i: (length[i] or 0, i))
    third = len(ordered) // 3
    if third == 0:
        return {}
    short = [scores[i] for i in ordered[:third]]
    long = [scores[i] for i in ordered[-third:]]
    return {"shortest_third": float(np.mean(short)), "longest_third": float(np.mean(long))}


def panel_verdicts(framework: Any, records: list[Any]) -> dict[str, dict[str, float]]:
    """Per panel stage, item -> the combined verdict as a number (the mean over the item's
    units; ordered labels by rank, unordered labels left out)."""
    out: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for entry in record.details.get("panel", []):
            rule = framework.panel_rule(entry["stage"])
            order = getattr(rule, "order", None)
            value = entry["value"]
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                number = float(value)
            elif order and value in order:
                number = float(order.index(value))
            else:
                continue
            out.setdefault(entry["stage"], {}).setdefault(record.id, []).append(number)
    return {s: {i: float(np.mean(v)) for i, v in found.items()} for s, found in out.items()}


def family(model: str) -> str:
    """A model's family: the letters its name starts with, after any organisation
    (``meta-llama/Llama-3.1-8B`` -> ``llama``, ``Qwen2.5-72B-Instruct`` -> ``qwen``)."""
    name = model.rsplit("/", 1)[-1].lower()
    found = re.match(r"[a-z]+", name)
    return found.group(0) if found else name


def same_family(roles: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Judging roles whose model is of the answering model's family."""

    def name(record: dict[str, Any]) -> str:
        return str(record.get("request_model") or record.get("model") or "")

    found = []
    for system in SYSTEM_ROLES:
        if system not in roles:
            continue
        answering = name(roles[system])
        for role, record in roles.items():
            if role in SYSTEM_ROLES or not name(record):
                continue
            if family(name(record)) == family(answering):
                found.append(
                    {"system": answering, "judge": name(record), "role": role}
                    | {"family": family(answering)}
                )
    return found


def render_bias(found: list[dict[str, Any]], out: Any) -> None:
    def line(what: str, c: dict[str, Any]) -> str:
        rho, ci = c.get("spearman"), c.get("spearman_ci")
        shown = "undefined" if rho is None else f"{rho:+.3f}"
        interval = f" ({ci[0]:+.3f} to {ci[1]:+.3f})" if ci else ""
        return f"  {what}: Spearman rho with length {shown}{interval} over {c['units']} items"

    for run in found:
        out.print(f"length bias: {run['run']} ({run['task']})", highlight=False, soft_wrap=True)
        if "note" in run:
            out.print(f"  {run['note']}", highlight=False)
            continue
        score = run["score"]
        out.print(line("score", score), highlight=False)
        if "shortest_third" in score:
            out.print(
                f"  mean score: shortest third {score['shortest_third']:.4f}, longest third "
                f"{score['longest_third']:.4f}",
                highlight=False,
            )
        for stage, c in run.get("stages", {}).items():
            out.print(line(f"stage {stage}", c), highlight=False)
        if "error" in run:
            out.print(line("judge - human error", run["error"]), highlight=False)
        for pair in run.get("same_family", []):
            out.print(
                f"  note: judge {pair['judge']} ({pair['role']}) is of the answering model's "
                f"family ({pair['system']}, {pair['family']})",
                highlight=False,
            )
