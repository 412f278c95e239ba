"""Runs logged to an experiment tracker (``--track mlflow|wandb``; off by default).

What one groundcover run becomes there:

- parameters: its identity (framework, task, fingerprint, options, each role's model, and what
  every input and model is by content), flattened to dotted names;
- metrics: the headline (mean, its 95% interval, items scored / recorded / failed, statuses)
  and every number of the framework's tables (``table.NAME``);
- artifacts: the HTML page, ``manifest.json``, ``summary.json`` and the tables file;
- tags: where the run directory is and its fingerprint.

A study (a paper grid, ``--repeats``) is a parent with one child per run: an MLflow parent run
with nested runs, a W&B group whose runs are each cell (and a ``study`` run with the combined
table). Logging the same run again (a resumed run, ``report --track`` later) logs into the
same tracker run: MLflow finds it by its tags, W&B by an id made from the run's directory and
fingerprint.

MLflow writes to a local file store by default (``./mlruns``; MLflow 3 keeps that store in
maintenance mode and asks for ``MLFLOW_ALLOW_FILE_STORE``, which is set for it) or to
``--track-uri`` (a server, or a database with the full ``mlflow`` package). W&B runs offline
unless ``WANDB_MODE`` says otherwise: ``wandb sync`` uploads it later.

Tracking never fails a run: a tracker missing or failing is one warning line.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from ....serving.redact import clipped, redact
from ...runtime.store.contained import study_runs
from ...runtime.store.provenance import manifest_provenance
from ...runtime.store.run_dir import MANIFEST, STUDY_FILE, SUMMARY, read_manifest, read_study
from ...runtime.terminal import terminal

Tracker = Literal["mlflow", "wandb"]
INSTALL = {
    "mlflow": "pip install 'groundcover[mlflow]'",
    "wandb": "pip install 'groundcover[wandb]'",
}


@dataclass(frozen=True)
class Tracking:
    tracker: Tracker
    uri: str | None = None  # MLflow tracking URI, or the directory W&B writes under
    project: str = "groundcover"  # MLflow experiment, W&B project


@dataclass
class Logged:
    """One tracker run's worth: what a run (or a study's combined table) logs."""

    name: str
    key: str  # the run directory (absolute): how a later log finds the same tracker run
    fingerprint: str
    params: dict[str, str]
    metrics: dict[str, float]
    files: list[Path] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


def track(paths: list[Path], tracking: Tracking, warn: Console | None = None) -> list[str]:
    """Log every run (a study root: parent and children); the tracker runs' ids. A failure is
    one warning line on ``warn`` and an empty list, never an exception."""
    warn = warn or terminal(stderr=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gc-track-") as scratch:
            logger = MlflowLog(tracking) if tracking.tracker == "mlflow" else WandbLog(tracking)
            ids = []
            for path in paths:
                ids += logger.log_path(path, Path(scratch))
            return ids
    except Exception as exc:  # noqa: BLE001 - a tracker's failure never fails the run
        reason = clipped(f"{type(exc).__name__}: {exc}", 300)
        if isinstance(exc, ImportError):
            reason = f"{tracking.tracker} is not installed ({INSTALL[tracking.tracker]})"
        warn.print(f"warning: --track {tracking.tracker}: nothing logged: {reason}", markup=False)
        return []


def track_outcomes(outcomes: dict[str, Any], request: Any) -> list[str]:
    """After an invocation: log its runs where ``--track`` says (nothing without it); a study
    is logged from its root, so its runs are children of one parent."""
    run = request.run
    if run.track is None or not outcomes:
        return []
    roots: dict[Path, None] = {}
    for outcome in outcomes.values():
        parent = outcome.dir.parent
        roots[parent if (parent / STUDY_FILE).is_file() else outcome.dir] = None
    return track(list(roots), Tracking(run.track, run.track_uri, run.track_project))


class TrackerLog:
    """Walks run directories and study roots; a tracker says how one ``Logged`` is written."""

    def __init__(self, tracking: Tracking):
        self.tracking = tracking

    def log_path(self, path: Path, scratch: Path) -> list[str]:
        if (path / MANIFEST).is_file() or not (path / STUDY_FILE).is_file():
            return [self.write(run_log(path, scratch), parent=None)]
        meta = read_study(path)
        parent = study_log(path, meta)
        parent_id = self.write(parent, parent=None)
        children = [
            self.write(run_log(run, scratch), parent=parent)
            for run in study_runs(path, meta.runs).values()
        ]
        return [parent_id, *children]

    def write(self, logged: Logged, parent: Logged | None) -> str:
        raise NotImplementedError


class MlflowLog(TrackerLog):
    def __init__(self, tracking: Tracking):
        super().__init__(tracking)
        uri = tracking.uri or (Path.cwd() / "mlruns").as_uri()
        if "://" not in uri and not uri.startswith("file:"):
            uri = Path(uri).resolve().as_uri()  # a plain directory: a file store there
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(tracking.project)
        self.experiment = (
            found.experiment_id if found else self.client.create_experiment(tracking.project)
        )
        self.ids: dict[str, str] = {}

    def write(self, logged: Logged, parent: Logged | None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self._run_id(logged, parent)
        now = _millis()
        metrics = [Metric(_mlflow_key(k), v, now, 0) for k, v in logged.metrics.items()]
        params = [Param(_mlflow_key(k), v) for k, v in logged.params.items()]
        have = self.client.get_run(run_id).data.params
        params = [p for p in params if p.key not in have]  # MLflow params are write-once
        for start in range(0, max(len(params), len(metrics), 1), 100):  # its batch limits
            self.client.log_batch(
                run_id, metrics=metrics[start : start + 100], params=params[start : start + 100]
            )
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in logged.tags.items()])
        for path in logged.files:
            self.client.log_artifact(run_id, str(path))
        self.client.set_terminated(run_id)
        return run_id

    def _run_id(self, logged: Logged, parent: Logged | None) -> str:
        """The tracker run this groundcover run logged to before, else a new one."""
        query = (
            f"tags.`groundcover.run` = '{_quoted(logged.key)}' and "
            f"tags.`groundcover.fingerprint` = '{_quoted(logged.fingerprint)}'"
        )
        found = self.client.search_runs([self.experiment], query, max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            tags = {"mlflow.runName": logged.name}
            if parent is not None:
                tags["mlflow.parentRunId"] = self.ids[parent.key]
            run_id = self.client.create_run(self.experiment, tags=tags).info.run_id
        self.ids[logged.key] = run_id
        return run_id


class WandbLog(TrackerLog):
    def __init__(self, tracking: Tracking):
        super().__init__(tracking)
        import wandb

        self.wandb = wandb
        self.dir = Path(tracking.uri or Path.cwd())
        self.dir.mkdir(parents=True, exist_ok=True)

    def write(self, logged: Logged, parent: Logged | None) -> str:
        wandb = self.wandb
        run_id = hashlib.sha256(f"{logged.key}\0{logged.fingerprint}".encode()).hexdigest()[:16]
        run = wandb.init(
            project=self.tracking.project,
            dir=str(self.dir),
            id=run_id,
            resume="allow",
            name=logged.name,
            group=parent.name if parent else None,
            job_type=("cell" if parent else logged.tags.get("groundcover.kind", "run")),
            config=logged.params,
            tags=[logged.tags.get("groundcover.framework", "study")],
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            reinit="create_new",
        )
        try:
            run.log(logged.metrics)
            run.summary.update(logged.metrics)
            if logged.files:
                artifact = wandb.Artifact(f"run-{logged.fingerprint}", type="groundcover-run")
                for path in logged.files:
                    artifact.add_file(str(path))
                run.log_artifact(artifact)
        finally:
            run.finish()
        return run_id


# ---- what is logged -------------------------------------------------------------------------


def run_log(run_dir: Path, scratch: Path) -> Logged:
    """One run's parameters, metrics, artifacts and tags, read from its directory."""
    from ..pages.report_html import headline, write_html
    from ..report import load_outcome

    manifest = read_manifest(run_dir / MANIFEST)
    outcome = load_outcome(run_dir)
    scores = [r.score for r in outcome.results if r.score is not None]
    top = headline(outcome, manifest, scores)
    metrics: dict[str, float] = {}
    if top["mean"] is not None:
        metrics["mean"] = top["mean"]
    if top["interval"]:
        metrics["mean.low"], metrics["mean.high"] = top["interval"]["low"], top["interval"]["high"]
    metrics |= {"scored": top["scored"], "recorded": top["recorded"], "items": top["items"]}
    metrics["failed"] = float(sum((top["failed"] or {}).values()))
    metrics |= {f"status.{s}": float(n) for s, n in top["statuses"].items()}
    metrics |= dict(numbers(outcome.tables or {}, "table"))
    params = dict(flat(identity_params(manifest)))
    page = scratch / _slug(run_dir) / "report.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    write_html([run_dir], page)
    files = [page, run_dir / MANIFEST, run_dir / SUMMARY]
    options = outcome.framework.Options.model_validate(manifest.options)
    tables_file = outcome.framework.tables_file(options)
    if tables_file and (run_dir / tables_file).is_file():
        files.append(run_dir / tables_file)
    return Logged(
        name=run_dir.name,
        key=str(run_dir.resolve()),
        fingerprint=manifest.config_fingerprint,
        params=params,
        metrics=metrics,
        files=[f for f in files if f.is_file()],
        tags={
            "groundcover.run": str(run_dir.resolve()),
            "groundcover.fingerprint": manifest.config_fingerprint,
            "groundcover.framework": manifest.framework,
            "groundcover.task": manifest.task,
            "groundcover.kind": "run",
        },
    )


def study_log(root: Path, meta: Any) -> Logged:
    """A study root: its combined table as metrics, its options as parameters."""
    digest = hashlib.sha256(json.dumps(meta.options, sort_keys=True, default=str).encode())
    fingerprint = digest.hexdigest()[:16]
    return Logged(
        name=root.name,
        key=str(root.resolve()),
        fingerprint=fingerprint,
        params=dict(flat({"study": meta.study, "runs": meta.runs, "options": meta.options})),
        metrics=dict(numbers(meta.combined or {}, "table")),
        files=[root / STUDY_FILE],
        tags={
            "groundcover.run": str(root.resolve()),
            "groundcover.fingerprint": fingerprint,
            "groundcover.framework": meta.study,
            "groundcover.kind": "study",
        },
    )


def identity_params(manifest: Any) -> dict[str, Any]:
    """What the run's numbers depend on: its options, roles' models and what its inputs and
    models are by content."""
    rests_on = manifest_provenance(manifest)
    return {
        "framework": manifest.framework,
        "task": manifest.task,
        "fingerprint": manifest.config_fingerprint,
        "package_version": manifest.package_version,
        "options": manifest.options,
        "models": {m["role"]: m["model"] for m in rests_on["models"]},
        "revisions": {m["role"]: m["revision"] for m in rests_on["models"]},
        "adapters": {
            m["role"]: m.get("adapter_revision") for m in rests_on["models"] if m.get("adapter")
        },
        "inputs": {i["name"]: i["sha256"] for i in rests_on["inputs"]},
        "fingerprinted": rests_on["fingerprinted"],
    }


def flat(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Dotted name -> text (a tracker's parameters are text; a long one is cut at 500)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from flat(inner, f"{prefix}.{key}" if prefix else str(key))
        return
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    yield prefix, redact(text)[:500]  # redacted before the cut


def numbers(value: Any, prefix: str) -> Iterator[tuple[str, float]]:
    """Every finite number of a table, by its dotted path (yes/no as 1/0; None left out)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from numbers(inner, f"{prefix}.{key}")
    elif isinstance(value, list):
        for k, inner in enumerate(value):
            yield from numbers(inner, f"{prefix}.{k}")
    elif isinstance(value, bool | int | float) and value == value and abs(value) != float("inf"):
        yield prefix, float(value)


def _mlflow_key(key: str) -> str:
    """MLflow names take letters, digits, ``_ - . / space`` and colons: the rest become ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ :" else "_" for c in key)[:250]


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _slug(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _millis() -> int:
    import time

    return int(time.time() * 1000)
