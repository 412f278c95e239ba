"""How far to trust a judge: agreement between the judges of a panel, with human labels, and
the metric's mean corrected by human labels (prediction-powered inference).

Read from run directories only (no model calls):

- **Panel agreement**, per judging stage of a panel run (``details["panel"]``, see
  ``runtime.contract.panels``): Cohen's kappa for each pair of members (labels), Kendall's tau
  and Spearman's rho (scores and ordered labels), and Krippendorff's alpha over all members at
  the stage's level of measurement (nominal, ordinal, interval). Each with a 95% bootstrap
  interval over items (an item's units are resampled together). The units the members disagree
  on most come last, with their item ids for the drill-down.
- **Runs as judges**: several runs over the same items (one judge each) are compared on their
  item scores, the same way.
- **Against human labels** (``--human FILE``, JSON Lines ``{"id", "stage", "label"}``; ``key``
  numbers a stage's units within an item, from 0, default 0): the panel's combined answer and each
  member against the humans, with a confusion matrix per label. Stage ``score`` labels an
  item's score: it works for any run, panel or not.
- **Prediction-powered mean** (Angelopoulos et al., 2023; PPI++, Angelopoulos, Duchi and Zrnic
  2023, through their ``ppi_py``): with human scores for a subset of the items, the mean three
  ways: the judge's over all items (classical interval), the humans' over their subset, and the
  judge's mean over the unlabelled items corrected by the judge's error on the labelled ones,
  weighted by the power-tuned lambda (never wider than the humans' own interval), with its
  interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.text import Text

from ...runtime.contract.panels import Average, Cover, Level, PanelRule, Vote
from ...runtime.contract.results import ItemResult
from ...runtime.store.run_dir import run_directories
from ..people.labels import read_queue, run_labels
from .cascade import render_run, run_cascade
from .human import read_human as read_human
from .units import Unit as Unit
from .units import judged_units as judged_units
from .units import panel_units

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
RESAMPLES = 1000
SHOWN = 10  # disagreements listed per stage


# ---- statistics ----------------------------------------------------------------------------


def cohen_kappa(a: Sequence[Any], b: Sequence[Any]) -> float | None:
    """Cohen's kappa of two raters' nominal labels over the units both labelled (None when
    chance agreement is certain: both gave one label throughout, or no unit)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(x == y for x, y in pairs) / n
    left: dict[Any, int] = defaultdict(int)
    right: dict[Any, int] = defaultdict(int)
    for x, y in pairs:
        left[x] += 1
        right[y] += 1
    expected = sum(left[k] * right.get(k, 0) for k in left) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


def krippendorff_alpha(rows: Sequence[Sequence[float | None]], level: Level) -> float | None:
    """Krippendorff's alpha of raters (rows) over units (columns), numbers or None, at
    ``level`` (the ``krippendorff`` package); None when it is undefined (fewer than two
    values in every unit, or a single value overall)."""
    import krippendorff

    data = np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
    pairable = (~np.isnan(data)).sum(axis=0) >= 2
    if not pairable.any() or len(np.unique(data[:, pairable][~np.isnan(data[:, pairable])])) < 2:
        return None
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))


def rank_correlations(a: Sequence[Any], b: Sequence[Any]) -> tuple[float | None, float | None]:
    """(Kendall's tau-b, Spearman's rho) over the units both rated (scipy; None when
    undefined: fewer than two units, or a constant rater)."""
    from scipy import stats

    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if len(pairs) < 2 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None, None
    x, y = zip(*pairs, strict=True)
    return float(stats.kendalltau(x, y).statistic), float(stats.spearmanr(x, y).statistic)


def by_item_interval(
    units: Sequence[Unit], statistic: Callable[[Sequence[Unit]], float | None], seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of ``statistic`` with items resampled (an item's units
    together); None with fewer than two items or no defined resample."""
    items: dict[str, list[Unit]] = defaultdict(list)
    for unit in units:
        items[unit.item].append(unit)
    groups = list(items.values())
    if len(groups) < 2:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(RESAMPLES):
        picked = rng.integers(0, len(groups), len(groups))
        value = statistic([u for k in picked for u in groups[k]])
        if value is not None and math.isfinite(value):
            values.append(value)
    if len(values) < RESAMPLES // 2:  # mostly undefined: no honest interval
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def ppi_mean(
    labelled: Sequence[float],
    predicted: Sequence[float],
    unlabelled: Sequence[float],
    lam: float | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """Prediction-powered estimate of a mean and its 95% interval, by the method authors' own
    package (``ppi_py``): PPI++ (Angelopoulos, Duchi and Zrnic 2023) with the power-tuned
    lambda, clipped to [0, 1], so never wider than the labels' own (classical) interval up to
    its estimate; ``lam=1`` is the original PPI (the unlabelled predictions' mean plus the
    labelled units' mean of label - prediction), ``lam=0`` the labels alone. ``weights``: each
    labelled unit's inverse inclusion probability where the labels were drawn by a design
    (``agreement --sample``), so the correction is the population's, not the sample's."""
    import ppi_py

    y = np.asarray(labelled, dtype=float)
    f = np.asarray(predicted, dtype=float)
    g = np.asarray(unlabelled, dtype=float)
    if not (y.size and y.size == f.size and g.size):
        raise ValueError("PPI needs labelled units with predictions and unlabelled units")
    w = None if weights is None else np.asarray(weights, dtype=float)
    if lam is None and np.ptp(np.concatenate([f, g])) == 0:
        # a judge that gives one value throughout says nothing: ppi_py's tuning divides by
        # its zero variance (NaN); any lambda gives the labels' own mean, so take 0
        lam = 0.0
    estimate = ppi_py.ppi_mean_pointestimate(y, f, g, lam=lam, w=w)
    low, high = ppi_py.ppi_mean_ci(y, f, g, alpha=0.05, lam=lam, w=w)
    return _scalar(estimate), _scalar(low), _scalar(high)


def design_ppi(
    scores: dict[str, float], labels: dict[str, float], weights: Sequence[float] | None
) -> tuple[float, float, float]:
    """The prediction-powered mean of a run's items from the labels of some (``labels``, in
    order, each with its inverse inclusion probability in ``weights`` where a design drew them).
    Where the labels were drawn with unequal probabilities the items left unlabelled are no
    sample of the run (those likelier to be drawn are fewer among them), so the judge's mean is
    taken over every scored item and the labels' weighted errors correct it (Zrnic and Candes's
    estimator); with equal probabilities, ppi_py's own over the unlabelled items."""
    labelled = list(labels)
    unequal = weights is not None and len(set(weights)) > 1
    imputed = scores.values() if unequal else [v for i, v in scores.items() if i not in labels]
    return ppi_mean(
        [labels[i] for i in labelled],
        [scores[i] for i in labelled],
        list(imputed),
        weights=weights,
    )


def _scalar(value: Any) -> float:
    """ppi_py answers in arrays of one number (a d-dimensional mean with d = 1)."""
    return float(np.asarray(value, dtype=float).reshape(-1)[0])


def classical_mean(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean and its 95% normal interval (sample standard deviation)."""
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    if data.size < 2:
        return mean, mean, mean
    half = Z95 * float(data.std(ddof=1)) / math.sqrt(data.size)
    return mean, mean - half, mean + half


# ---- coding values -------------------------------------------------------------------------


def level_of(rule: PanelRule | None, values: Sequence[Any]) -> Level:
    if isinstance(rule, Vote | Average | Cover):
        return rule.level
    given = [v for v in values if v is not None]  # a rater's missing value says nothing
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in given)
    return "interval" if numeric else "nominal"


def coder(rule: PanelRule | None, values: Sequence[Any]) -> Callable[[Any], float | None]:
    """Values as numbers for alpha and rank correlations: ordered labels by their rank, other
    labels by a code (nominal), scores as they are."""
    if isinstance(rule, Vote) and rule.order is not None:
        rank = {label: i for i, label in enumerate(rule.order)}
        return lambda v: None if v is None else float(rank[v]) if v in rank else None
    if level_of(rule, values) == "nominal":
        codes = {v: i for i, v in enumerate(sorted({str(v) for v in values if v is not None}))}
        return lambda v: None if v is None else float(codes[str(v)])
    return lambda v: None if v is None else float(v)


# ---- agreement of raters on units ----------------------------------------------------------


def raters_agreement(
    units: Sequence[Unit], raters: Sequence[str], rule: PanelRule | None
) -> dict[str, Any]:
    """Pairwise and overall agreement of ``raters`` (one value each per unit), with intervals,
    and the units they disagree on most."""
    values = [v for u in units for v in u.values]
    level = level_of(rule, values)
    code = coder(rule, values)
    labels = level in ("nominal", "ordinal")

    def alpha(us: Sequence[Unit]) -> float | None:
        rows = [[code(u.values[r]) for u in us] for r in range(len(raters))]
        return krippendorff_alpha(rows, level)

    pairwise = []
    for i in range(len(raters)):
        for j in range(i + 1, len(raters)):
            pair: dict[str, Any] = {"a": raters[i], "b": raters[j]}

            def kappa(us: Sequence[Unit], i: int = i, j: int = j) -> float | None:
                return cohen_kappa([u.values[i] for u in us], [u.values[j] for u in us])

            def tau(us: Sequence[Unit], i: int = i, j: int = j) -> float | None:
                return rank_correlations(
                    [code(u.values[i]) for u in us], [code(u.values[j]) for u in us]
                )[0]

            both = [u for u in units if u.values[i] is not None and u.values[j] is not None]
            pair["units"] = len(both)
            if labels:
                pair["agree"] = (
                    sum(u.values[i] == u.values[j] for u in both) / len(both) if both else None
                )
                pair["kappa"] = kappa(units)
                pair["kappa_ci"] = by_item_interval(units, kappa)
            if level != "nominal":
                rank = rank_correlations(
                    [code(u.values[i]) for u in units], [code(u.values[j]) for u in units]
                )
                pair["kendall_tau"], pair["spearman_rho"] = rank
                pair["kendall_tau_ci"] = by_item_interval(units, tau)
            pairwise.append(pair)
    return {
        "raters": list(raters),
        "units": len(units),
        "items": len({u.item for u in units}),
        "level": level,
        "alpha": alpha(units),
        "alpha_ci": by_item_interval(units, alpha),
        "pairwise": pairwise,
        "disagreements": disagreements(units, code, labels),
    }


def disagreements(
    units: Sequence[Unit], code: Callable[[Any], float | None], labels: bool
) -> list[dict[str, Any]]:
    """The units the raters disagree on most: labels by the share outside the commonest one,
    scores by their spread (standard deviation)."""

    def spread(unit: Unit) -> float:
        given = [v for v in unit.values if v is not None]
        if len(given) < 2:
            return 0.0
        if labels:
            top = max(given.count(v) for v in given)
            return 1.0 - top / len(given)
        coded = [c for c in (code(v) for v in given) if c is not None]
        return float(np.std(coded)) if coded else 0.0

    ranked = sorted(units, key=lambda u: (-spread(u), u.item, u.key))
    return [
        {"item": u.item, "stage": u.stage, "key": u.key, "values": u.values, "spread": spread(u)}
        for u in ranked[:SHOWN]
        if spread(u) > 0
    ]


# ---- reading runs --------------------------------------------------------------------------


def confusion(judge: Sequence[Any], human: Sequence[Any]) -> dict[str, dict[str, int]]:
    """human label -> judge label -> count, over the units both labelled."""
    table: dict[str, dict[str, int]] = {}
    for j, h in zip(judge, human, strict=True):
        if j is not None and h is not None:
            row = table.setdefault(str(h), {})
            row[str(j)] = row.get(str(j), 0) + 1
    return table


def against_humans(
    units: Sequence[Unit],
    members: Sequence[str],
    human: dict[tuple[str, str, int], Any],
    rule: PanelRule | None,
) -> dict[str, Any] | None:
    """The panel (combined) and each member against the human labels of a stage's units."""
    labelled = [u for u in units if (u.item, u.stage, u.key) in human]
    if not labelled:
        return None
    truth = [human[(u.item, u.stage, u.key)] for u in labelled]
    out: dict[str, Any] = {"units": len(labelled), "judges": {}}
    judges = {"panel": [u.combined for u in labelled]} if len(members) > 1 else {}
    judges |= {m: [u.values[k] for u in labelled] for k, m in enumerate(members)}
    for name, given in judges.items():
        pair = [
            Unit(u.item, u.stage, u.key, [g, t])
            for u, g, t in zip(labelled, given, truth, strict=True)
        ]
        stats = raters_agreement(pair, [name, "human"], rule)
        entry = {"alpha": stats["alpha"], "alpha_ci": stats["alpha_ci"], **stats["pairwise"][0]}
        if stats["level"] != "interval":
            entry["confusion"] = confusion(given, truth)
        out["judges"][name] = entry
    return out


def judge_errors(
    units: Sequence[Unit],
    members: Sequence[str],
    human: dict[tuple[str, str, int], Any],
    rule: PanelRule | None,
) -> dict[str, Any] | None:
    """How the panel members' errors against the human labels go together. A member's error
    on a unit is 1 when its label differs from the human's, else 0 (nominal labels), or its
    value minus the human's (ordered labels by rank, scores). Per pair of members: the Pearson
    correlation of their errors over the units both answered (and, for labels, how often both
    were wrong against how often that would happen were their errors independent). The
    effective number of independent judges is ``n / (1 + (n - 1) * r)``, with ``r`` the mean
    pairwise error correlation: the panel's mean error varies as that many judges with
    uncorrelated errors would (Kish's design effect); ``n`` when errors are uncorrelated, 1
    when they are perfectly correlated. With a 95% interval, items resampled."""
    labelled = [u for u in units if (u.item, u.stage, u.key) in human]
    if len(members) < 2 or not labelled:
        return None
    values = [v for u in labelled for v in u.values] + [
        human[(u.item, u.stage, u.key)] for u in labelled
    ]
    code = coder(rule, values)
    nominal = level_of(rule, values) == "nominal"

    def error(unit: Unit, k: int) -> float | None:
        given, truth = unit.values[k], human[(unit.item, unit.stage, unit.key)]
        if given is None or truth is None:
            return None
        if nominal:
            return float(str(given) != str(truth))
        a, b = code(given), code(truth)
        return None if a is None or b is None else a - b

    errs = [
        Unit(u.item, u.stage, u.key, [error(u, k) for k in range(len(members))]) for u in labelled
    ]
    pairs = [(i, j) for i in range(len(members)) for j in range(i + 1, len(members))]

    def correlation(us: Sequence[Unit], i: int, j: int) -> float | None:
        both = [(u.values[i], u.values[j]) for u in us if None not in (u.values[i], u.values[j])]
        if len(both) < 2:
            return None
        x, y = (np.array(side, dtype=float) for side in zip(*both, strict=True))
        if x.std() == 0 or y.std() == 0:  # a member that never errs (or always): undefined
            return None
        return float(np.corrcoef(x, y)[0, 1])

    def effective(us: Sequence[Unit]) -> float | None:
        found = [r for r in (correlation(us, i, j) for i, j in pairs) if r is not None]
        if not found:
            return None
        spread = 1 + (len(members) - 1) * float(np.mean(found))
        return len(members) / spread if spread > 0 else None

    table = []
    for i, j in pairs:
        entry: dict[str, Any] = {"a": members[i], "b": members[j]}
        entry["error_correlation"] = correlation(errs, i, j)
        if nominal:
            both = [u for u in errs if None not in (u.values[i], u.values[j])]
            if both:
                wrong_i = sum(u.values[i] for u in both) / len(both)
                wrong_j = sum(u.values[j] for u in both) / len(both)
                entry["both_wrong"] = sum(u.values[i] * u.values[j] for u in both) / len(both)
                entry["both_wrong_if_independent"] = wrong_i * wrong_j
        table.append(entry)
    found = [e["error_correlation"] for e in table if e["error_correlation"] is not None]
    return {
        "units": len(labelled),
        "judges": len(members),
        "error": "disagreement with the human label" if nominal else "value minus human's",
        "pairwise": table,
        "mean_error_correlation": float(np.mean(found)) if found else None,
        "effective_judges": effective(errs),
        "effective_judges_ci": by_item_interval(errs, effective),
    }


def prediction_powered(
    scores: dict[str, float], labels: dict[str, float], weights: dict[str, float] | None
) -> dict[str, Any]:
    """The prediction-powered mean of the judge's ``scores`` from people's ``labels`` of some
    items (each with a score), ``weights`` the labelling queue's (id -> 1 / its inclusion
    probability; None: no queue). Where the queue drew its items with unequal probabilities
    the mean is the design's: only the labels of items it drew, each weighted by 1 / its
    probability; a label of an item it did not draw (chosen by no known probability) cannot be
    weighted to stand for the run, and with the drawn ones unweighted the over-drawn items
    would bias the mean, so it is counted apart (``outside_design``) and left out. With equal
    probabilities every label is used, weighted where the queue drew them all."""
    out: dict[str, Any] = {}
    if weights is not None and len(set(weights.values())) > 1:  # an unequal design
        inside = [i for i in labels if i in weights]
        if inside:
            drawn = {i: labels[i] for i in inside}
            out["ppi"] = design_ppi(scores, drawn, [weights[i] for i in inside])
        out["weighted"] = True
        if len(inside) < len(labels):  # in the humans' own mean, not in the design's
            out["outside_design"] = len(labels) - len(inside)
        return out
    drawn_all = weights is not None and all(i in weights for i in labels)
    used = [weights[i] for i in labels] if drawn_all and weights else None
    out["ppi"] = design_ppi(scores, labels, used)
    if weights is not None:
        out["weighted"] = drawn_all  # False: labels outside the queue, so none is weighted
    return out


def score_estimates(
    records: Sequence[ItemResult],
    human: dict[tuple[str, str, int], Any],
    weights: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """The run's mean score three ways, from the human ``score`` labels of some items;
    ``weights``: the labelling queue's (``agreement --sample``), as ``prediction_powered``
    uses them."""
    scores = {r.id: r.score for r in records if r.score is not None}
    recorded = {r.id for r in records}
    labels = {i: float(v) for (i, stage, _), v in human.items() if stage == "score"}
    both = [i for i in scores if i in labels]
    rest = [i for i in scores if i not in labels]
    if not both:
        return None
    graded = [v for i, v in labels.items() if i in recorded]  # the judge's failures too
    out: dict[str, Any] = {
        "items": len(scores),
        "labelled": len(graded),
        "judge": classical_mean(list(scores.values())),
        "human": classical_mean(graded),
    }
    if rest or (weights is not None and len(set(weights.values())) > 1):
        out |= prediction_powered(scores, {i: labels[i] for i in both}, weights)
    pair = [Unit(i, "score", 0, [scores[i], labels[i]]) for i in both]
    stats = raters_agreement(pair, ["judge", "human"], None)
    out["agreement"] = {"alpha": stats["alpha"], **stats["pairwise"][0]}
    unscored = [i for i in labels if i in recorded and i not in scores]
    if unscored:  # labelled items the judge gave no score: in the humans' mean, not in PPI
        out["labelled_without_a_score"] = len(unscored)
    return out


# ---- runs ----------------------------------------------------------------------------------


def run_agreement(run_dir: Path, human: dict | None, sample: int | None = None) -> dict[str, Any]:
    """One run: per panel stage the members' agreement (and with the humans), the run's
    decisions against the labels its dataset ships, and the mean score three ways where humans
    scored some items (``sample``: only that many items' dataset labels, drawn at random, as a
    team that labels a few would have)."""
    from ...runtime.contract.panels import panel_members
    from ...runtime.contract.plugins import run_framework, run_options
    from ...runtime.store.run_dir import (
        MANIFEST,
        RESULTS,
        read_manifest,
        results_by_id,
    )

    manifest = read_manifest(run_dir / MANIFEST)
    fw = run_framework(manifest, run_dir)
    options = run_options(fw, manifest, run_dir)
    records = list(results_by_id(run_dir / RESULTS))
    out: dict[str, Any] = {"run": str(run_dir), "task": manifest.task, "stages": {}}
    made = run_labels(run_dir)  # labels people gave in the run (``view``, ``labels import``)
    people = made | dict(human or {})  # a --human file wins over those
    for stage, units in panel_units(records).items():
        rule = fw.panel_rule(stage)
        members = panel_members(fw.role_of(stage, "judge"), list(manifest.roles))
        if len(members) != len(units[0].values):  # an older layout: name members by number
            members = [f"member {k}" for k in range(1, len(units[0].values) + 1)]
        models = [(manifest.roles.get(m) or {}).get("request_model", "?") for m in members]
        names = [f"{m} ({model})" for m, model in zip(members, models, strict=True)]
        entry = raters_agreement(units, names, rule)
        versus = against_humans(units, names, people, rule) if people else None
        if versus:
            entry["human"] = versus
            errors = judge_errors(units, names, people, rule)
            if errors:
                entry["errors"] = errors
        out["stages"][stage] = entry
    given = {r.id: fw.human_labels(r, options) for r in records}  # read once, used twice
    shipped = dataset_labels(given)
    if shipped:
        out["dataset_labels"] = shipped
    labels = dict(human or {})
    scored = {
        (i, "score", 0): float(label.human)
        for i, labels in given.items()
        for label in labels
        if label.stage == "score"
    }
    if scored and sample is not None:
        out["dataset_score_mean"] = classical_mean([v for v in scored.values()])
        keys = sorted(scored)
        picked = np.random.default_rng(0).permutation(len(keys))[:sample]
        scored = {keys[k]: scored[keys[k]] for k in sorted(picked)}
    # a user's own labels win over the dataset's; a --human file over those made in the run
    labels = scored | made | labels
    if labels:
        out["score"] = score_estimates(records, labels, read_queue(run_dir))
    cascaded = run_cascade(run_dir, records)
    if cascaded:
        out["cascade"] = cascaded
    return out


def dataset_labels(given: dict[str, list[Any]]) -> dict[str, Any]:
    """Per stage, the run's decisions against the labels the dataset's annotators gave
    (``Framework.human_labels``), with a confusion matrix for labels."""
    by_stage: dict[str, list[tuple[Unit, tuple | None]]] = defaultdict(list)
    for item, labels in given.items():
        for label in labels:
            unit = Unit(item, label.stage, label.key, [label.judged, label.human])
            by_stage[label.stage].append((unit, label.order))
    out = {}
    for stage, found in by_stage.items():
        if stage == "score":
            continue  # the score's mean, three ways: score_estimates
        order = found[0][1]
        rule = Vote(tie=None, order=order) if order else None
        units = [u for u, _ in found]
        stats = raters_agreement(units, ["run", "annotators"], rule)
        pair = stats["pairwise"][0]
        entry = {"alpha": stats["alpha"], "alpha_ci": stats["alpha_ci"]}
        entry |= {k: v for k, v in pair.items() if k not in ("a", "b")}  # units: both labelled
        entry["not_decided"] = sum(u.values[0] is None for u in units)  # no score: no label
        entry["confusion"] = confusion([u.values[0] for u in units], [u.values[1] for u in units])
        out[stage] = entry
    return out


def runs_as_judges(run_dirs: Sequence[Path]) -> dict[str, Any] | None:
    """Several runs over the same items, one judge each: agreement on their item scores."""
    from ...runtime.store.run_dir import RESULTS, results_by_id

    if len(run_dirs) < 2:
        return None
    scores = [{r.id: r.score for r in results_by_id(d / RESULTS)} for d in run_dirs]
    items = sorted(set().union(*scores))
    units = [Unit(i, "score", 0, [s.get(i) for s in scores]) for i in items]
    return raters_agreement(units, [str(d) for d in run_dirs], None)


def agreement(
    paths: Sequence[Path], human_file: Path | None, sample: int | None = None
) -> dict[str, Any]:
    runs = run_directories(paths)
    human = read_human(human_file, runs) if human_file is not None else None
    out: dict[str, Any] = {"runs": [run_agreement(d, human, sample) for d in runs]}
    across = runs_as_judges(runs)
    if across is not None:
        out["across_runs"] = across
    return out


# ---- printing ------------------------------------------------------------------------------


def _num(value: float | None, ci: Any = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.3f}"
    return text + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")


def render(report: dict[str, Any], out: Any) -> None:
    for run in report["runs"]:
        out.print(Text.assemble((str(run["run"]), "bold"), f" ({run['task']})"))  # no markup
        if not run["stages"] and not run.get("cascade"):
            out.print("  no judge panel in this run (--role judge=A --role judge=B makes one)")
        if run.get("cascade"):
            render_run(run["cascade"], out)
        for stage, stats in run["stages"].items():
            _agreement_table(f"stage {stage}", stats, out)
            for name, versus in ((stats.get("human") or {}).get("judges") or {}).items():
                _versus_humans(name, versus, out)
            if stats.get("errors"):
                _errors(stats["errors"], out)
        for stage, versus in (run.get("dataset_labels") or {}).items():
            _versus_humans(f"stage {stage}: the run", versus, out)
        if run.get("score"):
            _estimates(run["score"], out)
        for kind, found in (run.get("audits") or {}).items():
            _audit_line(kind, found, out)
        if run.get("dataset_score_mean"):
            mean, low, high = run["dataset_score_mean"]
            out.print(f"  every annotator label, for reference: {mean:.4f} ({low:.4f}-{high:.4f})")
    if "across_runs" in report:
        _agreement_table("runs as judges (item scores)", report["across_runs"], out)


def _agreement_table(title: str, stats: dict[str, Any], out: Any) -> None:
    from rich.table import Table

    alpha = _num(stats["alpha"], stats["alpha_ci"])
    out.print(
        f"{title}: {stats['units']} units in {stats['items']} items, {stats['level']}; "
        f"Krippendorff's alpha {alpha}"
    )
    table = Table("rater", "rater", "units", "agree", "Cohen's kappa", "Kendall tau", "Spearman")
    for p in stats["pairwise"]:
        kappa = _num(p.get("kappa"), p.get("kappa_ci"))
        tau = _num(p.get("kendall_tau"), p.get("kendall_tau_ci"))
        row = [p["a"], p["b"], str(p["units"]), _num(p.get("agree")), kappa, tau]
        table.add_row(*row, _num(p.get("spearman_rho")))
    out.print(table)
    for d in stats["disagreements"]:
        out.print(f"  disagree: item {d['item']} ({d['stage']} #{d['key']}): {d['values']}")


def _versus_humans(name: str, versus: dict[str, Any], out: Any) -> None:
    alpha = _num(versus["alpha"], versus["alpha_ci"])
    kappa = _num(versus.get("kappa"), versus.get("kappa_ci"))
    out.print(
        f"  {name} vs human on {versus['units']} units: alpha {alpha}, kappa {kappa}, "
        f"agree {_num(versus.get('agree'))}"
    )
    for truth, row in (versus.get("confusion") or {}).items():
        out.print(f"    human {truth}: judge {row}")


AUDITS = {
    "swap": "order (texts swapped, --swap-audit)",
    "rerun": "self-consistency (asked again, --rerun)",
    "paraphrase": "rubric wording (paraphrases, --paraphrase)",
}


def _audit_line(kind: str, found: dict[str, Any], out: Any) -> None:
    rate = _num(found["flip_rate"], found["flip_rate_ci"])
    out.print(
        f"  audit of {AUDITS[kind]}: {found['flips']} of {found['answered']} flip, {rate}"
        + (f"; {found['unparseable']} unparseable" if found["unparseable"] else ""),
        highlight=False,
    )
    for name, part in (found.get("by_member") or found.get("by_variant") or {}).items():
        out.print(
            f"    {name}: {part['flips']} of {part['answered']} flip, "
            f"{_num(part['flip_rate'], part['flip_rate_ci'])}",
            highlight=False,
        )


def _errors(errors: dict[str, Any], out: Any) -> None:
    n_eff = _num(errors["effective_judges"], errors["effective_judges_ci"])
    out.print(
        f"  correlated errors on {errors['units']} labelled units ({errors['error']}): mean "
        f"correlation {_num(errors['mean_error_correlation'])}; effective independent judges "
        f"{n_eff} of {errors['judges']} (n / (1 + (n - 1) r))",
        highlight=False,
    )
    for p in errors["pairwise"]:
        both = ""
        if "both_wrong" in p:
            both = (
                f", both wrong {_num(p['both_wrong'])} (independent: "
                f"{_num(p['both_wrong_if_independent'])})"
            )
        out.print(
            f"    {p['a']} / {p['b']}: error correlation {_num(p['error_correlation'])}{both}",
            highlight=False,
        )


def _estimates(score: dict[str, Any], out: Any) -> None:
    from rich.table import Table

    table = Table("estimate of the mean score", "mean", "95% interval", "items")
    for name, key, n in (
        ("judge only (classical)", "judge", score["items"]),
        ("humans only (their subset)", "human", score["labelled"]),
        ("prediction-powered (PPI++, judge corrected)", "ppi", score["items"]),
    ):
        if key in score:
            mean, low, high = score[key]
            table.add_row(name, f"{mean:.4f}", f"{low:.4f}-{high:.4f}", str(n))
    out.print(table)
    if score.get("weighted") is False:
        out.print("note: some labels are of items outside the labelling queue: unweighted")
    elif score.get("weighted"):
        out.print("prediction-powered: each label weighted by its queue's inclusion probability")
    if score.get("outside_design"):
        out.print(
            f"note: {score['outside_design']} labelled items outside the labelling queue, drawn "
            "by no known probability: not used in the prediction-powered mean (its design's), "
            "counted in the humans' own",
            highlight=False,
        )
