"""The HTML report in a real headless Chromium (Debian's `chromium`, installed by setup.sh): the
page loads without console errors, shows the summary and the plot, and clicking an item (through
the page's #item= link, which clicks that row) opens its drill-down with the right statements;
model output stays text. A screenshot is kept as a test artifact."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from groundcover.pipelines.reports.pages.report_html import write_html
from tests.test_report_html import make_run

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no chromium: ./setup.sh installs Debian's chromium (apt, as root)"
)
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def chromium(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_in_a_real_browser(tmp_path):
    page = write_html([make_run(tmp_path, "run")], tmp_path / "report.html")
    url = page.resolve().as_uri()
    loaded = chromium(url, "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    dom = loaded.stdout
    console = [line for line in loaded.stderr.splitlines() if ":CONSOLE(" in line]
    assert not [line for line in console if "rror" in line or "Uncaught" in line], console
    assert 'class="summary"' in dom and "<svg" in dom  # summary table and plot are on the page
    assert '<tr data-id="a">' in dom and '<tr data-id="b">' in dom  # rows drawn by the script
    # Clicking item a opens its drill-down: its covered and uncovered statements.
    opened = chromium(url + "#item=a", "--dump-dom").stdout
    drill = opened[opened.index('id="drill-0"') :]
    assert "Item a" in drill and "<li>In Paris</li>" in drill and "<li>In Lyon</li>" in drill
    # Item b's statement is a script tag written by the model: shown as text, never run.
    evil = chromium(url + "#item=b", "--dump-dom").stdout
    assert "&lt;/script&gt;&lt;script&gt;alert" in evil
    assert "<script>alert" not in evil
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    taken = chromium(url + "#item=a", f"--screenshot={shot}", "--window-size=1200,1600")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000


def test_fact_graph_is_drawn_in_the_drill_down(tmp_path):
    import json

    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.support.scripted import ScriptedClient
    from tests.test_paper_protocol import ITEM, QA_SCRIPTS
    from tests.test_runtime import run

    data = tmp_path / "items.jsonl"
    data.write_text(json.dumps(ITEM.model_dump()) + "\n")
    options = ComprehensivenessOptions(input=data, method="qa")  # graphs exported by default
    run(COMPREHENSIVENESS, options, ScriptedClient(QA_SCRIPTS), tmp_path / "qa")
    page = write_html([tmp_path / "qa"], tmp_path / "qa.html")
    dom = chromium(page.resolve().as_uri() + "#item=t", "--dump-dom").stdout
    graph = dom[dom.index('class="fact-graph"') :]
    graph = graph[: graph.index("</svg>")]
    # The Q&A paper case of test_paper_protocol: five answers are the nodes (two from the
    # response, one from text 1, two from text 2), edges are the entailments between them.
    assert graph.count("<circle") == 5
    assert ">covered<" in graph and ">uncovered<" in graph and "<line" in graph


# Measures the page as laid out in the browser: the test adds it to a copy of the page, the
# page itself carries no test code. Its results land in the DOM that --dump-dom prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height}; };
  document.body.setAttribute("data-probe", JSON.stringify({
    viewport: window.innerHeight, scrolled: window.scrollY,
    headline: box("#run-0 .headline"), compare: box("section.compare"),
    deltas: document.querySelectorAll(".compare-deltas a").length,
    manifestOpen: document.querySelector("details.manifest").open,
  }));
});
</script>"""


def probe(page: Path, tmp_path: Path, *extra: str) -> tuple[dict, str, list[str]]:
    import html
    import json
    import re

    probed = tmp_path / ("probed-" + page.name)
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    loaded = chromium(probed.resolve().as_uri(), "--dump-dom", "--window-size=1280,800", *extra)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', loaded.stdout)
    assert found, "the probe did not run"
    errors = [
        line
        for line in loaded.stderr.splitlines()
        if ":CONSOLE(" in line and ("rror" in line or "Uncaught" in line)
    ]
    return json.loads(html.unescape(found.group(1))), loaded.stdout, errors


def test_headline_is_seen_first_and_the_manifest_is_folded(tmp_path):
    page = write_html([make_run(tmp_path, "run")], tmp_path / "report.html")
    measured, dom, errors = probe(page, tmp_path)
    assert not errors, errors
    headline = measured["headline"]
    # the whole headline block lies within the first screen, without scrolling
    assert measured["scrolled"] == 0 and 0 < headline["top"] < headline["bottom"] <= 800
    assert not measured["manifestOpen"]
    block = dom[dom.index('class="headline"') :]
    block = block[: block.index("</div>")]
    # items a and b score 0.5 and 1.0 (test_report_html): mean 0.75 over 2 of 2
    assert "0.7500" in block and "over 2 scored of 2 recorded" in block
    assert "ok 2" in block and "judge: <b>judge</b>" in block


def test_compare_view_is_drawn_above_the_runs(tmp_path):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from tests.test_report_html import OUTPUTS

    other = dict(OUTPUTS) | {
        "Paris.": "x\n[Covered statements]\n- In Paris [1]\n- In Lyon [2]\n[Uncovered statements]\n"
    }
    one, two = make_run(tmp_path, "one"), make_run(tmp_path, "two", outputs=other)
    page = tmp_path / "compare.html"
    out = CliRunner().invoke(app, ["compare", str(one), str(two), "--html", str(page)])
    assert out.exit_code == 0, out.output
    measured, dom, errors = probe(page, tmp_path)
    assert not errors, errors
    assert measured["compare"]["top"] < measured["headline"]["top"]
    assert measured["compare"]["top"] < 800 and measured["deltas"] == 4  # 2 items x 2 runs
    # following the link of item a in run two opens run two's drill-down of item a
    opened = chromium(page.resolve().as_uri() + "#item=1:a", "--dump-dom").stdout
    drill = opened[opened.index('id="drill-1"') :]
    assert "Item a" in drill and "<li>In Lyon</li>" in drill
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "compare.png"
    taken = chromium(page.resolve().as_uri(), f"--screenshot={shot}", "--window-size=1280,900")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000
