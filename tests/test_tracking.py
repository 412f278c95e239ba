"""Runs logged where people track experiments, offline, through the real packages: an MLflow file
store read back with MLflow's own client, a W&B offline run read back from its transaction log
with W&B's own protobuf records. A study is a parent with one child per run; logging again goes
to the same tracker runs; a tracker that fails is one warning line and never fails a run.

The study is FanOutQA closed book judged by a panel of three scripted judges (tests/test_panels):
loose (0.5 + 1 + 0) / 3 = 0.5, the panel's judge 1 of 3."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.exports.tracking import Tracking, track
from tests.support.wandb_log import offline_run
from tests.test_panels import panel_run


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tracking") / "panel"
    panel_run(root, ["j1", "j2", "j3"])
    return root / "run"


def warnings() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200), buffer


def test_mlflow_holds_the_study_as_a_parent_with_its_run(study, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install 'groundcover[mlflow]')")
    store = (tmp_path / "mlruns").as_uri()
    ids = track([study], Tracking("mlflow", store))
    assert len(ids) == 2  # the study and its one run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    parent, child = (client.get_run(i) for i in ids)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert (parent.info.run_name, child.info.run_name) == ("run", "closed-book")
    manifest = json.loads((study / "closed-book" / "manifest.json").read_text())
    params = child.data.params
    assert params["fingerprint"] == manifest["config_fingerprint"]
    assert params["framework"] == "fanoutqa" and params["options.judge"] == "true"
    # each role's model by name (a panel member's '#' is not an MLflow name character)
    assert [params[f"models.{r}"] for r in ("answer", "judge", "judge_2", "judge_3")] == [
        "ans",
        "j1",
        "j2",
        "j3",
    ]
    assert len(params["inputs.input"]) == 64  # the data file by its SHA-256
    metrics = child.data.metrics
    assert metrics["mean"] == pytest.approx(0.5) and metrics["table.loose"] == pytest.approx(0.5)
    assert metrics["table.gpt_judge"] == pytest.approx(1 / 3)
    assert (metrics["items"], metrics["scored"], metrics["status.abstained"]) == (3, 3, 1)
    assert parent.data.metrics["table.closed-book.loose"] == pytest.approx(0.5)
    files = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert files == {"report.html", "manifest.json", "summary.json", "table1.json"}
    page = Path(client.download_artifacts(child.info.run_id, "report.html", str(tmp_path)))
    assert page.read_text().startswith("<!DOCTYPE html>")
    # logged again (a resumed run, or `report --track` later): the same two tracker runs
    assert track([study], Tracking("mlflow", store)) == ids
    experiment = client.get_experiment_by_name("groundcover")
    assert len(client.search_runs([experiment.experiment_id])) == 2


def test_wandb_offline_holds_the_same(study, tmp_path):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'groundcover[wandb]')")
    ids = track([study], Tracking("wandb", str(tmp_path)))
    runs = {}
    for directory in sorted((tmp_path / "wandb").glob("offline-run-*")):
        found = offline_run(directory)
        runs[found["name"]] = found
    assert set(runs) == {"run", "closed-book"}
    assert sorted(ids) == sorted(r["id"] for r in runs.values())
    cell = runs["closed-book"]
    assert (cell["group"], cell["job_type"]) == ("run", "cell")
    assert cell["summary"]["mean"] == pytest.approx(0.5)
    assert cell["summary"]["table.gpt_judge"] == pytest.approx(1 / 3)
    assert cell["history"][0]["table.loose"] == pytest.approx(0.5)
    assert cell["config"]["models.judge#2"] == "j2" and cell["config"]["framework"] == "fanoutqa"
    (artifact,) = cell["artifacts"]
    assert set(artifact["files"]) == {"report.html", "manifest.json", "summary.json", "table1.json"}
    assert runs["run"]["summary"]["table.closed-book.loose"] == pytest.approx(0.5)


def test_a_failing_or_missing_tracker_is_one_warning_line(study, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow not installed")
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    console, buffer = warnings()
    assert track([study], Tracking("mlflow", (blocked / "mlruns").as_uri()), console) == []
    said = buffer.getvalue().strip().splitlines()
    assert len(said) == 1 and said[0].startswith("warning: --track mlflow: nothing logged: ")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    console, buffer = warnings()
    assert track([study], Tracking("wandb", str(tmp_path)), console) == []
    assert buffer.getvalue().strip() == (
        "warning: --track wandb: nothing logged: wandb is not installed "
        "(pip install 'groundcover[wandb]')"
    )


def test_report_tracks_a_finished_run_and_a_bad_tracker_name_is_refused(study, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow not installed")
    store = (tmp_path / "mlruns").as_uri()
    runner = CliRunner()
    done = runner.invoke(
        app, ["report", str(study / "closed-book"), "--track", "mlflow", "--track-uri", store]
    )
    assert done.exit_code == 0, done.output
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("groundcover")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.data.metrics["mean"] == pytest.approx(0.5)
    bad = runner.invoke(app, ["report", str(study), "--track", "neptune"])
    assert bad.exit_code == 2 and "--track must be mlflow or wandb" in bad.output


def test_evaluate_tracks_after_the_run_and_a_failing_tracker_never_fails_it(tmp_path, capsys):
    pytest.importorskip("mlflow", reason="mlflow not installed")
    import groundcover
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_report_html import ITEMS, OUTPUTS

    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    client = ScriptedClient(
        {"coverage": lambda p: OUTPUTS[field_of(p, "Answer")]}, check_constraints=False
    )
    options = {"input": data, "method": "e2e", "summarise": False, "export_graphs": False}
    store = (tmp_path / "mlruns").as_uri()
    run = {"run_dir": tmp_path / "run", "cache": None, "track": "mlflow", "track_uri": store}
    done = groundcover.evaluate("comprehensiveness", options=options, run=run, client=client)
    from mlflow.tracking import MlflowClient

    mlflow_client = MlflowClient(tracking_uri=store)
    experiment = mlflow_client.get_experiment_by_name("groundcover")
    (found,) = mlflow_client.search_runs([experiment.experiment_id])
    assert found.data.metrics["mean"] == pytest.approx(done.summary.mean_score)
    blocked = tmp_path / "file"
    blocked.write_text("")
    run |= {"run_dir": tmp_path / "again", "track_uri": (blocked / "x").as_uri()}
    capsys.readouterr()
    again = groundcover.evaluate("comprehensiveness", options=options, run=run, client=client)
    assert again.summary.mean_score == done.summary.mean_score  # the run stands
    # said, in the run's log: evaluate is quiet by default and prints nothing
    assert "warning: --track mlflow: nothing logged: " in again.log
    assert capsys.readouterr().err == ""
