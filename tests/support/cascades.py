"""Calibrations as ``groundcover cascade calibrate`` writes them (the fields a cascade run reads),
known by their digest: the tests' one way to make or edit one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from groundcover.pipelines.runtime.contract.cascade import CALIBRATION_KIND, content_digest


def write_calibration(
    path: Path,
    tiers: list[tuple[list[str], list[str]]],
    stages: dict[str, dict[str, Any]],
    alpha: float = 0.1,
    delta: float = 0.1,
) -> Path:
    """``tiers``: each tier's (members, models), cheapest first; ``stages``: per stage its
    thresholds (and kinds of confidence)."""
    made = {
        "kind": CALIBRATION_KIND,
        "version": 1,
        "alpha": alpha,
        "delta": delta,
        "tiers": [
            {"run": f"tier{k}", "task": "", "members": list(members), "models": list(models)}
            for k, (members, models) in enumerate(tiers, 1)
        ],
        "stages": stages,
        "skipped": {},
    }
    return write_digested(path, made)


def write_digested(path: Path, made: dict[str, Any]) -> Path:
    """``made`` (a calibration, edited) written with the digest of what it now holds."""
    made["sha256"] = content_digest(made)
    path.write_text(json.dumps(made))
    return path
