"""The HTML report from real run directories: content, escaping of model output, partial runs,
several runs side by side, exports."""

from __future__ import annotations

import contextlib
import csv
import json

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.reports.exports.export import export_runs
from groundcover.pipelines.reports.pages.report_html import render
from groundcover.pipelines.runtime.store.run_dir import RunStoreError
from groundcover.serving.client import EndpointError
from tests.support.scripted import Reply, ScriptedClient, field_of
from tests.test_runtime import run

EVIL = "</script><script>alert('x')</script><b>bold</b>"
ITEMS = [
    {"id": "a", "query": "Where?", "response": "Paris.", "contexts": ["In Paris.", "In Lyon."]},
    {"id": "b", "query": "Who?", "response": "EVIL", "contexts": ["Someone."]},
]
OUTPUTS = {
    "Paris.": "x\n[Covered statements]\n- In Paris [1]\n[Uncovered statements]\n- In Lyon [2]\n",
    "EVIL": f"x\n[Covered statements]\n- {EVIL} [1]\n[Uncovered statements]\n",
}


def make_run(tmp_path, name, fail_on=None, outputs=OUTPUTS):
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    options = ComprehensivenessOptions(
        input=data, method="e2e", summarise=False, export_graphs=False
    )

    def coverage(prompt):
        answer = field_of(prompt, "Answer")
        if answer == fail_on:
            return Reply(error=EndpointError("http://127.0.0.1:9/v1: connection refused"))
        return outputs[answer]

    client = ScriptedClient({"coverage": coverage}, check_constraints=False)
    with contextlib.suppress(EndpointError):  # the partial run stops at the dead endpoint
        run(COMPREHENSIVENESS, options, client, tmp_path / name, concurrency=1)
    return tmp_path / name


def test_page_shows_the_run_and_escapes_model_output(tmp_path):
    page = render([make_run(tmp_path, "run")])
    assert "<script>alert" not in page  # the model's script tag is never markup
    assert "\\u003c/script\\u003e\\u003cscript\\u003ealert" in page  # ... but is kept, as text
    assert 'id="data-0"' in page and "<svg" in page  # item data and the score plot
    assert "comprehensiveness" in page and "Partial run" not in page
    # the embedded item data is valid JSON holding the model's exact text
    start = page.index('id="data-0">') + len('id="data-0">')
    items = json.loads(page[start : page.index("</script>", start)])
    assert any(EVIL in json.dumps(i["details"]) for i in items)
    # self-contained: nothing is loaded from elsewhere (SVG namespaces are names, not fetches)
    assert "<script src" not in page and "<link" not in page and "@import" not in page


def test_partial_run_says_so_and_two_runs_are_compared(tmp_path):
    partial = make_run(tmp_path, "partial", fail_on="EVIL")
    page = render([partial])
    assert "Partial run: 1 of 2 items recorded." in page
    other = dict(OUTPUTS) | {
        "Paris.": "x\n[Covered statements]\n- In Paris [1]\n- In Lyon [2]\n[Uncovered statements]\n"
    }
    first, second = make_run(tmp_path, "one"), make_run(tmp_path, "two", outputs=other)
    page = render([first, second])
    # item a: 0.5 vs 1.0 -> spread 0.5000, listed first; item b: 1.0 vs 1.0
    table = page[page.index('class="comparison"') :]
    assert table.index("<td>a</td>") < table.index("<td>b</td>")
    assert "<td>0.5000</td>" in table


def test_exports_and_cli(tmp_path):
    path = make_run(tmp_path, "run")
    out, _ = export_runs([path], tmp_path / "scores.csv", "csv")
    rows = list(csv.DictReader(out.open()))
    assert [(r["id"], r["status"], r["score"]) for r in rows] == [
        ("a", "ok", "0.5"),
        ("b", "ok", "1.0"),
    ]
    parquet, _ = export_runs([path], tmp_path / "scores.parquet", "parquet")
    import pyarrow.parquet as pq

    assert pq.read_table(parquet).to_pylist()[0]["score"] == 0.5
    html = tmp_path / "report.html"
    result = CliRunner().invoke(
        app, ["report", str(path), "--html", str(html), "--export", str(tmp_path / "x.csv")]
    )
    assert result.exit_code == 0, result.output
    assert html.read_text().startswith("<!DOCTYPE html>")
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--html", str(html)])
    assert bad.exit_code == 2 and "not a run directory" in bad.output


def test_an_older_format_is_refused_in_one_line(tmp_path):
    path = make_run(tmp_path, "run")
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(manifest | {"format_version": 1}))
    with pytest.raises(RunStoreError, match="format version 1; this groundcover reads version"):
        render([path])


def test_framework_figures_lmr_and_icat_beta_sweep(tmp_path):
    from groundcover.pipelines.icat.framework import IcatOptions
    from tests.test_icat import P_ENTAIL, SCRIPTS, StandInIcat, write_inputs
    from tests.test_runtime import WC_ROW, wc_client

    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="wikicontradict", method="e2e", protocol="spec", resamples=1000
    )
    run(COMPREHENSIVENESS, options, wc_client(), tmp_path / "wc")
    page = render([tmp_path / "wc"])
    figure = page[page.index("<h3>LMR per label") :]
    assert figure.index("<svg") < figure.index("</div>")  # the bar chart is drawn inline
    assert "LMR on wikicontradict (e2e)" in page  # the same table `report` prints

    paths = write_inputs(tmp_path)
    icat = IcatOptions(
        input=paths["responses"],
        queries=paths["queries"],
        variants=["s"],
        snippets=paths["snippets"],
        nli_model="stand-in",
        betas=[0.5, 1.0, 2.0],
    )
    run(StandInIcat(P_ENTAIL), icat, ScriptedClient(SCRIPTS), tmp_path / "icat")
    page = render([tmp_path / "icat"])
    assert "<h3>ICAT_β sweep</h3>" in page


def test_garage_fanoutqa_and_crux_runs_draw_their_figures(tmp_path):
    from groundcover.pipelines.crux.framework import CRUX, CruxOptions
    from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
    from groundcover.pipelines.garage.framework import GARAGE, GarageOptions
    from tests.test_crux import write_crux
    from tests.test_runtime import FANOUT, FANOUT_SCRIPTS, GARAGE_SCRIPTS, garage_records

    garage = GarageOptions(input=garage_records(tmp_path))
    run(GARAGE, garage, ScriptedClient(GARAGE_SCRIPTS, check_constraints=False), tmp_path / "g")
    assert "<h3>GaRAGe Table 2</h3>" in render([tmp_path / "g"])
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(FANOUT))
    fanout = FanoutOptions(input=dev, judge=True)
    run(FANOUTQA, fanout, ScriptedClient(FANOUT_SCRIPTS, check_constraints=False), tmp_path / "f")
    assert "<h3>FanOutQA closed-book (Table 1 columns)</h3>" in render(
        [tmp_path / "f" / "closed-book"]
    )
    paths = write_crux(tmp_path)
    crux = CruxOptions(
        input=paths["run"],
        topics=paths["topics"],
        passages=paths["passages"],
        ratings=paths["ratings"],
        rate=False,
    )
    run(CRUX, crux, ScriptedClient({}), tmp_path / "c")
    assert "<h3>CRUX context (and answer) metrics</h3>" in render([tmp_path / "c"])


def test_score_axis_is_the_scores_range():
    from groundcover.pipelines.reports.pages.report_html import score_range

    assert score_range([1.0, 1.0, 1.0]) == (0.0, 1.0)  # not 0.5-1.5 around the one value
    assert score_range([0.25]) == (0.0, 1.0)
    assert score_range([-0.5, 1.5]) == (-0.5, 1.5)  # a score outside widens it
