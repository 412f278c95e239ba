"""A finished run where people already look: every item's record flat in Parquet and CSV (read
back by pandas, pyarrow and Hugging Face `datasets`), and the run as an inspect_ai eval log
written and read back through inspect_ai itself, then opened in `inspect view` in a real browser.

The run is FanOutQA closed book judged by a panel of three scripted judges (tests/test_panels.py):
every column has a value worked out by hand there."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.exports.export import export_runs
from tests.support.browser import BROWSER, page_text
from tests.test_panels import panel_run

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
QUESTIONS = {
    "f1": "Which French cities host the two largest ports?",
    "f2": "When did the tower open?",
    "f3": "Is the sky blue?",
}


@pytest.fixture(scope="module")
def panel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exports") / "panel"
    panel_run(root, ["j1", "j2", "j3"])
    return root / "run" / "closed-book"


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {row["id"]: row for row in rows}


def test_parquet_holds_every_column_and_reads_back_in_pandas_and_datasets(panel, tmp_path):
    out, beside = export_runs([panel], tmp_path / "items.parquet", "parquet")
    import pandas as pd
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    rows = by_id(table.to_pylist())
    f1, f2, f3 = rows["f1"], rows["f2"], rows["f3"]
    # the item as a person reads it: question, the generation judged, the reference (JSON)
    assert (f1["input"], f1["answer"], f1["reference"]) == (
        QUESTIONS["f1"],
        "Paris and Marseille.",
        '["Paris", "Lyon"]',
    )
    # per-item metrics: f1 finds Paris of Paris+Lyon (loose 0.5, not strict), the panel says B
    assert (f1["metric.loose"], f1["metric.strict"], f1["metric.judge"]) == (0.5, 0.0, 1.0)
    assert (f2["metric.loose"], f2["metric.strict"], f2["metric.judge"]) == (1.0, 1.0, 0.0)
    assert f3["metric.judge"] is None and f3["metric.loose"] == 0.0  # no answer: not judged
    assert f3["status"] == "abstained" and f3["answer"] == ""
    # the panel: members' votes and the combined verdict; f2's was a declared tie
    assert json.loads(f1["panel.judge.votes"]) == [["B", "B", "A"]]
    assert json.loads(f2["panel.judge.value"]) == ["D"] and f2["panel.judge.ties"] == 1
    assert f1["panel.judge.ties"] == 0 and f3["panel.judge.votes"] is None
    # usage per stage and per role: one answer, one verdict from each member
    assert f1["usage.answer-closed-book.calls"] == 1 and f1["role.answer.calls"] == 1
    assert [f1[f"role.{r}.calls"] for r in ("judge", "judge#2", "judge#3")] == [1, 1, 1]
    # what the numbers rest on, in every row
    data = panel.parents[2] / "dev.json"
    assert f1["input.input.sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert [f1[f"model.{r}"] for r in ("answer", "judge", "judge#2", "judge#3")] == [
        "ans",
        "j1",
        "j2",
        "j3",
    ]
    manifest = json.loads((panel / "manifest.json").read_text())
    assert f1["run.fingerprint"] == manifest["config_fingerprint"]
    assert json.loads(f1["details"])["metrics"]["loose"] == 0.5
    # the tables beside the rows, in a file and in the Parquet file's own metadata
    tables = json.loads(beside.read_text())["runs"][0]
    assert tables["tables"]["gpt_judge"] == pytest.approx(1 / 3)
    assert json.loads(table.schema.metadata[b"groundcover"]) == json.loads(beside.read_text())
    # pandas and datasets read the same values
    frame = pd.read_parquet(out).set_index("id")
    assert frame.loc["f2", "metric.loose"] == 1.0 and frame.loc["f1", "panel.judge.ties"] == 0
    import datasets

    loaded = datasets.load_dataset(
        "parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert loaded.column_names == table.column_names
    assert by_id(loaded.to_list()) == rows


def test_csv_has_the_same_rows_as_text(panel, tmp_path):
    import pandas as pd

    csv_file, _ = export_runs([panel], tmp_path / "items.csv", "csv")
    parquet, _ = export_runs([panel], tmp_path / "items.parquet", "parquet")
    as_csv = pd.read_csv(csv_file).set_index("id")
    as_parquet = pd.read_parquet(parquet).set_index("id")
    assert list(as_csv.columns) == list(as_parquet.columns)
    for column in ("score", "metric.loose", "metric.judge", "role.judge#2.calls"):
        assert as_csv[column].equals(as_parquet[column].astype(as_csv[column].dtype)), column


def test_changed_inputs_give_no_item_text_and_say_so(tmp_path):
    run = tmp_path / "run"
    panel_run(run, ["j1"])
    data = tmp_path / "dev.json"
    data.write_text(data.read_text().replace("tower", "bridge"))  # the questions changed since
    out, beside = export_runs([run / "run" / "closed-book"], tmp_path / "x.parquet", "parquet")
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert all(r["input"] is None and r["reference"] is None for r in rows)
    assert [r["metric.loose"] for r in rows] == [0.5, 1.0, 0.0]  # the record itself stands
    notes = json.loads(beside.read_text())["runs"][0]["notes"]
    assert notes == ["input changed since the run: the rows carry no item text"]


def inspect_log(panel: Path, out: Path):
    inspect_log_module = pytest.importorskip(
        "inspect_ai.log", reason="inspect_ai not installed (pip install 'groundcover[inspect]')"
    )
    (written,) = export_runs([panel], out, "inspect")
    return inspect_log_module.read_eval_log(str(written))


def test_an_inspect_log_read_back_by_inspect_ai_has_equal_scores_per_sample(panel, tmp_path):
    log = inspect_log(panel, tmp_path / "panel.eval")
    import pyarrow.parquet as pq

    parquet, _ = export_runs([panel], tmp_path / "items.parquet", "parquet")
    rows = by_id(pq.read_table(parquet).to_pylist())
    assert log.status == "success" and [s.id for s in log.samples] == ["f1", "f2", "f3"]
    for sample in log.samples:
        row = rows[sample.id]
        metrics = {k[len("metric.") :]: v for k, v in row.items() if k.startswith("metric.")}
        assert {k: s.value for k, s in sample.scores.items()} == {
            k: v for k, v in metrics.items() if v is not None
        }
        assert (sample.input, sample.target) == (row["input"], row["reference"])
        assert sample.output.completion == row["answer"]
        assert sample.metadata["status"] == row["status"]
    f1 = log.samples[0]
    assert f1.scores["score"].explanation.startswith("found 50% of the reference")
    assert set(f1.role_usage) == {"answer", "judge", "judge#2", "judge#3"}
    assert set(f1.model_usage) == {"ans", "j1", "j2", "j3"}
    meta = log.eval.metadata["groundcover"]
    manifest = json.loads((panel / "manifest.json").read_text())
    assert meta["fingerprint"] == manifest["config_fingerprint"]
    assert meta["tables"]["gpt_judge"] == pytest.approx(1 / 3)
    judge = next(s for s in log.results.scores if s.name == "judge")
    # f1 passes, f2 fails; f3 has no verdict: left out of the mean and counted apart
    assert (judge.metrics["mean"].value, judge.scored_samples, judge.unscored_samples) == (
        0.5,
        2,
        1,
    )


@pytest.mark.skipif(BROWSER is None, reason="no chromium: ./setup.sh installs Debian's chromium")
def test_the_exported_log_opens_in_inspect_view(panel, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    inspect_log(panel, logs / "panel.eval")
    from groundcover.serving.launch.server import free_port

    port = free_port()
    inspect = Path(sys.executable).with_name("inspect")
    viewer = subprocess.Popen(
        [str(inspect), "view", "--log-dir", str(logs), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ | {"INSPECT_LOG_DIR": str(logs)},
    )
    try:
        wait_for_port(port, viewer)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "inspect-view.png"
        text = page_text(
            f"http://127.0.0.1:{port}/#/logs/panel.eval",
            ["f1", "f2", "f3", "Paris and Marseille."],
            shot,
        )
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
    assert "fanoutqa-closed-book" in text and QUESTIONS["f2"] in text
    assert "Paris and Marseille." in text and shot.stat().st_size > 10_000


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "inspect view exited"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"inspect view did not listen on {port}")


def test_report_exports_by_the_file_name_and_refuses_an_unknown_one(panel, tmp_path):
    pytest.importorskip("inspect_ai", reason="inspect_ai not installed")
    runner = CliRunner()
    done = runner.invoke(app, ["report", str(panel), "--export", str(tmp_path / "x.eval")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "x.eval").is_file() and f"export: {tmp_path / 'x.eval'}" in done.output
    bad = runner.invoke(app, ["report", str(panel), "--export", str(tmp_path / "x.txt")])
    assert bad.exit_code == 2 and "name the file .csv, .parquet, .eval or .json" in bad.output
    assert not (tmp_path / "x.txt").exists()


def test_per_item_metrics_by_hand():
    from groundcover.pipelines.icat.framework import ICAT
    from groundcover.pipelines.runtime.contract.protocol import Framework
    from groundcover.pipelines.runtime.contract.results import ItemResult

    # ICAT: 3 of 4 claims grounded (S_fact 0.75); ICAT-M covers 1 of 2 aspects (S_cov 0.5):
    # ICAT_1 = 2 * 0.75 * 0.5 / (0.75 + 0.5) = 0.6; ICAT-A found no aspect (undefined)
    details = {
        "s_fact": 0.75,
        "variants": {
            "m": {"s_cov": 0.5, "icat": {"1": 0.6}},
            "a": {"s_cov": None, "icat": {"1": None}},
        },
    }
    record = ItemResult(id="q", status="ok", score=0.6, explanation="x", details=details)
    assert ICAT.item_metrics(record) == {
        "score": 0.6,
        "s_fact": 0.75,
        "icat_m.s_cov": 0.5,
        "icat_m.icat_1": 0.6,
        "icat_a.s_cov": None,  # undefined stays None, never 0
        "icat_a.icat_1": None,
    }
    # the default: the score, then every number or yes/no at the top of the details
    plain = ItemResult(
        id="g",
        status="ok",
        score=1.0,
        explanation="x",
        details={"raf": 1, "deflected": False, "eligibility": "eligible", "sentences": [1]},
    )
    assert Framework.item_metrics(ICAT, plain) == {"score": 1.0, "raf": 1.0, "deflected": 0.0}
