"""A run's per-item records, flat: one row per item with everything the run knows of it.

The columns, in this order (a column a run does not have is absent, never filled with 0):

- ``run``, ``framework``, ``task``, ``id``, ``status``, ``score``, ``explanation``;
- ``failed_stage``, ``failure`` (why an item has no score);
- ``input``, ``answer``, ``reference``: what a person reads of the item (``Framework.item_text``),
  read from the run's inputs only when they still have the content the run recorded;
- ``metric.NAME``: each per-item metric (``Framework.item_metrics``), None where undefined;
- ``panel.STAGE.votes`` / ``.value`` (JSON text: the members' answers and the combined one, one
  entry per time the stage was asked) and ``panel.STAGE.ties``;
- ``usage.STAGE.COUNTER`` and ``role.ROLE.COUNTER`` (calls, requests, cache hits, retries,
  tokens, seconds; a role sums its stages);
- provenance: ``run.fingerprint``, ``run.package_version``, ``run.git_revision``,
  ``input.NAME.sha256``, ``model.ROLE``, ``model.ROLE.revision``, ``adapter.ROLE.revision``;
- ``details``: the framework's whole details as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ...runtime.contract.results import ItemResult, ItemText
from ...runtime.store.manifest import RunManifest
from ...runtime.store.provenance import (
    content_fields,
    manifest_provenance,
    unlike_recorded,
)
from ...runtime.store.run_dir import MANIFEST, RESULTS, read_manifest, results_by_id

Row = dict[str, Any]


@dataclass
class RunRows:
    """One run, read for its rows: the records stay on disk and are read as the rows are made
    (a large run never holds every parsed record at once); ``items`` are the run's inputs when
    they still hold what the run read (else None, with a ``notes`` line saying why)."""

    run_dir: Path
    manifest: RunManifest
    framework: Any
    options: Any
    records: Sequence[ItemResult]
    items: dict[str, Any] | None
    given: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def text(self, record: ItemResult) -> ItemText | None:
        """What a person reads of the record's item (None without the run's inputs)."""
        item = (self.items or {}).get(record.id)
        if item is None:
            return None
        text = self.framework.item_text(item, record, self.options)
        if record.id in self.given and "answer" not in record.details:
            text = ItemText(text.input, self.given[record.id], text.reference)
        return text

    def rows(self) -> Iterator[Row]:
        """Every recorded item as one flat row, in id order (columns may differ by row)."""
        where = {
            "run": str(self.run_dir),
            "framework": self.manifest.framework,
            "task": self.manifest.task,
        }
        rests_on = provenance_columns(self.manifest)
        for record in self.records:
            yield _row(self.framework, record, self.text(record), where, rests_on)


def run_rows(run_dir: Path, records: Sequence[ItemResult] | None = None) -> RunRows:
    """``run_dir`` read for its rows (``records``: the run's, where a caller has read them)."""
    from ...runtime.contract.plugins import run_framework, run_options

    manifest = read_manifest(run_dir / MANIFEST)
    fw = run_framework(manifest, run_dir)
    options = run_options(fw, manifest, run_dir)
    items, notes = run_items(fw, options, manifest)
    given = _given_answers(fw, options) if items is not None else {}
    if records is None:
        records = results_by_id(run_dir / RESULTS)
    return RunRows(run_dir, manifest, fw, options, records, items, given, notes)


def run_items(
    fw: Any, options: Any, manifest: RunManifest
) -> tuple[dict[str, Any] | None, list[str]]:
    """id -> item, from the run's inputs as they are now; None (with a note saying why) where
    they are gone or no longer hold what the run read."""
    if getattr(fw, "records_only", False):  # its code is not loaded: nothing reads the inputs
        return None, [fw.note]
    if manifest.inputs is None and _names_files(options):
        # the files are named by the run alone, which anyone could have written: with no
        # digest to hold them to, any file of the reader's could be read into the rows
        return None, [
            "the run records no SHA-256 of the files its options name: the rows carry no item "
            "text (rerun it here to record them)"
        ]
    try:
        if manifest.inputs is not None:  # the files items are read from; never a model
            changed = unlike_recorded(options, manifest.inputs)
            if changed:
                return None, [
                    f"{', '.join(changed)} changed since the run: the rows carry no item text"
                ]
        items = {str(item.id): item for item in fw.load(options)}
    except (ValueError, OSError) as exc:  # UserError is a ValueError: gone, moved, unreadable
        return None, [f"the run's inputs cannot be read now ({exc}): the rows carry no item text"]
    if manifest.inputs is None:
        return items, ["the run's inputs are known by name only: item text read as the files are"]
    return items, []


def _names_files(options: Any) -> bool:
    """Whether ``options`` name a file or folder to read (a model is known by name or revision)."""
    return isinstance(options, BaseModel) and any(
        marker.kind != "model" for _, marker, _ in content_fields(options)
    )


def _given_answers(fw: Any, options: Any) -> dict[str, str]:
    try:
        return fw.given_answers(options) or {}
    except ValueError:
        return {}


def provenance_columns(manifest: RunManifest) -> Row:
    """The columns every row of a run shares after its own: what its numbers rest on."""
    rests_on = manifest_provenance(manifest)
    provenance: Row = {
        "run.fingerprint": manifest.config_fingerprint,
        "run.package_version": manifest.package_version,
        "run.git_revision": manifest.git_revision,
    }
    for entry in rests_on["inputs"]:
        provenance[f"input.{entry['name']}.sha256"] = entry["sha256"]
    for model in rests_on["models"]:
        provenance[f"model.{model['role']}"] = model["model"]
        provenance[f"model.{model['role']}.revision"] = model["revision"]
        if model.get("adapter"):
            provenance[f"adapter.{model['role']}"] = model["adapter"]
            provenance[f"adapter.{model['role']}.revision"] = model.get("adapter_revision")
    return provenance


def _row(fw: Any, record: ItemResult, text: ItemText | None, where: Row, rests_on: Row) -> Row:
    row: Row = dict(where)
    row |= {
        "id": record.id,
        "status": record.status,
        "score": record.score,
        "explanation": record.explanation,
        "failed_stage": record.failure.stage if record.failure else None,
        "failure": record.failure.error if record.failure else None,
        "input": text.input if text else None,
        "answer": text.answer if text else None,
        "reference": text.reference if text else None,
    }
    for name, value in fw.item_metrics(record).items():
        row[f"metric.{name}"] = value
    row |= panel_columns(record)
    row |= usage_columns(fw, record)
    row |= rests_on
    row["details"] = json.dumps(record.details, ensure_ascii=False, default=str, sort_keys=True)
    return row


def panel_columns(record: ItemResult) -> Row:
    """Per judging stage asked of a panel: every time's members' answers and combined value
    (JSON text) and how many of them were ties."""
    stages: dict[str, list[dict[str, Any]]] = {}
    for entry in record.details.get("panel", []):
        stages.setdefault(entry["stage"], []).append(entry)
    row: Row = {}
    for stage, entries in stages.items():
        votes, values = [e["members"] for e in entries], [e["value"] for e in entries]
        row[f"panel.{stage}.votes"] = json.dumps(votes, ensure_ascii=False, default=str)
        row[f"panel.{stage}.value"] = json.dumps(values, ensure_ascii=False, default=str)
        row[f"panel.{stage}.ties"] = sum(bool(e.get("tie")) for e in entries)
    return row


def usage_columns(fw: Any, record: ItemResult) -> Row:
    """Usage per stage, then per role (the sum of its stages), counter by counter."""
    row: Row = {}
    roles: dict[str, dict[str, float]] = {}
    for stage, counters in sorted(record.usage.items()):
        role = roles.setdefault(fw.role_of(stage, "unknown"), {})
        for counter, value in counters.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            row[f"usage.{stage}.{counter}"] = value
            role[counter] = role.get(counter, 0) + value
    for role_name, counters in sorted(roles.items()):
        for counter, value in counters.items():
            row[f"role.{role_name}.{counter}"] = value
    return row


def all_runs(paths: list[Path]) -> list[RunRows]:
    """Every run the paths stand for (study roots for their runs), read for their rows."""
    from ...runtime.store.run_dir import run_directories

    return [run_rows(p) for p in run_directories(paths)]
