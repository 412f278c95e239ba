"""Trust or escalate: a threshold on each judge's confidence, calibrated on human labels, under
which its judgements agree with people at least 1 - alpha of the time with probability at least
1 - delta (Jung, Brahman and Choi, "Trust or Escalate: LLM Judges with Provable Guarantees for
Human Agreement", ICLR 2025).

The threshold is chosen by fixed-sequence testing over a descending sequence of thresholds:
at each, the judgements kept (confidence at or above it) are tested for H0 "their disagreement
with people is at least alpha" by the exact binomial test, p = P[Binomial(n, alpha) <= errors];
the threshold is lowered while H0 is rejected at level delta, and the last one rejected is kept.
(p <= delta is the same as the Clopper-Pearson upper (1 - delta) bound on the disagreement lying
below alpha.) Which thresholds are tested is the ``Grid`` (``--grid``), a function of the labelled
judgements' confidences and of alpha and delta alone, never of whether they agree with people:

- ``steps`` (the default): the thresholds keeping exactly the counts k_1 < k_2 < ... at which
  the exact test first lets one more disagreement pass (k_e, the fewest kept judgements with
  P[Binomial(k_e, alpha) <= e] <= delta: 38, 52, 65, 78, ... at alpha = delta = 0.1), from one
  disagreement on, and last the threshold keeping them all. Each step is the most a count with
  e disagreements can be tested at, and one disagreement near the top cannot end the sequence.
- ``every``: every distinct confidence, highest first, from where at least ln(delta) /
  ln(1 - alpha) are kept (above it no labels could reject): the first way, kept to compare.

Why it holds (fixed-sequence testing): the sequence t_1 > t_2 > ... is fixed before any
agreement is read. Let t_j be the first of it whose H0 is true (disagreement at least alpha).
A threshold with a true H0 can only be chosen if H0 at t_j is rejected (the walk stops at its
first failure), which happens with probability at most delta (the exact test is valid at each
fixed threshold, given how many it keeps). So the chosen threshold's disagreement is below alpha
with probability at least 1 - delta, whatever the grid, as long as it never looks at the
agreements: a coarser grid spends no level on multiplicity, it only tests fewer, better-filled
thresholds.

A cascade of judges, cheapest first, keeps a judgement at the first tier whose confidence clears
that tier's threshold, escalates it otherwise, and abstains after the last. Each tier is
calibrated on the labelled judgements that reach it, at delta / K for K tiers, so that every
tier's kept judgements hold their guarantee together (a union bound) and so the cascade's: the
kept set's disagreement is a mixture of the tiers' at most alpha each.

With zero disagreements among n kept judgements, p = (1 - alpha)^n: the guarantee needs at least
ln(delta) / ln(1 - alpha) labelled judgements above the threshold (22 at alpha = delta = 0.1);
fewer, and it cannot be given at all (``labels_needed``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...runtime.contract.cascade import (
    CALIBRATION_KIND,
    NLI_TIER,
    PEOPLE,
    checked_confidence,
    confidence_problem,
    route,
)
from ...runtime.contract.cascade import content_digest as content_digest  # the file's own digest
from ...runtime.contract.panels import numbered
from .units import panel_units


@dataclass(frozen=True)
class Guarantee:
    """Agreement with people of at least 1 - alpha, with probability at least 1 - delta."""

    alpha: float
    delta: float

    def __post_init__(self) -> None:
        for name in ("alpha", "delta"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ValueError(f"{name} {value}: want a number strictly between 0 and 1")

    def fewest_labels(self) -> int:
        """The fewest kept judgements with which the guarantee can hold (all of them agreeing)."""
        return math.ceil(math.log(self.delta) / math.log(1 - self.alpha))


def binomial_p_value(errors: int, kept: int, alpha: float) -> float:
    """P[Binomial(kept, alpha) <= errors]: the exact test of a disagreement of alpha or more."""
    from scipy.stats import binom

    return float(binom.cdf(errors, kept, alpha))


def clopper_pearson_upper(errors: int, kept: int, delta: float) -> float:
    """The one-sided upper (1 - delta) Clopper-Pearson bound on a disagreement rate."""
    from scipy.stats import beta

    if errors >= kept:
        return 1.0
    return float(beta.ppf(1 - delta, errors + 1, kept - errors))


@dataclass(frozen=True)
class Grid:
    """Which thresholds the fixed sequence tests (``--grid``): one rule set, named in the
    calibration it makes. Built from the labelled judgements' confidences (highest first), how
    many there are and the guarantee alone, never from their agreement with people."""

    name: str
    start_errors: int | None  # steps: the disagreements the first tested count allows ...
    start_share: float = 0.1  # ... fewer while that count is above this share of the labels

    def counts(self, labelled: int, guarantee: Guarantee) -> list[int] | None:
        """How many labelled judgements each tested threshold keeps, highest first (None: every
        distinct confidence from the fewest labels that could pass)."""
        if self.start_errors is None:
            return None
        firsts = first_counts(labelled, guarantee.alpha, guarantee.delta)
        start = min(self.start_errors, len(firsts) - 1)
        while start > 0 and firsts[start] > labelled * self.start_share:
            start -= 1
        out = [int(k) for k in firsts[max(start, 0) :]]
        return out if out and out[-1] == labelled else [*out, labelled]

    def as_json(self) -> dict[str, Any]:
        if self.start_errors is None:
            return {"name": self.name}
        return {"name": self.name, "start_errors": self.start_errors} | {
            "start_share": self.start_share
        }


@functools.lru_cache(maxsize=64)
def first_counts(labelled: int, alpha: float, delta: float) -> tuple[int, ...]:
    """k_0 < k_1 < ...: the fewest kept judgements with which the exact test lets 0, 1, ...
    disagreements pass (P[Binomial(k_e, alpha) <= e] <= delta), up to ``labelled``."""
    import numpy as np
    from scipy.stats import binom

    kept = np.arange(1, labelled + 1)
    allowed = binom.ppf(delta, kept, alpha)  # the fewest errors whose P reaches delta...
    allowed = np.where(binom.cdf(allowed, kept, alpha) <= delta, allowed, allowed - 1)
    best = np.maximum.accumulate(allowed)  # ...and the most that pass at this count or fewer
    rises = np.flatnonzero(np.diff(np.concatenate([[-1], best])) > 0)
    return tuple(int(kept[k]) for k in rises if best[k] >= 0)


EVERY = Grid("every", None)
STEPS = Grid("steps", 1)
GRIDS = {grid.name: grid for grid in (STEPS, EVERY)}


@dataclass
class Threshold:
    """One tier's calibration: the threshold (None: no threshold holds the guarantee), and what
    it keeps of the calibration set."""

    threshold: float | None
    kept: int
    errors: int
    labelled: int
    coverage: float
    upper_bound: float | None  # Clopper-Pearson's on the kept judgements' disagreement
    p_value: float | None
    attainable: bool
    labels_needed: int  # more kept labels that would make the guarantee attainable (0: it is)
    tested: list[dict[str, float]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def calibrate(
    confidences: Sequence[float],
    agrees: Sequence[bool],
    guarantee: Guarantee,
    grid: Grid = STEPS,
    floor: float | None = None,
) -> Threshold:
    """Fixed-sequence testing over the ``grid``'s descending thresholds of the confidences seen
    (the p-values of every level at once; the sequence is read until its first failure), none
    below ``floor`` (the band calibration draws were made from: the sequence cut short)."""
    import numpy as np
    from scipy.stats import binom

    if len(confidences) != len(agrees):
        raise ValueError("one agreement per confidence")
    given = np.asarray(confidences, dtype=float)
    wrong = np.flatnonzero(~np.isfinite(given) | (given < 0) | (given > 1))
    if wrong.size:  # a NaN would sort anywhere and make a NaN threshold
        k = int(wrong[0])
        raise ValueError(f"confidence #{k}: {confidence_problem(confidences[k])}")
    labelled = len(confidences)
    if not labelled:
        return _unattainable(0, [], guarantee, (0, 0))
    order = np.argsort(-np.asarray(confidences, dtype=float), kind="stable")
    ranked = np.asarray(confidences, dtype=float)[order]
    wrong = np.cumsum(~np.asarray(agrees, dtype=bool)[order])
    # each level's kept judgements: all with a confidence at or above it (ties kept together)
    last = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True))
    kept = last + 1
    # no labels could reject where fewer than `fewest` are kept: skipped by the count alone
    # (never by the labels), so the sequence stays fixed before any label is read
    top = (int(kept[0]), int(wrong[last][0]))  # the highest level's judgements
    counts = grid.counts(labelled, guarantee)
    if counts is None:
        usable = (kept >= guarantee.fewest_labels()) | (kept == labelled)
    else:  # the level keeping each count (ties kept together: it may keep a few more)
        usable = np.zeros(len(kept), dtype=bool)
        usable[np.unique(np.searchsorted(kept, counts))] = True
    if floor is not None:
        usable &= ranked[last] >= floor
    levels, kept, errors = ranked[last][usable], kept[usable], wrong[last][usable]
    p_values = binom.cdf(errors, kept, guarantee.alpha)
    failing = np.flatnonzero(p_values > guarantee.delta)
    stop = int(failing[0]) if failing.size else len(levels)
    tested = [
        {
            "threshold": float(levels[k]),
            "kept": int(kept[k]),
            "errors": int(errors[k]),
            "p_value": float(p_values[k]),
        }
        for k in range(min(stop + 1, len(levels)))
    ]
    if stop == 0:
        return _unattainable(labelled, tested, guarantee, top)
    k = stop - 1
    return Threshold(
        threshold=float(levels[k]),
        kept=int(kept[k]),
        errors=int(errors[k]),
        labelled=labelled,
        coverage=int(kept[k]) / labelled,
        upper_bound=clopper_pearson_upper(int(errors[k]), int(kept[k]), guarantee.delta),
        p_value=float(p_values[k]),
        attainable=True,
        labels_needed=0,
        tested=tested,
    )


def _unattainable(
    labelled: int, tested: list[dict[str, float]], guarantee: Guarantee, top: tuple[int, int]
) -> Threshold:
    return Threshold(
        threshold=None,
        kept=0,
        errors=0,
        labelled=labelled,
        coverage=0.0,
        upper_bound=None,
        p_value=tested[0]["p_value"] if tested else None,
        attainable=False,
        labels_needed=more_labels_needed(*top, guarantee),
        tested=tested,
    )


def more_labels_needed(kept: int, errors: int, guarantee: Guarantee) -> int:
    """How many more labelled judgements at the highest confidence, all agreeing with people,
    would let that level hold the guarantee (``kept`` there now, ``errors`` among them)."""
    more = 1
    while binomial_p_value(errors, kept + more, guarantee.alpha) > guarantee.delta:
        more += 1
    return more


@dataclass
class TierUnits:
    """A tier's view of the calibration units: its confidence and whether its verdict agrees
    with the human label, unit by unit (the same units, in the same order, for every tier)."""

    name: str
    confidences: list[float]
    agrees: list[bool]


def calibrate_cascade(
    tiers: Sequence[TierUnits],
    guarantee: Guarantee,
    grid: Grid = STEPS,
    floors: Sequence[float | None] = (),
) -> dict[str, Any]:
    """Each tier calibrated on the labelled units that reach it (those no earlier tier kept), at
    delta / K; the cascade's coverage, abstentions and disagreement on the calibration set."""
    if not tiers:
        raise ValueError("a cascade needs at least one tier")
    count = len(tiers[0].confidences)
    each = Guarantee(guarantee.alpha, guarantee.delta / len(tiers))
    reaching = list(range(count))
    out: list[dict[str, Any]] = []
    kept_errors = kept_total = 0
    for k, tier in enumerate(tiers):
        if len(tier.confidences) != count or len(tier.agrees) != count:
            raise ValueError(f"tier {tier.name}: one confidence and agreement per unit")
        found = calibrate(
            [tier.confidences[u] for u in reaching],
            [tier.agrees[u] for u in reaching],
            each,
            grid,
            floors[k] if k < len(floors) else None,
        )
        keeps = [
            u
            for u in reaching
            if found.threshold is not None and tier.confidences[u] >= found.threshold
        ]
        kept_total += len(keeps)
        kept_errors += sum(not tier.agrees[u] for u in keeps)
        out.append(
            {"tier": tier.name, "reached": len(reaching), "kept": len(keeps)} | found.as_json()
        )
        kept = set(keeps)
        reaching = [u for u in reaching if u not in kept]
    return {
        "alpha": guarantee.alpha,
        "delta": guarantee.delta,
        "delta_per_tier": each.delta,
        "grid": grid.as_json(),
        "units": count,
        "tiers": out,
        "kept": kept_total,
        "abstained": len(reaching),
        "coverage": kept_total / count if count else 0.0,
        "disagreement_kept": kept_errors / kept_total if kept_total else None,
    }


# ---- calibrating a cascade from recorded runs ----------------------------------------------


@dataclass
class TierRun:
    """One tier's recorded run: per label stage, each judged unit's verdict and confidence (the
    share of the tier's panel that gave the combined verdict: K samples or K paraphrased
    prompts of one model, "simulated annotators"), and the run's human labels."""

    run: str
    task: str
    members: list[str]
    models: list[str]
    units: dict[str, dict[tuple[str, str], tuple[Any, float]]]  # (item, asked digest) -> ...
    skipped: dict[str, str]
    labels: dict[tuple[str, str, str], Any]  # (item, stage, asked digest) -> the human label
    kinds: dict[str, str] = field(default_factory=dict)  # stage -> "share", "logprobs", "nli"
    annotators: bool = False  # its members asked with their own wordings (simulated)
    # per stage, the highest floor its calibration draws used: no threshold below it is tested
    floors: dict[str, float] = field(default_factory=dict)


def read_tier(run_dir: Any, human: dict[tuple[str, str, int], Any] | None) -> TierRun:
    """One tier's recorded run: per label stage, each judgement's verdict and confidence, and
    the human labels of those judgements. A judgement is known by its item and the digest of
    what it asked (the panel entry's ``asked``), never by its place among the item's
    judgements: tiers that asked an item's judgements in another order still line up, and a
    label given by its place in this run is moved onto the judgement that stood there."""
    from ...runtime.contract.panels import panel_members, verdict_of
    from ...runtime.contract.plugins import run_framework, run_options
    from ...runtime.store.run_dir import MANIFEST, RESULTS, read_manifest, results_by_id
    from ..people.labels import run_labels

    manifest = read_manifest(run_dir / MANIFEST)
    fw = run_framework(manifest, run_dir)
    options = run_options(fw, manifest, run_dir)
    records = list(results_by_id(run_dir / RESULTS))
    asked = {r.id: asked_of(r) for r in records}  # (stage, key) -> what the judgement asked
    units: dict[str, dict[tuple[str, str], tuple[Any, float]]] = {}
    skipped: dict[str, str] = {}
    members: list[str] = []
    for stage, found in panel_units(records).items():
        if verdict_of(fw.panel_rule(stage)) is None:
            skipped[stage] = "a score on an interval scale, not a label or a rating: no verdict"
            continue
        members = panel_members(fw.role_of(stage, "judge"), list(manifest.roles))
        stage_units = {}
        for unit in found:
            answered = [v for v in unit.values if v is not None]
            if unit.combined is None or not answered:
                continue
            share = sum(v == unit.combined for v in unit.values) / len(unit.values)
            stage_units[(unit.item, asked[unit.item][(stage, unit.key)])] = (unit.combined, share)
        units[stage] = stage_units
    kinds = dict.fromkeys(units, "share")
    models_of: dict[str, list[str]] = {}
    for stage, (kind, found_units) in lone_confidences(records, run_dir).items():
        if stage not in units:  # a lone judge's labels, recorded with --confidence logprobs
            units[stage], kinds[stage] = found_units, kind
            skipped.pop(stage, None)
            if kind == NLI_TIER:  # an NLI model's: the tier is the model, known by content
                members = [NLI_TIER]
                models_of[stage] = [nli_model_of(manifest, options)]
            else:
                members = [fw.role_of(stage, "judge")]
    # the dataset's own human grades, the labels people gave in the run, a --human file: the
    # later wins
    shipped = {
        (r.id, label.stage, label.key): label.human
        for r in records
        for label in fw.human_labels(r, options)
        if label.stage != "score"
    }
    by_place = shipped | run_labels(run_dir) | dict(human or {})
    labels = {
        (item, stage, asked[item][(stage, key)]): as_verdict(fw.panel_rule(stage), label)
        for (item, stage, key), label in by_place.items()
        if (stage, key) in asked.get(item, {})
    }
    models = [(manifest.roles.get(m) or {}).get("request_model", "?") for m in members]
    if members == [NLI_TIER]:
        models = next(iter(models_of.values()))
    simulated = manifest.config.get("simulated_annotators") is True
    return TierRun(
        str(run_dir),
        manifest.task,
        members,
        models,
        units,
        skipped,
        labels,
        kinds,
        simulated,
        band_floors(run_dir, set(by_place)),
    )


DRAWS = "calibration-draws.jsonl"  # labels/: what labels queue --for-calibration drew


def read_draws(run_dir: Any) -> list[dict[str, Any]]:
    """The run's calibration draws, in order (a line that cannot be read stops in one line)."""
    import json

    from ...runtime.contract.errors import UserError
    from ...runtime.store.labels import labels_dir, read_unlinked

    path = labels_dir(run_dir) / DRAWS
    if not path.is_file():
        return []
    out = []
    for lineno, line in enumerate(read_unlinked(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)
            draw, units = found["draw"], found["units"]
            floor = draw["floor"]
            if floor is not None and not isinstance(floor, int | float):
                raise TypeError
            stage = str(draw["stage"])
            keyed = [(str(u["id"]), int(u["key"])) for u in units]
        except (ValueError, KeyError, TypeError):
            said = "record: field draw: not a calibration draw"
            raise UserError(f"{path}:{lineno}: {said}") from None
        out.append({"stage": stage, "floor": floor, "draw": draw, "units": keyed})
    return out


def band_floors(
    run_dir: Any, labelled: set[tuple[str, str, int]] | None = None
) -> dict[str, float]:
    """Per stage, the highest floor the run's calibration draws used: no threshold below it is
    tested (the labels there over-represent the band). With ``labelled`` (item, stage, key),
    only the draws people labelled a judgement of: a draw none of whose judgements was
    labelled (one that found its band empty, say) over-represents nothing, so an early floor
    nobody labelled above does not cap every later calibration."""
    floors: dict[str, float] = {}
    for found in read_draws(run_dir):
        stage = found["stage"]
        if labelled is not None and not any((i, stage, k) in labelled for i, k in found["units"]):
            continue
        if found["floor"] is not None:
            floors[found["stage"]] = max(floors.get(found["stage"], 0.0), float(found["floor"]))
    return floors


def as_verdict(rule: Any, label: Any) -> Any:
    """A person's label in the terms the run records its verdicts in: a set however it was
    written ("3,1", [1, 3]) as its label ("1, 3"); a set that cannot be read stays as given
    (it agrees with no verdict)."""
    from ...runtime.contract.panels import Cover, cover_items, cover_label

    if not isinstance(rule, Cover):
        return label
    try:
        return cover_label(cover_items(label))
    except ValueError:
        return label


def asked_of(record: Any) -> dict[tuple[str, int], str]:
    """(stage, its number within the item) -> the digest of what the judgement asked, for the
    record's panel and lone-judge entries (an entry of an older layout, without a digest, is
    known by its number)."""
    out: dict[tuple[str, int], str] = {}
    for field_name in ("panel", "confidence"):
        for key, entry in numbered(record.details.get(field_name) or []):
            out.setdefault((entry["stage"], key), str(entry.get("asked") or f"#{key}"))
    return out


def lone_confidences(
    records: Sequence[Any], run: Any = "run"
) -> dict[str, tuple[str, dict[tuple[str, str], tuple[Any, float]]]]:
    """Per stage, the kind of confidence (``logprobs``: a lone judge's label probability;
    ``nli``: an NLI model's, scoring pairs in the judge's place) and each label given with its
    probability (a run made with ``--confidence logprobs``), keyed by item and what the
    judgement asked. A label without a probability (the endpoint gave no logprobs) is left out:
    nothing to calibrate. A recorded confidence that is no probability (NaN, infinite, outside
    0 to 1: a run from elsewhere, or an older one) is refused in one line naming ``run``, the
    item and the stage (``ConfidenceRefused``)."""
    out: dict[str, tuple[str, dict[tuple[str, str], tuple[Any, float]]]] = {}
    for record in records:
        asked = asked_of(record)
        for key, entry in numbered(record.details.get("confidence") or []):
            stage = entry["stage"]
            if entry.get("confidence") is not None:
                confidence = checked_confidence(entry["confidence"], run, record.id, stage)
                unit = (record.id, asked[(stage, key)])
                kind = str(entry.get("kind") or "logprobs")
                found = out.setdefault(stage, (kind, {}))[1]
                found[unit] = (entry["value"], confidence)
    return out


UNKNOWN_NLI_MODEL = "unknown (the run records no content of its NLI model)"


def nli_model_of(manifest: Any, options: Any) -> str:
    """The content digest of the NLI model a run scored pairs with, as its manifest recorded it
    (where the checkpoint lives now plays no part), else the commit a hub id has in the local
    Hugging Face cache, else ``UNKNOWN_NLI_MODEL`` (a calibration no run's model matches). The
    name is the run's word: it is never asked of the Hub (with the reader's token) nor hashed
    as a path (a folder of the reader's, a kernel file)."""
    from ....serving.content import hub_revision

    used = options.cross_encoder() if hasattr(options, "cross_encoder") else None
    name = None if used is None else str(used[0])
    for record in (manifest.inputs or {}).values():
        if record.get("kind") == "model" and record.get("name") == name and record.get("sha256"):
            return str(record["sha256"])
    cached = hub_revision(name, online=False) if name and "/" in name else None
    return cached or UNKNOWN_NLI_MODEL


def checked_apart(item: str, seed: int, share: float) -> bool:
    """Whether an item's labels check the calibration rather than make it: by a seeded hash of
    the item (its units stay together), never by its labels."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{item}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < share


def proportion_interval(agreeing: int, total: int, level: float = 0.95) -> list[float] | None:
    """The two-sided Clopper-Pearson interval of an agreement rate."""
    from scipy.stats import beta

    if not total:
        return None
    tail = (1 - level) / 2
    low = 0.0 if agreeing == 0 else float(beta.ppf(tail, agreeing, total - agreeing + 1))
    high = 1.0 if agreeing == total else float(beta.ppf(1 - tail, agreeing + 1, total - agreeing))
    return [low, high]


def calibrate_runs(
    tiers: Sequence[TierRun],
    guarantee: Guarantee,
    check_share: float = 0.3,
    seed: int = 0,
    grid: Grid = STEPS,
) -> dict[str, Any]:
    """Per label stage every tier judged: each tier's threshold calibrated on the calibration
    labels (``calibrate_cascade``), then checked on the labels kept apart, and what routing every
    judgement of the stage through the cascade asks of each tier against the last tier alone."""
    labels: dict[tuple[str, str, str], Any] = {}
    for tier in tiers:
        labels |= tier.labels
    out: dict[str, Any] = {
        "kind": CALIBRATION_KIND,
        "version": 1,
        "alpha": guarantee.alpha,
        "delta": guarantee.delta,
        "check_share": check_share,
        "seed": seed,
        "grid": grid.as_json(),
        "tiers": [
            {"run": t.run, "task": t.task, "members": t.members, "models": t.models}
            | ({"simulated_annotators": True} if t.annotators else {})
            for t in tiers
        ],
        "stages": {},
        "skipped": {s: why for t in tiers for s, why in t.skipped.items()},
    }
    stages = set(tiers[0].units).intersection(*(t.units for t in tiers[1:]))
    for stage in sorted(stages):
        every = sorted(set(tiers[0].units[stage]).intersection(*(t.units[stage] for t in tiers)))
        labelled = [u for u in every if (u[0], stage, u[1]) in labels]
        calibration = [u for u in labelled if not checked_apart(u[0], seed, check_share)]
        check = [u for u in labelled if checked_apart(u[0], seed, check_share)]

        def agrees(tier: TierRun, unit: tuple[str, str], stage: str = stage) -> bool:
            return tier.units[stage][unit][0] == labels[(unit[0], stage, unit[1])]

        made = calibrate_cascade(
            [
                TierUnits(
                    f"{k + 1}: {', '.join(dict.fromkeys(t.models))} x{len(t.members)}",
                    [t.units[stage][u][1] for u in calibration],
                    [agrees(t, u) for u in calibration],
                )
                for k, t in enumerate(tiers)
            ],
            guarantee,
            grid,
            [t.floors.get(stage) for t in tiers],
        )
        thresholds = [t["threshold"] for t in made["tiers"]]
        floors = [t.floors.get(stage) for t in tiers]
        out["stages"][stage] = {
            "thresholds": thresholds,
            **({"floors": floors} if any(f is not None for f in floors) else {}),
            "confidence": [t.kinds.get(stage, "share") for t in tiers],
            "calibration": made,
            "check": checked(tiers, stage, check, thresholds, agrees),
            "routing": routed(tiers, stage, every, thresholds),
            "calibration_units": [list(u) for u in calibration],
            "check_units": [list(u) for u in check],
        }
    return out


def checked(
    tiers: Sequence[TierRun],
    stage: str,
    units: Sequence[tuple[str, str]],
    thresholds: Sequence[float | None],
    agrees: Any,
) -> dict[str, Any]:
    """The cascade on the labels kept apart: what it kept, how often that agreed with people
    (with its interval), and what it abstained on."""
    kept = agreeing = 0
    for unit in units:
        tier = route([t.units[stage][unit][1] for t in tiers], thresholds)
        if tier is None:
            continue
        kept += 1
        agreeing += agrees(tiers[tier], unit)
    return {
        "labelled": len(units),
        "kept": kept,
        "abstained": len(units) - kept,
        "coverage": kept / len(units) if units else None,
        "agreement": agreeing / kept if kept else None,
        "agreement_ci": proportion_interval(agreeing, kept),
    }


def routed(
    tiers: Sequence[TierRun],
    stage: str,
    units: Sequence[tuple[str, str]],
    thresholds: Sequence[float | None],
) -> dict[str, Any]:
    """Every judgement of the stage sent through the cascade: how many each tier is asked for
    and keeps, the abstentions, and the calls (each tier's panel size per judgement) against
    asking the last, strongest tier alone."""
    reached = [0] * len(tiers)
    kept = [0] * len(tiers)
    for unit in units:
        confidences = [t.units[stage][unit][1] for t in tiers]
        tier = route(confidences, thresholds)
        last = len(tiers) - 1 if tier is None else tier
        for k in range(last + 1):
            reached[k] += 1
        if tier is not None:
            kept[tier] += 1
    calls = sum(n * max(len(t.members), 1) for n, t in zip(reached, tiers, strict=True))
    alone = len(units) * max(len(tiers[-1].members), 1)
    return {
        "judgements": len(units),
        "asked": reached,
        "kept": kept,
        "abstained": len(units) - sum(kept),
        "calls": calls,
        "calls_strongest_alone": alone,
        "strongest_calls_saved": 1 - reached[-1] / len(units) if units else None,
    }


def render(calibration: dict[str, Any], out: Any) -> None:
    """The calibration as a person reads it: per stage, each tier's threshold, and the check."""
    from rich.table import Table

    alpha, delta = calibration["alpha"], calibration["delta"]
    out.print(
        f"cascade of {len(calibration['tiers'])} tier(s): agreement with people at least "
        f"{1 - alpha:.0%} with probability at least {1 - delta:.0%} (alpha {alpha}, delta {delta})"
    )
    for stage, found in calibration["stages"].items():
        table = Table("tier", "reached", "threshold", "kept", "coverage", "guarantee", title=stage)
        for tier in found["calibration"]["tiers"]:
            if tier["attainable"]:
                holds = f"holds (bound {tier['upper_bound']:.3f})"
            else:
                holds = f"not attainable: {tier['labels_needed']} more label(s)"
            threshold = "-" if tier["threshold"] is None else f"{tier['threshold']:.3f}"
            table.add_row(
                tier["tier"],
                str(tier["reached"]),
                threshold,
                str(tier["kept"]),
                f"{tier['coverage']:.1%}",
                holds,
            )
        out.print(table)
        check, routing = found["check"], found["routing"]
        if check["kept"]:
            low, high = check["agreement_ci"]
            out.print(
                f"  held-back labels: {check['kept']} of {check['labelled']} kept, agreement "
                f"{check['agreement']:.1%} [{low:.1%}, {high:.1%}], {check['abstained']} abstained"
            )
        else:
            out.print(f"  held-back labels: {check['labelled']}, none kept")
        saved = routing["strongest_calls_saved"]
        out.print(
            f"  all {routing['judgements']} judgements: asked per tier {routing['asked']}, "
            f"{routing['abstained']} abstained; {routing['calls']} calls against "
            f"{routing['calls_strongest_alone']} for the strongest alone"
            + ("" if saved is None else f" ({saved:.0%} of its judgements not asked)")
        )
    for stage, why in calibration["skipped"].items():
        out.print(f"  {stage}: skipped ({why})")


# ---- what a run judged through a cascade did -------------------------------------------------


def run_cascade(
    run_dir: Any, records: Sequence[Any], cost: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """A run made with ``--cascade``, per stage and tier: how many judgements each tier was
    asked and kept, the abstentions, the calls and tokens (and with ``cost``, the run's priced
    usage, dollars) against the strongest tier asked alone, the guarantee the calibration gives
    and the agreement with the people who labelled kept judgements in the run (with its
    interval). None: the run has no cascade."""
    from ...runtime.contract.panels import member_name
    from ...runtime.store.run_dir import MANIFEST, read_manifest
    from ...runtime.store.summary import recorded_usage
    from ..people.labels import run_labels

    made = read_manifest(run_dir / MANIFEST).config.get("cascade")
    if not isinstance(made, dict):
        return None
    sizes: list[int] = list(made.get("tiers") or [])
    usage = recorded_usage(list(records))
    labels = run_labels(run_dir)
    stages: dict[str, dict[str, Any]] = {}
    for record in records:
        for key, entry in numbered(record.details.get("cascade") or []):
            stage = entry["stage"]
            found = stages.setdefault(stage, _stage_counts(len(sizes)))
            found["judgements"] += 1
            found["uncalibrated"] += entry.get("calibrated") is False
            for step in entry["tiers"]:
                found["asked"][step["tier"] - 1] += 1
            kept = entry.get("kept")
            if kept == PEOPLE:  # every tier abstained; people's label decided it on a resume
                found["people"] += 1
                continue
            if kept is None:
                found["abstained"] += 1
                found["abstained_items"].append(record.id)
            else:
                found["kept"][kept - 1] += 1
            label = labels.get((record.id, stage, key))
            if label is not None and kept is not None:
                found["labelled"] += 1
                found["agreeing"] += label == entry["value"]
            elif label is not None:
                found["abstained_labelled"] += 1
    model_first = made.get("nli_model") is not None  # tier 1 an NLI model: no member's stage
    for stage, found in stages.items():
        numbers = iter(range(1, sum(sizes) + 1))
        tiers = [
            [] if k == 0 and model_first else [member_name(stage, next(numbers)) for _ in range(n)]
            for k, n in enumerate(sizes)
        ]
        found["calls"] = [sum(usage.get(s, {}).get("calls", 0) for s in t) for t in tiers]
        found["tokens"] = [sum(_tokens(usage.get(s, {})) for s in t) for t in tiers]
        if model_first:  # one pair scored per judgement it was asked, no request, no token
            found["calls"][0] = found["model_scored"] = found["asked"][0]
        found |= _against_strongest(found, sizes[-1] if sizes else 1, int(model_first))
        if cost is not None:
            priced = cost.get("by_stage") or {}
            found["cost"] = [round(sum(priced.get(s, 0.0) for s in t), 6) for t in tiers]
            last_calls = found["calls"][-1]
            found["cost_strongest_alone"] = (
                round(found["cost"][-1] / last_calls * found["calls_strongest_alone"], 6)
                if last_calls
                else None
            )
        found["agreement"] = found["agreeing"] / found["labelled"] if found["labelled"] else None
        found["agreement_ci"] = proportion_interval(found["agreeing"], found["labelled"])
        found["abstained_items"] = sorted(set(found["abstained_items"]))
    return {
        "sha256": made.get("sha256"),
        "alpha": made.get("alpha"),
        "delta": made.get("delta"),
        "guaranteed_agreement": 1 - float(made.get("alpha") or 0),
        "confidence": 1 - float(made.get("delta") or 0),
        "tiers": sizes,
        # what each tier is, as the pages print it: its members, or the NLI model
        "members": ["NLI model" if k == 0 and model_first else str(n) for k, n in enumerate(sizes)],
        "nli_model": made.get("nli_model"),
        "stages": stages,
    }


def _stage_counts(tiers: int) -> dict[str, Any]:
    return {
        "judgements": 0,
        "asked": [0] * tiers,
        "kept": [0] * tiers,
        "abstained": 0,
        "abstained_items": [],
        "people": 0,  # abstained, then decided by people's labels
        "uncalibrated": 0,
        "labelled": 0,
        "agreeing": 0,
        "abstained_labelled": 0,
    }


def _tokens(usage: dict[str, Any]) -> int:
    return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))


def _against_strongest(found: dict[str, Any], size: int, model_tiers: int = 0) -> dict[str, Any]:
    """What asking the strongest tier alone for every judgement would have taken: its calls,
    and its tokens at the tokens per call it used (None where it was never asked). The judges'
    calls are the total: an NLI model's tier (``model_tiers``: 1) scores pairs, no request."""
    calls_alone = found["judgements"] * size
    last_calls, last_tokens = found["calls"][-1], found["tokens"][-1]
    tokens_alone = round(last_tokens / last_calls * calls_alone) if last_calls else None
    judged = found["judgements"]
    return {
        "calls_total": sum(found["calls"][model_tiers:]),
        "calls_strongest_alone": calls_alone,
        "tokens_total": sum(found["tokens"]),
        "tokens_strongest_alone": tokens_alone,
        # the judgements a tier kept (people's decisions are no tier's)
        "coverage": (judged - found["abstained"] - found["people"]) / judged if judged else None,
        "strongest_asked_share": found["asked"][-1] / judged if judged else None,
    }


def render_run(found: dict[str, Any], out: Any) -> None:
    """A cascaded run's lines as ``report`` and ``agreement`` print them."""
    from rich.table import Table

    out.print(
        f"judge cascade, calibration {str(found['sha256'])[:12]}: kept judgements "
        f"agree with people at least {found['guaranteed_agreement']:.0%} of the time with "
        f"probability at least {found['confidence']:.0%}",
        highlight=False,
        soft_wrap=True,
    )
    for stage, s in found["stages"].items():
        table = Table("tier", "members", "asked", "kept", "calls", "tokens", title=stage)
        for k, members in enumerate(found["members"]):
            table.add_row(
                str(k + 1),
                members,
                str(s["asked"][k]),
                str(s["kept"][k]),
                str(s["calls"][k]),
                f"{s['tokens'][k]:,}",
            )
        out.print(table)
        alone = s["tokens_strongest_alone"]
        out.print(
            f"  {stage}: {s['judgements']} judgements, {s['abstained']} abstained (unjudged, "
            "offered for labelling)"
            + (f", {s['people']} more decided by people's labels" if s["people"] else "")
            + f"; coverage {s['coverage']:.1%}; {s['calls_total']} calls "
            f"against {s['calls_strongest_alone']} for the strongest tier alone"
            + (
                f" (and {s['model_scored']} pairs the NLI model scored)"
                if "model_scored" in s
                else ""
            )
            + ", "
            f"{s['tokens_total']:,} tokens against "
            + ("? (never asked)" if alone is None else f"{alone:,}")
            + _cost_said(s)
            + (f"; {s['uncalibrated']} uncalibrated (no guarantee)" if s["uncalibrated"] else ""),
            highlight=False,
            soft_wrap=True,
        )
        if s["labelled"]:
            low, high = s["agreement_ci"]
            out.print(
                f"  {stage}: people labelled {s['labelled']} kept judgement(s): agreement "
                f"{s['agreement']:.1%} [{low:.1%}, {high:.1%}]",
                highlight=False,
            )


def _cost_said(stage: dict[str, Any]) -> str:
    if "cost" not in stage:
        return ""
    alone = stage["cost_strongest_alone"]
    said = "?" if alone is None else f"${alone:.4f}"
    return f"; ${sum(stage['cost']):.4f} against {said}"
