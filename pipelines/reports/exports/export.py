"""``report --export FILE``: the runs' per-item records where people analyse them.

- ``.csv`` / ``.parquet``: one flat row per item with everything in it (``rows``); the runs'
  tables, summaries and provenance beside it in ``FILE.tables.json`` (and, in Parquet, in the
  file's own metadata under ``groundcover``), so pandas, pyarrow and ``datasets`` read the rows
  and nothing of the run is lost.
- ``.eval`` / ``.json``: an inspect_ai eval log per run, written by inspect_ai itself
  (``inspect_log``), so ``inspect view`` opens it.

Every file appears whole or not at all (``serving.files``: written beside, then renamed); the
file typed is the user's, the tables file beside it is not theirs to follow as a link.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ....serving.files import atomic_file, check_within, write_atomic
from ...runtime.contract.errors import UserError
from ...runtime.store.provenance import manifest_provenance
from .rows import RunRows, all_runs

BATCH = 2000  # rows per Arrow batch
FORMATS = {".csv": "csv", ".parquet": "parquet", ".eval": "inspect", ".json": "inspect"}


def export_format(out: Path, given: str | None) -> str:
    """The format asked for (``--format``), else the one the file name says."""
    if given is not None:
        if given not in set(FORMATS.values()):
            raise UserError(f"--format must be csv, parquet or inspect, got {given!r}")
        return given
    found = FORMATS.get(out.suffix.lower())
    if found is None:
        raise UserError(
            f"--export {out}: say --format csv | parquet | inspect, or name the file .csv, "
            ".parquet, .eval or .json"
        )
    return found


def export_runs(paths: list[Path], out: Path, kind: str) -> list[Path]:
    """Write the export; returns the files written (the tables file too)."""
    if kind == "inspect":
        from .inspect_log import write_inspect_logs

        return write_inspect_logs(paths, out)
    for made in made_beside(out, kind):  # a link there refused before anything is written
        check_within(made, out.parent)
    beside = out.with_name(out.name + ".tables.json")
    runs = all_runs(paths)
    table = arrow_table(runs)
    tables = tables_beside(runs)
    if kind == "parquet":
        _write_parquet(table, tables, out)
    else:
        _write_csv(table, out)
    text = json.dumps(tables, indent=1, ensure_ascii=False, default=str)
    write_atomic(beside, text, within=out.parent)  # a name the user did not type
    return [out, beside]


def made_beside(out: Path, kind: str) -> list[Path]:
    """The files an export writes beside ``out`` under names the user did not type."""
    return [] if kind == "inspect" else [out.with_name(out.name + ".tables.json")]


def arrow_table(runs: list[RunRows], batch: int = BATCH) -> Any:
    """Every run's rows as one Arrow table, built ``batch`` rows at a time (a million-item run
    is held column by column, never as a million dicts); a column some rows lack is null there,
    and numbers of one column that differ in kind become floats."""
    import pyarrow as pa

    parts, pending = [], []
    for run in runs:
        for row in run.rows():
            pending.append(row)
            if len(pending) == batch:
                parts.append(pa.Table.from_pylist(pending))
                pending = []
    if pending or not parts:
        parts.append(pa.Table.from_pylist(pending))
    return pa.concat_tables(parts, promote_options="permissive")


def tables_beside(runs: list[RunRows]) -> dict[str, Any]:
    """Per run: its summary, tables and what it rests on (what the rows alone do not say)."""
    from ...runtime.store.summary import records_for_tables, summarise, tables_of

    out = []
    for run in runs:
        records = records_for_tables(run.framework, run.options, run.records)
        summary = summarise(run.framework.name, run.manifest.task, run.manifest.items, records)
        out.append(
            {
                "run": str(run.run_dir),
                "framework": run.manifest.framework,
                "task": run.manifest.task,
                "summary": summary.to_json(),
                "tables": tables_of(run.framework, run.options, records),
                "provenance": manifest_provenance(run.manifest),
                "notes": run.notes,
            }
        )
    return {"runs": out}


def _write_parquet(table: Any, tables: dict[str, Any], out: Path) -> None:
    import pyarrow.parquet as pq

    meta = {b"groundcover": json.dumps(tables, ensure_ascii=False, default=str).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    with atomic_file(out, "wb") as handle:
        pq.write_table(table, handle)


def _write_csv(table: Any, out: Path) -> None:
    """The same rows as text (Python's csv: what pandas and a spreadsheet read), batch by
    batch; a text cell a spreadsheet would run as a formula is written as text (``cells``)."""
    from .cells import spreadsheet_row

    with atomic_file(out) as handle:
        writer = csv.DictWriter(handle, fieldnames=table.column_names or ["run", "id"])
        writer.writeheader()
        for part in table.to_batches(max_chunksize=BATCH):
            writer.writerows(spreadsheet_row(row) for row in part.to_pylist())
