"""``groundcover compare``: paired differences, intervals, win/tie/loss and tests worked out by
hand on small run directories; refused pairs; the HTML view linked to each run's drill-down."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.compare import compare_runs
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
from groundcover.pipelines.runtime.stats import paired_test
from groundcover.pipelines.runtime.store.run_dir import RunStore

# A: i5 unparseable, i6 only here. B: i7 only here. Both scored: i1 i2 i3 i4 i8.
A = {"i1": 1.0, "i2": 0.5, "i3": 0.0, "i4": 0.75, "i5": None, "i6": 0.2, "i8": 0.3}
B = {"i1": 0.5, "i2": 0.5, "i3": 0.25, "i4": 0.0, "i5": 0.4, "i7": 0.9, "i8": 0.2}


def write_run(path, scores, framework="comprehensiveness", options=None):
    store = RunStore(path)
    store.open(
        framework=framework,
        task=framework,
        config={"run": str(path)},
        options=options or {"protocol": "paper"},
        items=len(scores),
        roles={"judge": {"request_model": f"model-{path.name}"}},
    )
    for item_id, score in scores.items():
        if score is None:
            failure = StageFailure(stage="coverage", error="no list", outputs=["?"])
            store.append(
                ItemResult(id=item_id, status="unparseable", explanation="x", failure=failure)
            )
        else:
            store.append(ItemResult(id=item_id, status="ok", score=score, explanation="x"))
    store.close()
    return path


def test_paired_comparison_by_hand(tmp_path):
    a, b = write_run(tmp_path / "a", A), write_run(tmp_path / "b", B)
    result = compare_runs([a, b], resamples=2000, seed=1)
    run_a, run_b = result["runs"]
    assert run_a["scored"] == 6 and run_a["mean"] == pytest.approx(2.75 / 6)
    assert run_a["unscored"] == {"unparseable": 1} and run_a["recorded"] == 7
    assert run_b["scored"] == 7 and run_b["mean"] == pytest.approx(2.75 / 7)
    assert run_a["only_here"] == ["i6"] and run_b["only_here"] == ["i7"]
    assert run_a["models"] == {"judge": "model-a"}
    (pair,) = result["pairs"]
    # d = A - B over i1 i2 i3 i4 i8 = 0.5, 0, -0.25, 0.75, 0.1
    assert pair["paired"] == 5
    assert pair["unpaired"] == {"i5": {"a": "unparseable", "b": "scored"}}
    test = pair["test"]
    assert test["mean_difference"] == pytest.approx(1.1 / 5)
    assert (test["wins"], test["ties"], test["losses"]) == (3, 1, 1)
    # sign test: 3 wins of 4 untied -> 2 * P(X >= 3 | n=4, 1/2) = 2 * 5/16
    assert test["sign_p"] == pytest.approx(10 / 16)
    # Wilcoxon on 0.5, -0.25, 0.75, 0.1: ranks 3, 2, 4, 1 -> W- = 2; P(W- <= 2) = 3/16, twice
    assert test["wilcoxon_p"] == pytest.approx(6 / 16)
    assert [d["id"] for d in pair["deltas"]] == ["i4", "i1", "i3", "i8", "i2"]
    assert pair["deltas"][0] == {"id": "i4", "a": 0.75, "b": 0.0, "delta": 0.75}
    # the interval is scipy's paired BCa of the mean difference (pairs resampled together)
    xs, ys = (
        [A[i] for i in ("i1", "i2", "i3", "i4", "i8")],
        [B[i] for i in ("i1", "i2", "i3", "i4", "i8")],
    )
    ref = stats.bootstrap(
        (np.array(xs), np.array(ys)),
        lambda x, y, axis=-1: np.mean(x - y, axis),
        paired=True,
        n_resamples=2000,
        method="BCa",
        random_state=np.random.default_rng(1),
    ).confidence_interval
    assert test["interval"]["low"] == pytest.approx(ref.low)
    assert test["interval"]["high"] == pytest.approx(ref.high)
    assert -0.25 <= test["interval"]["low"] < 0.22 < test["interval"]["high"] <= 0.75


def test_identical_runs_tie_everywhere(tmp_path):
    scores = {"x": 0.5, "y": 1.0}
    test = compare_runs(
        [write_run(tmp_path / "a", scores), write_run(tmp_path / "b", scores)], resamples=200
    )["pairs"][0]["test"]
    assert (test["wins"], test["ties"], test["losses"]) == (0, 2, 0)
    assert test["mean_difference"] == 0 and test["sign_p"] is None and test["wilcoxon_p"] is None
    assert (test["interval"]["low"], test["interval"]["high"]) == (0, 0)


def test_paired_test_rejects_unpaired_lists():
    with pytest.raises(ValueError):
        paired_test([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    ("second", "framework", "options", "message"),
    [
        (B, "comprehensiveness", {"protocol": "spec"}, "protocol 'spec' differs from 'paper'"),
        (B, "garage", {"input": "x.jsonl"}, "a garage run cannot be compared"),
        ({"z": 1.0}, "comprehensiveness", None, "no item in common"),
    ],
)
def test_runs_measuring_different_things_are_refused(tmp_path, second, framework, options, message):
    a = write_run(tmp_path / "a", A)
    b = write_run(tmp_path / "b", second, framework=framework, options=options)
    with pytest.raises(UserError, match=message):
        compare_runs([a, b])
    out = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert out.exit_code == 2
    assert message in out.output and len(out.output.strip().splitlines()) == 1


def test_cli_table_and_json(tmp_path):
    a, b = write_run(tmp_path / "a", A), write_run(tmp_path / "b", B)
    out = CliRunner().invoke(app, ["compare", str(a), str(b), "--resamples", "500"])
    assert out.exit_code == 0, out.output
    assert "3/1/1" in out.output and "0.2200" in out.output and "+0.7500" in out.output
    assert "B: 1 items only in this run: i7" in out.output
    as_json = CliRunner().invoke(app, ["compare", str(a), str(b), "--json", "--resamples", "500"])
    parsed = json.loads(as_json.stdout)
    assert parsed["pairs"][0]["test"]["wins"] == 3 and parsed["framework"] == "comprehensiveness"
    assert CliRunner().invoke(app, ["compare", str(a)]).exit_code == 2


def test_html_comparison_links_to_each_runs_drill_down(tmp_path):
    from tests.test_report_html import OUTPUTS, make_run

    other = dict(OUTPUTS) | {
        "Paris.": "x\n[Covered statements]\n- In Paris [1]\n- In Lyon [2]\n[Uncovered statements]\n"
    }
    one, two = make_run(tmp_path, "one"), make_run(tmp_path, "two", outputs=other)
    page = tmp_path / "compare.html"
    out = CliRunner().invoke(
        app, ["compare", str(one), str(two), "--html", str(page), "--resamples", "200"]
    )
    assert out.exit_code == 0, out.output
    html = page.read_text()
    view = html[html.index('class="compare"') : html.index('class="run"')]
    # item a: 0.5 vs 1.0 is the largest difference, linked to each run's row of item a
    deltas = view[view.index('class="compare-deltas"') :]
    assert deltas.index('href="#item=0:a"') < deltas.index('href="#item=0:b"')
    assert 'href="#item=1:a"' in deltas and "-0.5000" in deltas
    assert "0 / 1 / 1" in view  # win / tie / loss of one - two


def test_a_study_root_of_one_run_is_that_run_and_of_several_is_refused(tmp_path):
    a, b = write_run(tmp_path / "a" / "only", A), write_run(tmp_path / "b", B)
    (tmp_path / "a" / "study.json").write_text(json.dumps({"study": "x", "runs": ["only"]}))
    result = compare_runs([tmp_path / "a", b], resamples=200)
    assert result["runs"][0]["run"] == str(a) and result["pairs"][0]["paired"] == 5
    (tmp_path / "a" / "study.json").write_text(json.dumps({"study": "x", "runs": ["only", "b"]}))
    with pytest.raises(UserError, match="a study of several runs; compare one of them"):
        compare_runs([tmp_path / "a", b])
