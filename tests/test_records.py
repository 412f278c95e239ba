"""The typed records of a run directory (manifest, summary, study), read from run directories
that the code of 2026-11-26 wrote before they were typed (``tests/fixtures/runs-v2``): they
load, report and resume unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.pipelines.runtime.store.manifest import (
    FORMAT_VERSION,
    RunManifest,
    RunSummary,
    StudyRecord,
)
from groundcover.pipelines.runtime.store.run_dir import (
    RunStoreError,
    read_manifest,
    read_study,
    read_summary,
)
from tests.support.scripted import ScriptedClient

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "runs-v2"
RUNS = [
    FIXTURE / "fanoutqa-answers" / "answers",
    *sorted((FIXTURE / "fanoutqa-repeats").glob("repeat-*")),
]


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_records_of_the_previous_version_load_typed_and_write_back_unchanged(run_dir):
    manifest = read_manifest(run_dir / "manifest.json")
    assert isinstance(manifest, RunManifest) and manifest.format_version == FORMAT_VERSION
    assert (manifest.framework, manifest.task, manifest.items) == (
        "fanoutqa",
        "fanoutqa-answers",
        2,
    )
    assert manifest.roles["judge"]["stages"] == ["judge"]
    on_disk = json.loads((run_dir / "manifest.json").read_text())
    assert manifest.to_json() == on_disk  # every key kept, none added
    summary = read_summary(run_dir)
    assert isinstance(summary, RunSummary) and summary.statuses["abstained"] == 1
    written = json.loads((run_dir / "summary.json").read_text())
    assert summary.to_json() == written | {"format_version": FORMAT_VERSION}


def test_study_records_of_the_previous_version_load_typed():
    repeats = read_study(FIXTURE / "fanoutqa-repeats")
    assert isinstance(repeats, StudyRecord)
    assert (repeats.study, repeats.runs, repeats.repeats) == (
        "fanoutqa",
        ["repeat-1", "repeat-2"],
        2,
    )
    assert repeats.combined["repeats"] == 2
    single = read_study(FIXTURE / "fanoutqa-answers")
    assert single.runs == ["answers"] and single.repeats is None


def test_report_rebuilds_the_previous_versions_runs(tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(FIXTURE, copy)
    out = CliRunner().invoke(app, ["report", str(copy / "fanoutqa-repeats"), "--json"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines()]
    runs = [line for line in lines if "run" in line]
    assert len(runs) == 2 and lines[-1]["repeats"]["repeats"] == 2
    table = json.loads((FIXTURE / "fanoutqa-repeats" / "repeat-1" / "table1.json").read_text())
    assert runs[0]["tables"] == table
    assert runs[0]["summary"]["statuses"] == {"cut_in_reasoning": 0, "unjudged": 0} | {
        "ok": 1,
        "unparseable": 0,
        "abstained": 1,
        "undefined": 0,
        "error": 0,
    }


def test_a_run_of_the_previous_version_resumes_without_asking_again(tmp_path, monkeypatch):
    """The same request on a copy of the run: every item is recorded, so no model is asked and
    the records stay as they were; the manifest notes the resume."""
    monkeypatch.chdir(ROOT)  # the recorded options name the data relative to the repository
    run_dir = tmp_path / "fanoutqa-answers"
    shutil.copytree(FIXTURE / "fanoutqa-answers", run_dir)
    before = (run_dir / "answers" / "results.jsonl").read_bytes()
    grader = ScriptedClient({"judge": "Same ports.\nC"}, model="grader", check_constraints=False)
    data = Path("tests/fixtures/runs-v2/data")
    options = FanoutOptions(input=data / "dev.json", answers=data / "answers.json", judge=True)
    request = RunRequest(
        EvaluatorConfig(model="answerer", endpoint="http://127.0.0.1:9/v1", concurrency=2),
        RunConfig(run_dir=run_dir, cache=None),
        options,
        {
            "judge": RoleSpec.model_validate(
                {"model": "grader", "endpoint": "http://127.0.0.1:9/v1"}
            )
        },
    )
    outcomes = execute(
        FANOUTQA, request, quiet=True, open_client=lambda ev, d: fixed_client(grader)
    )
    assert grader.calls == []
    assert (run_dir / "answers" / "results.jsonl").read_bytes() == before
    manifest = read_manifest(run_dir / "answers" / "manifest.json")
    assert len(manifest.resumed_at) == 1
    assert outcomes["answers"].summary.recorded == 2
    assert read_study(run_dir).runs == ["answers"]
    # made before inputs were known by content: it says so, and knows them by content from now
    assert manifest.inputs_fingerprinted is False and manifest.fingerprinted_since is not None
    assert manifest.inputs is not None and set(manifest.inputs) == {"input", "answers"}
    assert manifest.config["content"]["inputs"]["answers"] == manifest.inputs["answers"]["sha256"]
    shown = CliRunner().invoke(app, ["report", str(run_dir / "answers"), "--json"])
    provenance = json.loads(shown.output.splitlines()[0])["provenance"]
    assert provenance["fingerprinted"] is False and "before" in provenance["note"]

    # a later change of an input is now refused by name
    changed = tmp_path / "answers.json"
    changed.write_text(json.dumps(json.loads((data / "answers.json").read_text())[::-1]))
    moved = request.options.model_copy(update={"answers": changed})
    with pytest.raises(RunStoreError, match="input answers"):
        execute(
            FANOUTQA,
            RunRequest(request.evaluator, request.run, moved, request.roles),
            quiet=True,
            open_client=lambda ev, d: fixed_client(grader),
        )


def test_the_previous_versions_report_says_its_inputs_were_not_fingerprinted(tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(FIXTURE, copy)
    out = CliRunner().invoke(app, ["report", str(copy / "fanoutqa-answers" / "answers"), "--json"])
    provenance = json.loads(out.output.splitlines()[0])["provenance"]
    assert provenance == {
        "fingerprinted": False,
        "inputs": [],
        "models": provenance["models"],
        "note": "made before inputs and models were fingerprinted: they are known by name",
    }
    assert {m["role"] for m in provenance["models"]} == {"judge"}


def test_a_record_of_another_format_or_broken_is_refused_in_one_line(tmp_path):
    from groundcover.pipelines.runtime.store.run_dir import RunStoreError

    run_dir = tmp_path / "run"
    shutil.copytree(RUNS[0], run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps(manifest | {"items": "many"}))
    with pytest.raises(RunStoreError, match=r"manifest.json: corrupt manifest: items"):
        read_manifest(run_dir / "manifest.json")
    (run_dir / "summary.json").write_text('{"framework": "fanoutqa"}')
    with pytest.raises(RunStoreError, match=r"summary.json: corrupt summary: task"):
        read_summary(run_dir)
