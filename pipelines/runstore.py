"""Run directories: a manifest, per-item results appended atomically as JSONL, and a summary.

Restarting the same command on the same directory resumes: items with a recorded result are
skipped. A process killed mid-write leaves at most a torn last line, which is cut off on the next
open (that item simply runs again), so every item ends with exactly one result.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"

# Every per-item record has one of these; none is ever dropped from a denominator silently.
STATUSES = ("ok", "unparseable", "abstained", "undefined", "error")


class RunStoreError(RuntimeError):
    pass


def atomic_write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


def fingerprint(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("groundcover")
    except PackageNotFoundError:
        return "unknown"


class RunStore:
    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)
        self.manifest_path = self.dir / MANIFEST
        self.results_path = self.dir / RESULTS
        self.summary_path = self.dir / SUMMARY
        self._fd: int | None = None

    # ---- manifest ----------------------------------------------------------------------------

    def open(
        self,
        *,
        task: str,
        config: dict[str, Any],
        models: dict[str, Any],
        prompts: dict[str, str],
    ) -> dict[str, Any]:
        """Create the run, or resume it if the directory holds the same task and config."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config_fp = fingerprint({"task": task, "config": config})
        if self.manifest_path.exists():
            manifest = self.manifest()
            if manifest.get("config_fingerprint") != config_fp:
                raise RunStoreError(
                    f"{self.manifest_path}: this run directory holds a different task or config "
                    f"(fingerprint {manifest.get('config_fingerprint')} != {config_fp}); "
                    "use a new --run-dir"
                )
            manifest.setdefault("resumed_at", []).append(time.time())
        else:
            manifest = {
                "task": task,
                "command": sys.argv,
                "config": config,
                "config_fingerprint": config_fp,
                "models": models,
                "prompts": prompts,
                "package_version": package_version(),
                "git_revision": git_revision(),
                "python": sys.version.split()[0],
                "host": platform.node(),
                "created_at": time.time(),
            }
        atomic_write_json(self.manifest_path, manifest)
        self._repair_tail()
        return manifest

    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RunStoreError(f"{self.manifest_path}: unreadable manifest: {exc}") from exc

    # ---- results -----------------------------------------------------------------------------

    def _repair_tail(self) -> None:
        """Cut a torn last line left by a process killed mid-append."""
        if not self.results_path.exists():
            return
        data = self.results_path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.results_path, "r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)

    def results(self) -> list[dict[str, Any]]:
        """Recorded results in order; the first record of an id wins (defensive; never expected)."""
        if not self.results_path.exists():
            return []
        seen: dict[str, dict[str, Any]] = {}
        with open(self.results_path, encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, 1):
                if not line.endswith("\n"):
                    break  # torn tail: not a finished record
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RunStoreError(
                        f"{self.results_path}:{lineno}: corrupt record: {exc}"
                    ) from exc
                seen.setdefault(str(record["id"]), record)
        return list(seen.values())

    def completed_ids(self) -> set[str]:
        return {str(r["id"]) for r in self.results()}

    def append(self, record: dict[str, Any]) -> None:
        """One write() of one whole line on an O_APPEND descriptor: no interleaving, no torn
        records from concurrent writers; a kill can only tear the line being written."""
        if record.get("status") not in STATUSES:
            raise ValueError(f"record {record.get('id')!r}: status must be one of {STATUSES}")
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        if self._fd is None:
            self._fd = os.open(self.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, line.encode())

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, summary)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


def status_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for record in records:
        counts[record["status"]] += 1
    return counts
