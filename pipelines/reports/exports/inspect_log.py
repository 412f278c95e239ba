"""A run as an inspect_ai eval log (``report --export run.eval``), so ``inspect view`` opens it.

inspect_ai's maintainers do not freeze the file format, so nothing here writes it by hand: the
log is built from inspect_ai's own classes and written by its ``write_eval_log`` (the optional
extra ``groundcover[inspect]``). One sample per recorded item:

- ``input`` the item's question, ``target`` its reference (empty where the framework has none),
  the judged answer as the model output and the conversation's last message;
- ``scores``: each per-item metric (``Framework.item_metrics``) as an inspect score, the item's
  explanation on ``score``; an undefined metric is left out (inspect has no "no value"), and an
  item without a score carries none, its status in the sample's metadata;
- the sample's id is the item's where that is a plain name (inspect_ai names the sample's file
  in the archive after it), else a plain name made of it (``sample_id``); the item's own id is
  in the sample's metadata (``id``);
- per-role and per-model token usage; the status, failure and usage by stage in the sample's
  metadata (the framework's details stay in the run directory and the Parquet export: they are
  large, and inspect walks every byte of a sample).

The log's metadata (``groundcover``) holds the run's identity, what it rests on, its summary
and its tables; its results hold the mean of each metric over the items that have it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ....serving.files import atomic_file
from ...runtime.contract.errors import UserError
from ...runtime.contract.results import UNSCORED
from ...runtime.store.harness_answers import outside_event_loop
from ...runtime.store.provenance import manifest_provenance
from .rows import RunRows, run_rows

INSTALL = "pip install 'groundcover[inspect]'"


def inspect_api() -> Any:
    try:
        import inspect_ai.log as log
    except ImportError:
        raise UserError(f"an inspect_ai log needs inspect_ai: {INSTALL}") from None
    return log


def write_inspect_logs(paths: list[Path], out: Path) -> list[Path]:
    """One log per run: ``out`` for one run; for several, ``out``'s name with each run's
    name added (``x-closed-book.eval``)."""
    from ...runtime.store.run_dir import run_directories

    runs = run_directories(paths)
    written = []
    for run_dir in runs:
        if len(runs) == 1:  # the file the user typed
            written.append(write_inspect_log(run_rows(run_dir), out))
        else:  # names made here: a link at one of them is not the user's to follow
            named = out.with_name(f"{out.stem}-{_slug(run_dir)}{out.suffix}")
            written.append(write_inspect_log(run_rows(run_dir), named, within=out.parent))
    return written


def _slug(run_dir: Path) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_dir.name).strip("-") or "run"


def write_inspect_log(run: RunRows, out: Path, within: Path | None = None) -> Path:
    """inspect_ai writes the log to a path of its own choosing only, so it writes into a
    private folder of ours (``mkdtemp``: made afresh, 0700), and the bytes become ``out``
    the one way every file is written (``serving.files``)."""
    log = inspect_api()
    eval_log = build_log(run)
    kind = "json" if out.suffix.lower() == ".json" else "eval"
    with tempfile.TemporaryDirectory(prefix="groundcover-inspect-") as private:
        made = Path(private) / f"log{out.suffix}"
        outside_event_loop(lambda: log.write_eval_log(eval_log, str(made), format=kind))
        with made.open("rb") as source, atomic_file(out, "wb", within=within) as handle:
            shutil.copyfileobj(source, handle)
    return out


def build_log(run: RunRows) -> Any:
    """The run as an ``EvalLog`` (inspect_ai's class), its records read in one pass."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSpec, EvalStats

    from ...runtime.store.summary import records_for_tables, summarise, tables_of

    manifest = run.manifest
    records = records_for_tables(run.framework, run.options, run.records)
    summary = summarise(run.framework.name, manifest.task, manifest.items, records)
    models = role_models(run)
    found = Samples(run, models)
    for record in records:
        found.add(record)
    lead = manifest.models or {}
    spec = EvalSpec(
        created=_iso(manifest.created_at),
        task=manifest.task,
        task_version=manifest.format_version,
        task_args=_json_safe(manifest.options),
        dataset=EvalDataset(
            name=manifest.task,
            location=_input_location(run),
            samples=manifest.items,
            sample_ids=[s.id for s in found.samples],
        ),
        model=lead.get("request_model") or lead.get("model") or next(iter(models.values()), "none"),
        config=EvalConfig(),
        packages={"groundcover": manifest.package_version},
        metadata={
            "groundcover": {
                "run": str(run.run_dir),
                "framework": manifest.framework,
                "fingerprint": manifest.config_fingerprint,
                "identity": _json_safe(manifest.config),
                "provenance": manifest_provenance(manifest),
                "roles": models,
                "summary": summary.to_json(),
                "tables": _json_safe(tables_of(run.framework, run.options, records)),
                "notes": run.notes,
            }
        },
    )
    return EvalLog(
        status="cancelled" if summary.recorded < manifest.items else "success",
        eval=spec,
        results=found.results(manifest.items, summary.recorded),
        stats=EvalStats(
            started_at=_iso(manifest.created_at),
            completed_at=_iso(_completed(run)),
            model_usage=found.model_usage,
            role_usage=found.role_usage,
        ),
        samples=found.samples,
    )


def role_models(run: RunRows) -> dict[str, str]:
    """role -> the model (or adapter) that played it."""
    out = {}
    for role, record in (run.manifest.roles or {}).items():
        out[role] = record.get("request_model") or record.get("model") or role
    return out


class Samples:
    """The log's samples, each metric's values and the usage totals, gathered record by record
    (a large run's records are read once)."""

    def __init__(self, run: RunRows, models: dict[str, str]):
        self.run, self.models = run, models
        self.samples: list[Any] = []
        self.values: dict[str, list[float]] = {}
        self.model_usage: dict[str, Any] = {}
        self.role_usage: dict[str, Any] = {}

    def add(self, record: Any) -> None:
        metrics = self.run.framework.item_metrics(record)
        for name, value in metrics.items():
            self.values.setdefault(name, [])
            if value is not None:
                self.values[name].append(float(value))
        by_model = _item_usage(self.run, record.usage, self.models, by_model=True)
        by_role = _item_usage(self.run, record.usage, self.models, by_model=False)
        _add_usage(self.model_usage, by_model)
        _add_usage(self.role_usage, by_role)
        self.samples.append(sample(self.run, record, metrics, by_model, by_role, self.models))

    def results(self, items: int, recorded: int) -> Any:
        """Each metric's mean over the items that have it; how many have none is said."""
        from inspect_ai.log import EvalMetric, EvalResults, EvalScore

        scores = []
        for name, found in self.values.items():
            metrics = {}
            if found:
                metrics["mean"] = EvalMetric(name="mean", value=sum(found) / len(found))
            scores.append(
                EvalScore(
                    name=name,
                    scorer=f"groundcover/{self.run.framework.name}",
                    scored_samples=len(found),
                    unscored_samples=len(self.samples) - len(found),  # None or absent
                    metrics=metrics,
                )
            )
        return EvalResults(total_samples=items, completed_samples=recorded, scores=scores)


def sample(
    run: RunRows,
    record: Any,
    metrics: dict[str, float | None],
    model_usage: dict[str, Any],
    role_usage: dict[str, Any],
    models: dict[str, str],
) -> Any:
    """One item as an inspect sample. The framework's details are not in it: they are large
    (a fact graph per item) and inspect's viewer walks every byte of a sample; the Parquet
    export (``details``) and the run directory keep them."""
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, ModelOutput
    from inspect_ai.scorer import Score

    text = run.text(record)
    question = text.input if text else ""
    answer = (text.answer if text else None) or ""
    answering = models.get("answer") or models.get("generate") or "given"
    scores = {}
    for name, value in metrics.items():
        if value is None:
            continue
        explanation = record.explanation if name == "score" else None
        scores[name] = Score(value=value, answer=answer or None, explanation=explanation)
    return EvalSample(
        id=sample_id(record.id),
        epoch=1,
        input=question,
        target=(text.reference if text else None) or "",
        messages=[ChatMessageUser(content=question), ChatMessageAssistant(content=answer)],
        output=ModelOutput.from_content(answering, answer),
        scores=scores or None,
        metadata={
            "id": record.id,  # the item's own id, as data (``sample_id`` names its file)
            "status": record.status,
            "explanation": record.explanation,
            "failure": record.failure.model_dump() if record.failure else None,
            "unscored": record.status in UNSCORED,
            "usage": record.usage,
        },
        model_usage=model_usage,
        role_usage=role_usage,
    )


_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")


def sample_id(item_id: str) -> str:
    """The id a sample has in the log, which inspect_ai makes the name of the sample's file in
    the archive (``samples/ID_epoch_1.json``): the item's id where it is a plain name, else a
    plain name made of it with a digest of the whole id added (a sent run's ids such as
    ``../../x`` or ``/tmp/x`` name no file outside ``samples/`` in any unzipper)."""
    import hashlib

    if _PLAIN_ID.fullmatch(item_id) and len(item_id) <= 128:
        return item_id
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", item_id).strip("-")[:64] or "item"
    return f"{slug}-{hashlib.sha256(item_id.encode()).hexdigest()[:16]}"


def _item_usage(run: RunRows, usage: dict[str, Any], models: dict[str, str], by_model: bool) -> Any:
    from inspect_ai.model import ModelUsage

    out: dict[str, Any] = {}
    for stage, counters in usage.items():
        role = run.framework.role_of(stage, "unknown")
        key = models.get(role, role) if by_model else role
        prompt = int(counters.get("prompt_tokens", 0))
        completion = int(counters.get("completion_tokens", 0))
        reasoning = int(counters.get("reasoning_tokens", 0))
        found = out.setdefault(key, ModelUsage())
        found.input_tokens += prompt
        found.output_tokens += completion
        found.total_tokens += prompt + completion
        found.reasoning_tokens = (found.reasoning_tokens or 0) + reasoning
    return out


def _add_usage(total: dict[str, Any], usage: dict[str, Any]) -> None:
    from inspect_ai.model import ModelUsage

    for key, found in usage.items():
        into = total.setdefault(key, ModelUsage(reasoning_tokens=0))
        into.input_tokens += found.input_tokens
        into.output_tokens += found.output_tokens
        into.total_tokens += found.total_tokens
        into.reasoning_tokens = (into.reasoning_tokens or 0) + (found.reasoning_tokens or 0)


def _completed(run: RunRows) -> float:
    """When the last invocation ended: it started at the last (re)start and ran the seconds
    its line in invocations.jsonl says (the start alone where there is none)."""
    import json

    from ...runtime.store.run_dir import INVOCATIONS

    last = max([run.manifest.created_at, *run.manifest.resumed_at])
    try:
        lines = (run.run_dir / INVOCATIONS).read_text(encoding="utf-8").splitlines()
        return last + float(json.loads(lines[-1])["seconds"])
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return last


def _input_location(run: RunRows) -> str | None:
    inputs = run.manifest.inputs or {}
    first = inputs.get("input") or next(iter(inputs.values()), None)
    return str(first.get("path")) if first and first.get("path") else None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds or 0, UTC).isoformat()


def _json_safe(value: Any) -> Any:
    """What JSON holds as it is; anything else as text (paths, sets)."""
    import json

    return json.loads(json.dumps(value, default=str))
