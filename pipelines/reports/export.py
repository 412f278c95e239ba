"""``report --export FILE``: the runs' per-item records where people analyse them.

- ``.csv`` / ``.parquet``: one flat row per item with everything in it (``rows``); the runs'
  tables, summaries and provenance beside it in ``FILE.tables.json`` (and, in Parquet, in the
  file's own metadata under ``groundcover``), so pandas, pyarrow and ``datasets`` read the rows
  and nothing of the run is lost.
- ``.eval`` / ``.json``: an inspect_ai eval log per run, written by inspect_ai itself
  (``inspect_log``), so ``inspect view`` opens it.

Every file appears whole or not at all (written beside, then renamed).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ..runtime.errors import UserError
from ..runtime.provenance import manifest_provenance
from .rows import Row, RunRows, all_rows

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
    rows, runs = all_rows(paths)
    tables = tables_beside(runs)
    if kind == "parquet":
        _write_parquet(rows, tables, out)
    else:
        _write_csv(rows, out)
    beside = out.with_name(out.name + ".tables.json")
    _atomic_text(beside, json.dumps(tables, indent=1, default=str))
    return [out, beside]


def tables_beside(runs: list[RunRows]) -> dict[str, Any]:
    """Per run: its summary, tables and what it rests on (what the rows alone do not say)."""
    from ..runtime.summary import summarise, tables_of

    out = []
    for run in runs:
        summary = summarise(run.framework.name, run.manifest.task, run.manifest.items, run.records)
        out.append(
            {
                "run": str(run.run_dir),
                "framework": run.manifest.framework,
                "task": run.manifest.task,
                "summary": summary.to_json(),
                "tables": tables_of(run.framework, run.options, run.records),
                "provenance": manifest_provenance(run.manifest),
                "notes": run.notes,
            }
        )
    return {"runs": out}


def _write_parquet(rows: list[Row], tables: dict[str, Any], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    meta = {b"groundcover": json.dumps(tables, default=str).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)


def _write_csv(rows: list[Row], out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["run", "id"])
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(out)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
