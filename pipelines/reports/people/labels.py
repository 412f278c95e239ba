"""People's labels of a run, kept apart from its records, and which items to ask them about.

A run directory's ``labels/`` holds:

- ``labels.jsonl``: one line per label a person gave, appended and never rewritten:
  ``{"id", "stage", "key", "label", "annotator", "time", "judge"}`` (``judge``: the judge's
  value at that time, so a later rerun cannot change what the person was shown). Stage
  ``score`` labels an item's score on the framework's scale; ``key`` numbers a stage's units
  within an item (0 by default). The run's ``results.jsonl`` is never touched.
- ``queue.jsonl``: the items drawn for labelling by ``agreement --sample N``, in the order to
  label them: ``{"id", "stage", "key", "judge", "stratum", "weight"}`` after one header line
  ``{"queue": {strategy, seed, size, strata}}``. ``weight`` is the item's inverse inclusion
  probability: the prediction-powered mean weighs each labelled item by it, so a design that
  over-samples a rare verdict still estimates the run's mean.

Strategies (seeded; strata are the judge's verdicts: each distinct score where there are at most
``MAX_LEVELS``, else quintiles of the score):

- ``random``: a simple random sample (every weight N / n: equal, so nothing is reweighted);
- ``stratified``: proportional allocation, at least one item per stratum (weights N_h / n_h);
- ``balanced``: as equal a share per stratum as the strata allow, so a rare verdict is labelled
  as often as a common one (weights N_h / n_h, unequal);
- ``active``: each item with its own probability, from the judge's confidence (where it is
  unsure, more likely), cost-optimal given what a judgement and a label cost (``people.active``;
  each line also keeps its ``inclusion`` probability, the header the ``design``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ....serving.files import make_dirs, write_atomic
from ...runtime.contract.errors import UserError
from ...runtime.contract.results import ItemResult
from ...runtime.store.labels import LABELS as LABELS
from ...runtime.store.labels import LABELS_DIR as LABELS_DIR
from ...runtime.store.labels import label_rows as label_rows
from ...runtime.store.labels import labels_dir as labels_dir
from ...runtime.store.labels import open_unlinked as open_unlinked
from ...runtime.store.labels import read_unlinked as read_unlinked
from ...runtime.store.labels import run_labels as run_labels

QUEUE = "queue.jsonl"
MAX_LEVELS = 6  # a score with at most this many distinct values is stratified by value
Strategy = Literal["random", "stratified", "balanced", "active"]
STRATEGIES: tuple[str, ...] = ("random", "stratified", "balanced", "active")
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Drawn:
    """One item of the queue."""

    id: str
    judge: float
    stratum: str
    weight: float
    inclusion: float | None = None  # an active draw's: the item's inclusion probability


@dataclass
class Queue:
    strategy: str
    seed: int
    strata: dict[str, dict[str, int]]  # stratum -> {"items": N_h, "drawn": n_h}
    items: list[Drawn]
    design: dict[str, Any] | None = None  # an active draw's: where its probabilities came from

    def header(self) -> dict[str, Any]:
        found = {"strategy": self.strategy, "seed": self.seed, "size": len(self.items)}
        design = {"design": self.design} if self.design is not None else {}
        return {"queue": found | {"strata": self.strata} | design}

    def expected_half_width(self, spread: float) -> dict[str, float]:
        """The 95% half-width the labels alone would give at this size, taking the judge's
        score spread as the humans' (Kish's effective size for unequal weights); PPI++ is at
        most this, and narrower the closer the judge tracks the humans."""
        weights = np.array([d.weight for d in self.items], dtype=float)
        effective = float(weights.sum() ** 2 / (weights**2).sum()) if weights.size else 0.0
        half = Z95 * spread / math.sqrt(effective) if effective else float("inf")
        return {"labels": len(self.items), "effective": effective, "half_width": half}


def strata_of(scores: dict[str, float]) -> dict[str, str]:
    """id -> its stratum: the score itself where the judge uses few values, else the quintile
    band it falls in."""
    values = sorted(set(scores.values()))
    if len(values) <= MAX_LEVELS:
        return {i: f"{s:g}" for i, s in scores.items()}
    edges = np.quantile(list(scores.values()), [0.2, 0.4, 0.6, 0.8])
    names = ["q1", "q2", "q3", "q4", "q5"]
    return {i: names[int(np.searchsorted(edges, s, side="right"))] for i, s in scores.items()}


def draw(
    records: Sequence[ItemResult],
    size: int | None,
    strategy: str,
    seed: int = 0,
    costs: Any = None,
    run: Any = "run",
) -> Queue:
    """A labelling queue of ``size`` scored items (fewer if the run has fewer); ``active``:
    each item drawn with its probability from the judge's confidence (``people.active``; with
    ``costs``, the cost-optimal share, at most ``size``)."""
    if strategy not in STRATEGIES:
        raise UserError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if size is not None and size < 1:
        raise UserError(f"--sample must be at least 1, got {size}")
    if size is None and (strategy != "active" or costs is None):
        raise UserError("--sample N: how many items to draw (or --strategy active with costs)")
    scores = {r.id: float(r.score) for r in records if r.score is not None}
    if not scores:
        raise UserError("no item of the run has a score: nothing to label against")
    rng = np.random.default_rng(seed)
    if strategy == "active":
        return draw_active([r for r in records if r.id in scores], size, seed, rng, costs, run)
    assert size is not None
    groups: dict[str, list[str]] = {}
    if strategy == "random":
        groups["all"] = sorted(scores)
    else:
        for item, stratum in sorted(strata_of(scores).items()):
            groups.setdefault(stratum, []).append(item)
    shares = allocate({k: len(v) for k, v in groups.items()}, min(size, len(scores)), strategy)
    drawn: list[Drawn] = []
    strata = {}
    for name, members in sorted(groups.items()):
        n_h = shares[name]
        strata[name] = {"items": len(members), "drawn": n_h}
        picked = rng.permutation(len(members))[:n_h]
        weight = len(members) / n_h if n_h else 0.0
        drawn += [Drawn(members[k], scores[members[k]], name, weight) for k in picked]
    order = rng.permutation(len(drawn))  # label in a random order, not stratum by stratum
    return Queue(strategy, seed, strata, [drawn[k] for k in order])


def draw_active(
    records: Sequence[ItemResult],
    size: int | None,
    seed: int,
    rng: np.random.Generator,
    costs: Any,
    run: Any = "run",
) -> Queue:
    """Each item with its inclusion probability from the judge's confidence, drawn by
    randomised systematic sampling; the design recorded (costs, the mix, where the uncertainty
    came from, the labels expected)."""
    from .active import MIX, inclusion, systematic, uncertainty

    ordered = sorted(records, key=lambda r: r.id)
    read = [uncertainty(r, run) for r in ordered]
    scores = np.array([float(r.score) for r in ordered])  # type: ignore[arg-type]
    spread = float(scores.var())
    probabilities = inclusion([u for u, _ in read], size, spread, costs)
    picked = systematic(probabilities, rng)
    if not picked.size:  # a queue of nothing would only stand in the way of the next draw
        raise UserError(
            f"--strategy active: {float(probabilities.sum()):.3g} labels expected, none drawn "
            "(what a label costs against a judgement leaves nothing worth labelling)"
        )
    items = [
        Drawn(
            ordered[k].id,
            float(scores[k]),
            "active",
            1.0 / float(probabilities[k]),
            float(probabilities[k]),
        )
        for k in picked
    ]
    design = {
        "inclusion": "root of the judge's expected squared error (Zrnic and Candes 2024)",
        "uncertainty": sorted({how for _, how in read}),
        "mix": MIX,
        "expected_labels": float(probabilities.sum()),
        "judge_score_variance": spread,
    }
    if costs is not None:
        design["costs"] = {"judge": costs.judge, "person": costs.person}
        design["inclusion"] = "cost-optimal (Angelopoulos et al. 2025)"
    order = rng.permutation(len(items))
    strata = {"active": {"items": len(ordered), "drawn": len(items)}}
    return Queue("active", seed, strata, [items[k] for k in order], design)


def allocate(sizes: dict[str, int], total: int, strategy: str) -> dict[str, int]:
    """How many of ``total`` each stratum gets: proportional (largest remainders, at least one
    per stratum while there are enough), or as equal as the strata's sizes allow."""
    if strategy in ("random", "stratified"):
        exact = {k: total * n / sum(sizes.values()) for k, n in sizes.items()}
        out = {k: int(v) for k, v in exact.items()}
        if total >= len(sizes):
            out = {k: max(1, v) for k, v in out.items()}
        left = total - sum(out.values())
        by_remainder = sorted(sizes, key=lambda k: (out[k] - exact[k], k))
        for k in by_remainder:
            if left <= 0:
                break
            if out[k] < sizes[k]:
                out[k] += 1
                left -= 1
        while left < 0:  # the minimum of one took too many: from the largest shares
            k = max(out, key=lambda j: (out[j] - exact[j], out[j]))
            out[k] -= 1
            left += 1
        return out
    out = dict.fromkeys(sizes, 0)
    left = total
    while left > 0:
        open_ = [k for k in sorted(sizes) if out[k] < sizes[k]]
        share = max(1, left // len(open_))
        for k in open_:
            give = min(share, sizes[k] - out[k], left)
            out[k] += give
            left -= give
            if left == 0:
                break
    return out


# ---- files ---------------------------------------------------------------------------------


def write_queue(run_dir: Path, queue: Queue) -> Path:
    """The queue, whole or not at all; an existing queue is never replaced (the labels made
    against it carry its weights)."""
    path = labels_dir(run_dir) / QUEUE
    make_dirs(path.parent, within=run_dir)  # a sent run's labels/ linked elsewhere: refused
    if os.path.lexists(path):
        raise UserError(
            f"{path} exists: a run has one labelling queue (remove it to draw another; "
            "the labels already made stay in labels.jsonl)"
        )
    lines = [queue.header()] + [
        {"id": d.id, "stage": "score", "key": 0, "judge": d.judge}
        | {"stratum": d.stratum, "weight": d.weight}
        | ({"inclusion": d.inclusion} if d.inclusion is not None else {})
        for d in queue.items
    ]
    write_atomic(path, "".join(json.dumps(line) + "\n" for line in lines), within=run_dir)
    return path


def read_queue(run_dir: Path) -> dict[str, float] | None:
    """id -> the weight the queue gave it (None: the run has no queue)."""
    path = labels_dir(run_dir) / QUEUE
    if not path.is_file():
        return None
    from ...runtime.contract.readers import iter_jsonl

    weights = {}
    for lineno, row in iter_jsonl(path):
        if lineno == 1 and "queue" in row:
            continue
        try:
            weights[str(row["id"])] = float(row["weight"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}:{lineno}: record {row.get('id')!r}: field weight") from None
    return weights


def append_labels(run_dir: Path, labels: Sequence[dict[str, Any]]) -> int:
    """Append people's labels to ``labels.jsonl``."""
    return append_labels_to(run_dir, LABELS, labels)


def append_labels_to(run_dir: Path, name: str, labels: Sequence[dict[str, Any]]) -> int:
    """Append whole lines to ``labels/NAME``, one ``write`` on an O_APPEND descriptor: two
    writers at once lose nothing and never interleave inside a line."""
    if not labels:
        return 0
    path = labels_dir(run_dir) / name
    now = time.time()
    text = "".join(
        json.dumps({"time": now} | dict(label), ensure_ascii=False, allow_nan=False) + "\n"
        for label in labels
    )
    fd = open_unlinked(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    return len(labels)


def annotator_units(run_dir: Path, stage: str) -> dict[str, dict[tuple[str, int], Any]]:
    """annotator -> (id, key) -> that annotator's latest label of ``stage``'s unit."""
    found: dict[str, dict[tuple[str, int], Any]] = {}
    for row in label_rows(run_dir):
        if row["stage"] == stage:
            unit = (str(row["id"]), int(row.get("key", 0)))
            found.setdefault(str(row.get("annotator", "")), {})[unit] = row["label"]
    return found


def draw_for_runs(
    paths: Sequence[Path],
    size: int | None,
    strategy: str,
    seed: int,
    out: Any,
    costs: Any = None,
) -> None:
    """``agreement --sample``: a queue per run, and the interval its labels should give."""
    from ...runtime.store.run_dir import RESULTS, results_by_id, run_directories

    for run_dir in run_directories(list(paths)):
        records = results_by_id(run_dir / RESULTS)
        queue = draw(records, size, strategy, seed, costs, run_dir)
        path = write_queue(run_dir, queue)
        judged = [r.score for r in records if r.score is not None]
        spread = float(np.std(judged, ddof=1)) if len(judged) > 1 else 0.0
        expect = queue.expected_half_width(spread)
        strata = ", ".join(f"{k}: {v['drawn']} of {v['items']}" for k, v in queue.strata.items())
        out.print(f"queue: {path}", highlight=False, soft_wrap=True)
        out.print(f"  {len(queue.items)} items ({strategy}, seed {seed}); {strata}")
        if queue.design is not None:
            design = queue.design
            out.print(
                f"  inclusion: {design['inclusion']}, from the judge's "
                f"{' and '.join(design['uncertainty'])}, {design['mix']:.0%} spread evenly; "
                f"{design['expected_labels']:.1f} labels expected",
                highlight=False,
            )
        out.print(
            f"  expected 95% interval at {expect['labels']} labels: about +-"
            f"{expect['half_width']:.3f} from the labels alone (the judge's score spread "
            f"{spread:.3f}, effective size {expect['effective']:.0f}); the prediction-powered "
            "mean is at most as wide, narrower the closer the judge tracks the labels",
            highlight=False,
        )
