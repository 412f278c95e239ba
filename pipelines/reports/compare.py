"""``groundcover compare``: runs over the same items, paired item by item.

Per run: the mean score over its scored items with a 95% BCa interval. Per pair of runs (A, B):
over the items both scored, the mean of A - B with a paired BCa interval (items resampled, pairs
kept together), win / tie / loss counts, an exact sign test and a Wilcoxon signed-rank test, and
the per-item differences largest first. Items only one run recorded, and items a run recorded
without a score, are listed, never dropped silently. Runs of different frameworks, or of one
framework under different protocols (``Framework.score_protocol``), measure different things
and are refused. No model is called: only what is on disk is read.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..runtime.contract.config import UserError
from ..runtime.contract.results import UNSCORED
from ..runtime.stats import bca_interval, paired_test
from ..runtime.store.contained import study_runs
from ..runtime.store.manifest import StudyRecord
from ..runtime.store.provenance import manifest_provenance, provenance_differences
from ..runtime.store.run_dir import (
    MANIFEST,
    RESULTS,
    STUDY_FILE,
    read_manifest,
    read_study,
    results_by_id,
)


@dataclass
class RunScores:
    """One run as ``compare`` sees it: its identity and every recorded item's score."""

    path: Path
    framework: str
    task: str
    protocol: dict[str, Any]
    roles: dict[str, Any]
    items: int
    provenance: dict[str, Any] = field(default_factory=dict)  # ``manifest_provenance``
    scores: dict[str, float] = field(default_factory=dict)  # id -> score (scored items)
    unscored: dict[str, str] = field(default_factory=dict)  # id -> status (recorded, no score)
    repeats: int = 1  # a --repeats root: scores are item means over the repeats
    between_repeat_sd: float | None = None

    @property
    def recorded(self) -> set[str]:
        return set(self.scores) | set(self.unscored)


def _study(path: Path) -> StudyRecord | None:
    """The study file of a study root (None for a run directory), checked as every reader
    checks it (a sent one is one line naming what is wrong in it)."""
    if (path / MANIFEST).is_file() or not (path / STUDY_FILE).is_file():
        return None
    return read_study(path)


def run_dirs(path: Path) -> list[Path]:
    """The recorded run directories a compared path stands for (a study root: its runs)."""
    meta = _study(path)
    if meta is None:
        return [path]
    return list(study_runs(path, meta.runs).values())


def load_scores(path: Path) -> RunScores:
    """A run's scores; a ``--repeats`` root is scored by its item means over the repeats, a
    study of one run (one FanOutQA setting) by that run."""
    meta = _study(path)
    if meta is None:
        return _one_run(path)
    if meta.repeats:
        return _repeated(path, [_one_run(d) for d in run_dirs(path)])
    if len(meta.runs) == 1:
        inside = run_dirs(path)  # its one run, inside it
        if not inside:
            raise UserError(f"{path}: a study whose run is not recorded inside it")
        return _one_run(inside[0])
    runs = ", ".join(str(path / key) for key in meta.runs)
    raise UserError(f"{path}: a study of several runs; compare one of them: {runs}")


def _repeated(path: Path, runs: list[RunScores]) -> RunScores:
    if not runs:
        raise UserError(f"{path}: no repeat has been recorded yet")
    first = runs[0]
    out = RunScores(
        path,
        first.framework,
        first.task,
        first.protocol,
        first.roles,
        first.items,
        first.provenance,
        repeats=len(runs),
    )
    spreads = []
    for i in sorted(set().union(*(r.recorded for r in runs))):
        scores = [r.scores[i] for r in runs if i in r.scores]
        if scores:
            out.scores[i] = statistics.fmean(scores)
            if len(scores) > 1:
                spreads.append(statistics.stdev(scores))
        else:
            out.unscored[i] = next(r.unscored[i] for r in runs if i in r.unscored)
    out.between_repeat_sd = statistics.fmean(spreads) if spreads else None
    return out


def _one_run(path: Path) -> RunScores:
    from ..runtime.contract.plugins import run_framework, run_options

    if not (path / MANIFEST).is_file():
        raise UserError(f"{path}: not a run directory (no {MANIFEST})")
    manifest = read_manifest(path / MANIFEST)
    fw = run_framework(manifest, path)
    options = run_options(fw, manifest, path)
    run = RunScores(
        path,
        fw.name,
        manifest.task,
        fw.score_protocol(options),
        manifest.roles,
        manifest.items,
        manifest_provenance(manifest),
    )
    for record in results_by_id(path / RESULTS):
        if record.score is None or record.status in UNSCORED:
            run.unscored[record.id] = record.status
        else:
            run.scores[record.id] = record.score
    return run


def check_comparable(runs: list[RunScores]) -> None:
    """One line naming the first run that measures something else than the first run."""
    if len(runs) < 2:
        raise UserError("compare needs at least two run directories")
    first = runs[0]
    for run in runs[1:]:
        if run.framework != first.framework:
            raise UserError(
                f"{run.path}: a {run.framework} run cannot be compared with the "
                f"{first.framework} run {first.path}"
            )
        for key in sorted(set(first.protocol) | set(run.protocol)):
            if first.protocol.get(key) != run.protocol.get(key):
                raise UserError(
                    f"{run.path}: {key} {run.protocol.get(key)!r} differs from "
                    f"{first.protocol.get(key)!r} of {first.path}: the scores mean different things"
                )
        if not run.recorded & first.recorded:
            raise UserError(f"{run.path}: no item in common with {first.path}")


def _mean(values: list[float], resamples: int, seed: int) -> dict[str, Any]:
    if not values:
        return {"scored": 0, "mean": None, "interval": None}
    interval = bca_interval(values, resamples, seed) if len(values) > 1 else None
    return {
        "scored": len(values),
        "mean": sum(values) / len(values),
        "interval": interval.as_dict() if interval else None,
    }


def compare_pair(a: RunScores, b: RunScores, resamples: int, seed: int) -> dict[str, Any]:
    both = sorted(set(a.scores) & set(b.scores))
    order = sorted(both, key=lambda i: (-abs(a.scores[i] - b.scores[i]), i))
    deltas = [
        {"id": i, "a": a.scores[i], "b": b.scores[i], "delta": a.scores[i] - b.scores[i]}
        for i in order
    ]
    # no item scored by both (every one failed in a run): nothing to test, and said so
    test = (
        paired_test([a.scores[i] for i in both], [b.scores[i] for i in both], resamples, seed)
        if both
        else None
    )
    common = a.recorded & b.recorded
    return {
        "a": str(a.path),
        "b": str(b.path),
        "paired": len(both),
        # recorded by both, but scored by one at most: status in each run
        "unpaired": {
            i: {"a": a.unscored.get(i, "scored"), "b": b.unscored.get(i, "scored")}
            for i in sorted(common - set(both))
        },
        "test": test.as_dict() if test else None,
        "deltas": deltas,
        # what the two rest on that differs: inputs by digest, models and adapters by revision
        "differs": provenance_differences(a.provenance, b.provenance)
        if a.provenance and b.provenance
        else [],
    }


def compare_runs(paths: list[Path], resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Every run's mean and every pair's paired comparison, as one JSON-able object."""
    runs = [load_scores(p) for p in paths]
    check_comparable(runs)
    everywhere = set.intersection(*(r.recorded for r in runs))
    out_runs = []
    for run in runs:
        statuses: dict[str, int] = {}
        for status in run.unscored.values():
            statuses[status] = statuses.get(status, 0) + 1
        out_runs.append(
            {
                "run": str(run.path),
                "task": run.task,
                "items": run.items,
                "recorded": len(run.recorded),
                "unscored": statuses,
                "models": {role: m.get("request_model") for role, m in run.roles.items()},
                "only_here": sorted(run.recorded - everywhere),
                "repeats": run.repeats,
                "between_repeat_sd": run.between_repeat_sd,
                **_mean(list(run.scores.values()), resamples, seed),
                "overrides": _overrides(run.path),
            }
        )
    pairs = [compare_pair(a, b, resamples, seed) for a, b in itertools.combinations(runs, 2)]
    return {
        "framework": runs[0].framework,
        "protocol": runs[0].protocol,
        "runs": out_runs,
        "pairs": pairs,
        "resamples": resamples,
        "seed": seed,
    }


# ---- printing ----------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(interval: dict[str, Any] | None) -> str:
    return "-" if interval is None else f"[{interval['low']:.4f}, {interval['high']:.4f}]"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _overrides(path: Path) -> dict[str, Any] | None:
    """A run's overrides in force, apart from the judge's scores compared here."""
    from .people.overrides import overridden, read_overrides

    found = read_overrides(path) if (path / MANIFEST).is_file() else {}
    return overridden(results_by_id(path / RESULTS), found) if found else None


def print_comparison(result: dict[str, Any], out: Console, top: int = 10) -> None:
    """Runs lettered A, B, C... (paths are long); every pair as X-Y."""
    letter = {run["run"]: chr(ord("A") + k) for k, run in enumerate(result["runs"])}
    runs = Table(
        "",
        "run",
        "task",
        "recorded",
        "scored",
        "mean",
        "95% BCa",
        "not scored",
        "repeats (mean SD)",
        title=f"{result['framework']}: runs",
    )
    for run in result["runs"]:
        unscored = ", ".join(f"{s} {n}" for s, n in run["unscored"].items()) or "-"
        runs.add_row(
            letter[run["run"]],
            run["run"],
            run["task"],
            f"{run['recorded']}/{run['items']}",
            str(run["scored"]),
            _num(run["mean"]),
            _interval(run["interval"]),
            unscored,
            f"{run['repeats']} ({_num(run['between_repeat_sd'])})" if run["repeats"] > 1 else "-",
        )
    out.print(runs)
    for run in result["runs"]:
        if run.get("overrides"):
            from .people.overrides import override_line

            line = override_line(run["overrides"])
            out.print(f"{letter[run['run']]}: {line}; compared here: the judge's", highlight=False)
    pairs = Table(
        "pair",
        "paired",
        "mean diff",
        "95% paired BCa",
        "win/tie/loss",
        "sign p",
        "Wilcoxon p",
        title="paired differences over items both scored",
    )
    for pair in result["pairs"]:
        t = pair["test"] or {}
        wtl = f"{t['wins']}/{t['ties']}/{t['losses']}" if t else "-"
        pairs.add_row(
            f"{letter[pair['a']]}-{letter[pair['b']]}",
            str(pair["paired"]),
            _num(t.get("mean_difference")),
            _interval(t.get("interval")),
            wtl,
            _p(t.get("sign_p")),
            _p(t.get("wilcoxon_p")),
        )
    out.print(pairs)
    for pair in result["pairs"]:
        a, b = letter[pair["a"]], letter[pair["b"]]
        differs = pair.get("differs") or []
        unknown = [d for d in differs if d["what"] == "inputs fingerprinted"]
        said = "; ".join(f"{d['what']} {d['a']} → {d['b']}" for d in differs if d not in unknown)
        line = f"different content: {said}" if said else "the same inputs and models"
        if unknown:  # a run made before inputs were known by content: known by name only
            line = (f"{line}, as far as can be told: " if said else "") + (
                "inputs not fingerprinted in "
                + " and ".join(r for r, f in ((a, unknown[0]["a"]), (b, unknown[0]["b"])) if not f)
            )
            line = line if said else f"unknown content ({line})"
        out.print(f"{a}-{b}: rest on {line}", highlight=False, soft_wrap=True)
        if pair["deltas"] and top:
            deltas = Table("item", a, b, f"{a}-{b}", title=f"largest differences {a}-{b}")
            for d in pair["deltas"][:top]:
                deltas.add_row(d["id"], _num(d["a"]), _num(d["b"]), f"{d['delta']:+.4f}")
            out.print(deltas)
        if pair["unpaired"]:
            out.print(
                f"{a}-{b}: {len(pair['unpaired'])} items recorded by both but not scored "
                "by both (--json lists them)"
            )
    for run in result["runs"]:
        if run["only_here"]:
            shown = ", ".join(run["only_here"][:5]) + (" ..." if len(run["only_here"]) > 5 else "")
            out.print(
                f"{letter[run['run']]}: {len(run['only_here'])} items only in this run: {shown}"
            )
