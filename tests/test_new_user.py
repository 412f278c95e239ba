"""Small things a new user hit, each tried as they tried it: `report RUN --html` with no path,
`evaluate(..., quiet=True)`, `view` and `agreement` given the study directory they passed as
--run-dir, non-ASCII text in the inspect export, the labelling page used before a name is given,
and a unit judged per passage shown with its passage."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

import groundcover
from groundcover.pipelines.cli import app
from groundcover.pipelines.crux.framework import CRUX
from groundcover.pipelines.reports.pages.viewer import Viewer, make_server
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.browser import BROWSER, browser
from tests.support.scripted import ScriptedClient, field_of
from tests.test_crux import TEXTS, crux_options, write_crux
from tests.test_labels import judged_run
from tests.test_panels import panel_run
from tests.test_runtime import FANOUT, FANOUT_SCRIPTS, closing_client


def fanout_study(tmp_path: Path) -> Path:
    """A FanOutQA study root (the --run-dir a user gives), holding its closed-book run."""
    panel_run(tmp_path / "study", ["j1", "j2"])
    return tmp_path / "study" / "run"


def test_report_html_without_a_path_writes_the_page_beside_the_run(tmp_path):
    root = fanout_study(tmp_path)
    for args in (["report", str(root), "--html"], ["report", "--html", str(root)]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        page = root.parent / "run.html"
        assert f"html: {page}" in out.output  # where it went, on one line
        assert page.is_file() and "FanOutQA" in page.read_text()
        page.unlink()
    named = tmp_path / "named.html"
    out = CliRunner().invoke(app, ["report", str(root), "--html", str(named), "--json"])
    assert out.exit_code == 0 and named.is_file()


def test_evaluate_quietly_prints_nothing(tmp_path, capfd):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    client = ScriptedClient(FANOUT_SCRIPTS, check_constraints=False)
    done = groundcover.evaluate(
        "fanoutqa",
        options={"input": str(data), "judge": True},
        evaluator={"model": "judge", "endpoint": "http://127.0.0.1:9/v1"},
        run={"run_dir": str(tmp_path / "run"), "cache": None},
        client=client,
        quiet=True,
    )
    printed = capfd.readouterr()
    assert (printed.out, printed.err) == ("", "")
    assert done.runs["closed-book"].tables["n"] == 3
    assert "run directory:" in done.log and "self-judging" in done.log  # kept, not lost


def test_agreement_and_view_read_a_study_directory(tmp_path):
    root = fanout_study(tmp_path)
    out = CliRunner().invoke(app, ["agreement", str(root), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["runs"][0]["run"].endswith("closed-book")
    view = subprocess.Popen(
        [sys.executable, "-m", "groundcover", "view", str(root), "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        assert view.stderr is not None
        while "report at" not in line:
            line = view.stderr.readline()
            assert line or view.poll() is None, "view exited"
        url = line.split("report at ")[1].split()[0]
        with urllib.request.urlopen(url + "api/queue?run=0&stage=judge&annotator=a") as r:
            queue = json.loads(r.read())
        assert queue["run"].endswith("closed-book") and len(queue["items"]) == 2
    finally:
        view.terminate()
        view.wait(10)


def test_the_inspect_export_writes_text_as_text(tmp_path):
    pytest.importorskip("inspect_ai.log", reason="inspect_ai not installed")
    data = tmp_path / "dev.json"
    data.write_text(
        json.dumps([{"id": "p1", "question": "Who wrote it?", "answer": ["Saint-Exupéry"]}])
    )
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"id": "p1", "answer": "Antoine de Saint-Exupéry."}]))
    args = ["eval", "fanoutqa", "--data", str(data), "--answers", str(answers)]
    out = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "r"), "--quiet"])
    assert out.exit_code == 0, out.output
    log = tmp_path / "run.json"
    exported = CliRunner().invoke(app, ["report", str(tmp_path / "r"), "--export", str(log)])
    assert exported.exit_code == 0, exported.output
    text = log.read_text(encoding="utf-8")
    assert "Saint-Exupéry" in text and "\\u00e9" not in text


@pytest.mark.skipif(BROWSER is None, reason="no chromium: ./setup.sh installs Debian's chromium")
def test_the_labelling_page_asks_for_a_name_before_a_label(tmp_path):
    run = judged_run(tmp_path)
    viewer = Viewer([run])
    server = make_server(viewer, "127.0.0.1", 0, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    async def press() -> str:
        async with browser() as page:
            await page.navigate(f"{base}/label?run=0")
            await page.wait_for(["annotator"])
            for key in ("1", "n"):
                await page.key(key)
            await page.evaluate("document.querySelector('#scale button').click()")
            return await page.wait_for(["give your name first"])

    try:
        shown = asyncio.run(press())
    finally:
        server.shutdown()
        server.server_close()
    assert "Cannot read" not in shown and "undefined" not in shown
    assert not (run / "labels" / "labels.jsonl").exists()


def test_a_unit_judged_per_passage_shows_its_passage(tmp_path):
    """CRUX rated by a panel of two: each rating unit is one passage against one sub-question;
    its labelling unit carries that passage and question, not only the topic."""
    paths = write_crux(tmp_path)
    rates = {"r1": {"Q0?": "4", "Q1?": "2", "Q2?": "0"}, "r2": {"Q0?": "5", "Q1?": "2", "Q2?": "1"}}
    clients = {
        name: ScriptedClient(
            {s: (lambda p, r=r: r[field_of(p, "Question")]) for s in ("rate", "rate#2")},
            check_constraints=False,
            model=name,
        )
        for name, r in rates.items()
    }
    url = "http://127.0.0.1:9/v1"
    request = RunRequest(
        EvaluatorConfig(model="r1", endpoint=url),
        RunConfig(run_dir=tmp_path / "run", cache=None),
        crux_options(paths),
        {
            "rate": RoleSpec.model_validate(f"r1@{url}"),
            "rate#2": RoleSpec.model_validate(f"r2@{url}"),
        },
    )
    outcome = execute(
        CRUX, request, quiet=True, open_client=lambda ev, d: closing_client(clients[ev.model])
    )[""]
    viewer = Viewer([outcome.dir])
    units = viewer.queue(0, "ana", "rate")["items"]
    assert [(u["id"], u["key"]) for u in units] == [("t1", 0), ("t1", 1), ("t1", 2)]
    shown = [viewer.unit(0, "t1", "rate", k)["judged"] for k in range(3)]
    assert {s["text"] for s in shown} == {TEXTS["p4"]}  # the unrated passage p4, rated thrice
    assert sorted(s["question"] for s in shown) == ["Q0?", "Q1?", "Q2?"]
    assert "judged" not in viewer.unit(0, "t1")  # the item alone: no unit
