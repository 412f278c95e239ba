"""Labels where they count for a cascade's thresholds (``labels queue --for-calibration``).

A tier's threshold can only be one of the confidences at which its judgements may still
disagree with people less than alpha of the time. Labels of judgements below all of those
never move it: the next judgements to label are drawn at random from those reaching the tier at
or above the lowest confidence that could still be kept (the band's floor), and not labelled yet.

The floor: walking the tier's labelled judgements from the highest confidence down, the first
level whose kept judgements show a disagreement above alpha (the Clopper-Pearson lower
(1 - delta) bound on it above alpha) cannot be kept, nor, as a rule, anything below it; the floor
is the level just above it (with no such level, or no label yet, every judgement is in the band).

Each draw is recorded in the tier's run (``labels/calibration-draws.jsonl``, a line per draw:
its stage, tier, floor, seed, how many judgements the band held and how many were drawn, each
with its inclusion probability) and the labelling page walks through the drawn judgements.
``cascade calibrate`` then tests no threshold below the highest floor a stage's draws used: at or
above it, the labelled judgements at or above any tested threshold are a uniform sample of the
judgements there (those labelled before the draw at random from all, those drawn since at random
from the band), and cutting a fixed sequence short can add no false rejection; below it the
labels would over-represent the band, so it is never tested.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.contract.errors import UserError
from .cascade import (
    DRAWS,
    GRIDS,
    STEPS,
    Guarantee,
    TierRun,
    band_floors,
    calibrate,
    more_labels_needed,
    read_draws,
    read_tier,
)


def keepable_floor(
    confidences: Sequence[float], agrees: Sequence[bool], guarantee: Guarantee
) -> float | None:
    """The lowest labelled confidence that could still be kept: just above the highest level
    whose kept judgements' disagreement is shown above alpha (Clopper-Pearson's lower (1 -
    delta) bound). None: no level is shown so (every judgement is in the band)."""
    from scipy.stats import beta

    if not confidences:
        return None
    order = np.argsort(-np.asarray(confidences, dtype=float), kind="stable")
    ranked = np.asarray(confidences, dtype=float)[order]
    wrong = np.cumsum(~np.asarray(agrees, dtype=bool)[order])
    last = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True))
    kept, errors, levels = last + 1, wrong[last], ranked[last]
    lower = np.where(errors > 0, beta.ppf(guarantee.delta, errors.clip(1), kept - errors + 1), 0.0)
    shown = np.flatnonzero(lower > guarantee.alpha)
    if not shown.size:
        return None
    first = int(shown[0])
    # the top level itself disagrees too much: nothing below it can be kept either
    return float(levels[first - 1]) if first else float(np.nextafter(levels[0], np.inf))


@dataclass
class Band:
    """One tier's stage: the judgements reaching it, the labelled ones, and the floor."""

    run: Path
    tier: int  # from 1
    stage: str
    guarantee: Guarantee  # at delta / K
    reaching: list[tuple[str, str]]  # (item, asked digest)
    floor: float | None

    def eligible(self, tier: TierRun) -> list[tuple[str, str]]:
        """The unlabelled judgements reaching the tier at or above the floor, in a fixed
        order (by item and what was asked)."""
        found = tier.units[self.stage]
        return sorted(
            u
            for u in self.reaching
            if (u[0], self.stage, u[1]) not in tier.labels
            and (self.floor is None or found[u][1] >= self.floor)
        )


def bands(tiers: Sequence[TierRun], cascade: dict[str, Any] | None, guarantee: Guarantee):
    """Per tier and stage, the band to draw from: the judgements reaching the tier (those no
    earlier tier's threshold keeps, by the calibration's thresholds; all of them for one run)
    and the floor from its labels so far."""
    each = Guarantee(guarantee.alpha, guarantee.delta / len(tiers))
    stages = set(tiers[0].units).intersection(*(t.units for t in tiers[1:]))
    out: list[Band] = []
    for stage in sorted(stages):
        thresholds = ((cascade or {}).get("stages") or {}).get(stage, {}).get("thresholds")
        reaching = sorted(tiers[0].units[stage])
        for k, tier in enumerate(tiers):
            units = [u for u in reaching if u in tier.units[stage]]
            labelled = [u for u in units if (u[0], stage, u[1]) in tier.labels]
            floor = keepable_floor(
                [tier.units[stage][u][1] for u in labelled],
                [tier.units[stage][u][0] == tier.labels[(u[0], stage, u[1])] for u in labelled],
                each,
            )
            out.append(Band(Path(tier.run), k + 1, stage, each, units, floor))
            cut = thresholds[k] if thresholds and k < len(thresholds) else None
            if cut is not None:  # what this tier keeps goes no further
                reaching = [u for u in units if tier.units[stage][u][1] < cut]
    return out


def draw_for_calibration(
    source: Path, size: int, seed: int, guarantee: Guarantee, stage: str | None = None
) -> list[dict[str, Any]]:
    """``labels queue --for-calibration CAL|RUN``: per tier and stage, ``size`` judgements
    drawn at random from the band, recorded in the tier's run; what was drawn, per band."""
    if size < 1:
        raise UserError(f"--size must be at least 1, got {size}")
    cascade = None
    if source.is_file():
        from ...runtime.contract.cascade import read_cascade

        read_cascade(source)  # checked: kind, digest, tiers
        cascade = json.loads(source.read_text(encoding="utf-8"))
        guarantee = Guarantee(float(cascade["alpha"]), float(cascade["delta"]))
        runs = [Path(t["run"]) for t in cascade["tiers"]]
    elif source.is_dir():
        runs = [source]
    else:
        raise UserError(f"--for-calibration {source}: neither a calibration file nor a run")
    tiers = [read_tier(run, None) for run in runs]
    made = []
    for band in bands(tiers, cascade, guarantee):
        if stage is not None and band.stage != stage:
            continue
        tier = tiers[band.tier - 1]
        pool = band.eligible(tier)
        rng = np.random.default_rng([seed, band.tier])
        picked = sorted(rng.choice(len(pool), min(size, len(pool)), replace=False).tolist())
        picked = [pool[k] for k in rng.permutation(picked)] if picked else []
        record = {
            "stage": band.stage,
            "tier": band.tier,
            "tiers": len(tiers),
            "floor": band.floor,
            "alpha": band.guarantee.alpha,
            "delta": band.guarantee.delta,
            "seed": seed,
            "reaching": len(band.reaching),
            "band": len(pool),
            "drawn": len(picked),
            "inclusion": len(picked) / len(pool) if pool else None,
            "source": str(source),
            "grid": (cascade or {}).get("grid") or STEPS.as_json(),
        }
        keys = unit_keys(Path(tier.run), band.stage)
        units = [
            {"id": u[0], "key": keys[u], "confidence": tier.units[band.stage][u][1]} for u in picked
        ]
        record_draw(Path(tier.run), record, units)
        made.append(record | {"run": tier.run})
    if not made:
        raise UserError(f"--for-calibration {source}: no stage with a confidence to draw from")
    return made


def unit_keys(run_dir: Path, stage: str) -> dict[tuple[str, str], int]:
    """(item, asked digest) -> the judgement's number within its item and stage (as ``view``
    and labels number it)."""
    from ...runtime.store.run_dir import RESULTS, results_by_id
    from .cascade import asked_of

    out = {}
    for record in results_by_id(run_dir / RESULTS):
        for (found, key), asked in asked_of(record).items():
            if found == stage:
                out[(record.id, asked)] = key
    return out


def record_draw(run_dir: Path, draw: dict[str, Any], units: list[dict[str, Any]]) -> Path:
    """The draw appended to ``labels/calibration-draws.jsonl``: the file rewritten whole with
    it (``write_atomic``, never through a link in the run)."""
    from ....serving.files import make_dirs, write_atomic
    from ...runtime.store.labels import labels_dir, read_unlinked

    folder = labels_dir(run_dir)
    make_dirs(folder, within=run_dir)
    path = folder / DRAWS
    before = read_unlinked(path) if path.is_file() else ""
    line = json.dumps({"draw": draw, "units": units}, ensure_ascii=False, allow_nan=False)
    write_atomic(path, before + line + "\n", within=run_dir)
    return path


def progress(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """What the labels of a run's stage give its tier now (the last draw's tier, alpha and
    delta per tier; alpha = delta = 0.1 alone without a draw): the threshold, or how many more
    labels in the band, all agreeing, would let the band's labelled judgements together hold
    the guarantee. None: no confidence to calibrate."""
    tier = read_tier(run_dir, None)
    if stage not in tier.units:
        return None
    draws = [d["draw"] for d in read_draws(run_dir) if d["stage"] == stage]
    alone: dict[str, Any] = {"tier": 1, "tiers": 1, "alpha": 0.1, "delta": 0.1, "grid": {}}
    last: dict[str, Any] = alone | (draws[-1] if draws else {})
    guarantee = Guarantee(float(last["alpha"]), float(last["delta"]))
    grid = GRIDS.get(str((last.get("grid") or {}).get("name", "steps")), STEPS)
    units = tier.units[stage]
    labelled = [u for u in units if (u[0], stage, u[1]) in tier.labels]
    floor = band_floors(run_dir).get(stage)  # every draw's: the band people are asked to label
    found = calibrate(
        [units[u][1] for u in labelled],
        [units[u][0] == tier.labels[(u[0], stage, u[1])] for u in labelled],
        guarantee,
        grid,
        floor,
    )
    needed = 0
    if not found.attainable:  # agreeing labels in the band that would let it pass as a whole
        band = [u for u in labelled if floor is None or units[u][1] >= floor]
        wrong = sum(units[u][0] != tier.labels[(u[0], stage, u[1])] for u in band)
        needed = more_labels_needed(len(band), wrong, guarantee)
    return {
        "tier": int(last["tier"]),
        "tiers": int(last["tiers"]),
        "alpha": guarantee.alpha,
        "delta": guarantee.delta,
        "labelled": len(labelled),
        "judgements": len(units),
        "floor": floor,
        "threshold": found.threshold,
        "attainable": found.attainable,
        "labels_needed": needed,
        "coverage": found.coverage,
    }


def render_draws(made: list[dict[str, Any]], out: Any) -> None:
    for draw in made:
        floor = draw["floor"]
        floor = "every confidence" if floor is None else f"confidence >= {floor:.4g}"
        out.print(
            f"{draw['run']}: stage {draw['stage']} tier {draw['tier']} of {draw['tiers']}: "
            f"{draw['drawn']} of {draw['band']} unlabelled judgements at {floor} (of "
            f"{draw['reaching']} reaching it) drawn at random, seed {draw['seed']}; written to "
            f"labels/{DRAWS}",
            highlight=False,
            soft_wrap=True,
        )
