"""What a run directory holds, read raw: for tests that count each record once."""

from __future__ import annotations

import json
from pathlib import Path

from groundcover.pipelines.runtime.store.run_dir import result_files


def whole_records(run: Path) -> list[str]:
    """The id of every whole record in every results file of the run (duplicates kept)."""
    ids = []
    for path in result_files(run):
        if path.is_file():
            ids += [json.loads(line)["id"] for line in path.read_bytes().split(b"\n")[:-1]]
    return ids
