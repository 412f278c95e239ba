"""Read back what a W&B offline run wrote: its transaction log (``run-ID.wandb``) holds W&B's own
protobuf ``Record`` messages in LevelDB's log framing (32 KiB blocks; each chunk a 7-byte header:
checksum, little-endian length, type; first/middle/last chunks join into one record), after a
7-byte file header (":W&B", magic, version). W&B ships no Python reader for it any more (its Go
core writes and syncs it), so the test reads the framing here and decodes every record with
``wandb.proto.wandb_internal_pb2``: what ``wandb sync`` would upload."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    found, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the block's tail is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
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


def offline_run(run_dir: Path) -> dict[str, Any]:
    """What an offline run holds: its run record (name, group, job type, id), config, every
    history row, the final summary, and the artifacts' names and manifests."""
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "artifacts": []}
    (log,) = run_dir.glob("run-*.wandb")
    for record in records(log):
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
