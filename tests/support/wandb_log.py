"""Read back what a W&B offline run wrote: its transaction log (``run-ID.wandb``) holds W&B's own
protobuf ``Record`` messages in LevelDB's log framing (32 KiB blocks; each chunk a 7-byte header:
checksum, little-endian length, type; first/middle/last chunks join into one record), after a
7-byte file header (":W&B", magic, version). W&B ships no Python reader for it any more (its Go
core writes and syncs it), so the test reads the framing here and decodes every record with
``wandb.proto.wandb_internal_pb2``: what ``wandb sync`` would upload."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if len(data) < HEADER:  # not written yet
        return []
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    found, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the block's tail is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if offset + HEADER + length > len(data):  # a tail still being written
            break
        chunk = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


def finished_records(run_dir: Path, wait: float = 60.0) -> list[Any]:
    """The records of a run's log once its ``exit`` record is on disk. W&B's core process writes
    the log through a buffer of its own and may still hold it when ``run.finish()`` has returned
    (seen under load: a log with no ``run`` record yet), so the log is read until it ends."""
    deadline = time.monotonic() + wait
    while True:
        logs = list(run_dir.glob("run-*.wandb"))
        found = records(logs[0]) if len(logs) == 1 else []
        if found and found[-1].WhichOneof("record_type") == "exit":
            return found
        assert time.monotonic() < deadline, f"{run_dir}: no exit record after {wait:.0f}s"
        time.sleep(0.2)


def offline_run(run_dir: Path) -> dict[str, Any]:
    """What an offline run holds: its run record (name, group, job type, id), config, every
    history row, the final summary, and the artifacts' names and manifests."""
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "artifacts": []}
    for record in finished_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out |= {"id": run.run_id, "name": run.display_name, "group": run.run_group}
            out["job_type"] = run.job_type
            out["config"] |= _items(run.config.update)
        elif kind == "config":
            out["config"] |= _items(record.config.update)
        elif kind == "history":
            out["history"].append(_items(record.history.item))
        elif kind == "summary":
            out["summary"] |= _items(record.summary.update)
        elif kind == "artifact":
            artifact = record.artifact
            files = [entry.path for entry in artifact.manifest.contents]
            out["artifacts"].append({"name": artifact.name, "type": artifact.type, "files": files})
    return out


def _items(items: Any) -> dict[str, Any]:
    """key -> value of history, summary or config items (a key is ``key`` or its nested path)."""
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}
