"""Judge agreement, judges against humans, and the prediction-powered mean: each statistic worked
by hand on small tables, then read from a real panel run through the command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.audits.agreement import (
    Unit,
    classical_mean,
    cohen_kappa,
    krippendorff_alpha,
    ppi_mean,
    raters_agreement,
)
from groundcover.pipelines.runtime.contract.panels import Vote
from tests.test_panels import panel_run


def test_cohens_kappa_by_hand():
    # 5 of 6 agree; A says a 4 times, B 3 times: chance (4*3 + 2*3) / 36 = 1/2;
    # kappa = (5/6 - 1/2) / (1/2)
    a = ["a", "a", "b", "b", "a", "a"]
    b = ["a", "b", "b", "b", "a", "a"]
    assert cohen_kappa(a, b) == pytest.approx(2 / 3)
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    assert cohen_kappa(["a", "a"], ["a", "a"]) is None  # chance agreement is certain
    assert cohen_kappa(["a", None, "b"], ["a", "b", "b"]) == pytest.approx(1.0)  # both labelled


def test_krippendorffs_alpha_by_hand_nominal_and_ordinal():
    # nominal: coincidences o11 = 2, o12 = o21 = 1, o22 = 4; n = 8, n1 = 3, n2 = 5;
    # alpha = 1 - (n - 1) * (o12 + o21) / (2 * n1 * n2) = 1 - 7 * 2 / 30 = 8/15
    assert krippendorff_alpha([[1, 1, 2, 2], [1, 2, 2, 2]], "nominal") == pytest.approx(8 / 15)
    # ordinal over 1 < 2 < 3: o11 = 2, o23 = o32 = 2, o33 = 2; n1 = 2, n2 = 2, n3 = 4;
    # delta^2: (1,2) (4 - 2)^2 = 4, (2,3) (6 - 3)^2 = 9, (1,3) (8 - 3)^2 = 25;
    # alpha = 1 - (n - 1) * sum(o delta^2) / sum(n_c n_k delta^2) = 1 - 7 * 36 / 576 = 0.5625
    assert krippendorff_alpha([[1, 2, 3, 3], [1, 3, 3, 2]], "ordinal") == pytest.approx(0.5625)
    # a unit one rater skipped is left out, not counted as a disagreement
    assert krippendorff_alpha([[1, 1, 2, 2, 1], [1, 2, 2, 2, None]], "nominal") == pytest.approx(
        8 / 15
    )
    assert krippendorff_alpha([[1, 1], [1, 1]], "nominal") is None  # one value: undefined


def test_the_prediction_powered_mean_by_hand():
    # PPI with lambda = 1 (ppi_py's lam=1). 4 labelled items (Y, and the judge's f), 6
    # unlabelled (the judge's only): estimate = mean(f unlabelled) + mean(Y - f) = 5/6 + 0;
    # half-width = 1.96 * sqrt((5/36) / 6 + 0.5 / 4) = 1.96 * sqrt(0.148148) = 0.754390
    estimate, low, high = ppi_mean([1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 0, 1, 1, 1], lam=1)
    assert estimate == pytest.approx(5 / 6)
    half = 1.959963984540054 * math.sqrt(5 / 216 + 0.125)
    assert (low, high) == pytest.approx((5 / 6 - half, 5 / 6 + half))
    assert half == pytest.approx(0.754390, abs=1e-6)
    # a judge that is right on the labelled items: the correction is 0 and the interval the
    # unlabelled items' alone
    estimate, low, high = ppi_mean([1, 0], [1, 0], [1, 0, 1, 1], lam=1)
    assert estimate == pytest.approx(0.75)
    assert high - estimate == pytest.approx(1.959963984540054 * math.sqrt(0.1875 / 4))


def test_ppi_plus_plus_tunes_lambda_by_hand():
    # PPI++ (the default): lambda = cov(Y, f) / ((1 + n/N) var(f, all n + N items)),
    # clipped to [0, 1]; ppi_py's cov is the labelled pairs' (population), var the sample one.
    # Y = [1, 0, 1, 0], f = [1, 0, 1, 1], unlabelled g = [1, 0, 0, 1] (n = N = 4):
    # cov = (1/4) sum((Y - 1/2)(f - 3/4)) = 0.5 / 4 = 0.125; var of [f, g] = 1.875 / 7;
    # lambda = 0.125 / (2 * 1.875 / 7) = 7/30
    lam = 7 / 30
    estimate, low, high = ppi_mean([1, 0, 1, 0], [1, 0, 1, 1], [1, 0, 0, 1])
    # estimate = mean(lambda g) + mean(Y - lambda f) = lambda/2 + 1/2 - 3 lambda/4
    assert estimate == pytest.approx(0.5 - lam / 4)
    rectifier = np.array([1 - lam, 0, 1 - lam, -lam])  # Y - lambda f
    half = 1.959963984540054 * math.sqrt((lam * 0.5) ** 2 / 4 + rectifier.var() / 4)
    assert (low, high) == pytest.approx((estimate - half, estimate + half))
    assert half == pytest.approx(0.454912, abs=1e-6)
    # a judge against the humans (negative covariance) gets lambda 0: the labels' own mean
    # and interval, narrower than PPI's 0.754390 on the same data
    estimate, low, high = ppi_mean([1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 0, 1, 1, 1])
    mean, c_low, c_high = (
        0.75,
        *(0.75 + s * 1.959963984540054 * math.sqrt(0.1875 / 4) for s in (-1, 1)),
    )
    assert (estimate, low, high) == pytest.approx((mean, c_low, c_high))
    # a judge that says 1 throughout: no lambda can be tuned (zero variance), and none is
    # needed: the labels' own mean and interval, never a NaN
    estimate, low, high = ppi_mean([1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1])
    assert (estimate, low, high) == pytest.approx((mean, c_low, c_high))
    mean, low, high = classical_mean([0.0, 1.0, 1.0, 1.0])
    assert mean == 0.75 and high - mean == pytest.approx(1.959963984540054 * 0.5 / 2)


def test_ordered_labels_are_ranked_and_the_worst_disagreements_come_first():
    rule = Vote(tie="bad", order=("bad", "fair", "good"))
    units = [
        Unit("i1", "s", 0, ["good", "good", "good"]),
        Unit("i2", "s", 0, ["good", "fair", "bad"]),
        Unit("i3", "s", 0, ["fair", "fair", "good"]),
    ]
    stats = raters_agreement(units, ["a", "b", "c"], rule)
    assert stats["level"] == "ordinal" and stats["units"] == 3
    assert [d["item"] for d in stats["disagreements"]] == ["i2", "i3"]  # i1 is unanimous
    ab = stats["pairwise"][0]
    assert (ab["a"], ab["b"], ab["agree"]) == ("a", "b", 2 / 3)
    assert ab["kendall_tau"] is not None  # ranks: good 2, fair 1, bad 0
    expected = krippendorff_alpha([[2, 2, 1], [2, 1, 1], [2, 0, 2]], "ordinal")
    assert stats["alpha"] == pytest.approx(expected)


# ---- read from a real panel run --------------------------------------------------------------


def test_a_panel_runs_agreement_with_humans_and_the_three_means(tmp_path):
    panel_run(tmp_path / "p", ["j1", "j2", "j3"])
    run = tmp_path / "p" / "run" / "closed-book"
    human = tmp_path / "human.jsonl"
    rows = [
        {"id": "f1", "stage": "judge", "label": "B"},
        {"id": "f2", "stage": "judge", "label": "C"},
        {"id": "f1", "stage": "score", "label": 1.0},
        {"id": "f2", "stage": "score", "label": 1.0},
    ]
    human.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["agreement", str(run), "--human", str(human), "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)["runs"][0]
    judge = found["stages"]["judge"]
    assert (judge["units"], judge["items"], judge["level"]) == (2, 2, "nominal")
    # j1 [B, C] and j2 [B, D]: agree 1/2; chance 1/4 -> kappa (1/2 - 1/4) / (3/4) = 1/3
    j1_j2 = judge["pairwise"][0]
    assert j1_j2["a"].startswith("judge (j1)") and j1_j2["b"].startswith("judge#2 (j2)")
    assert j1_j2["agree"] == 0.5 and j1_j2["kappa"] == pytest.approx(1 / 3)
    # f2 (C, D, E) is the worst disagreement, then f1 (B, B, A)
    assert [d["item"] for d in judge["disagreements"]] == ["f2", "f1"]
    versus = judge["human"]["judges"]
    assert versus["panel"]["agree"] == 0.5  # the panel said B and D (a tie), humans B and C
    assert versus["panel"]["confusion"] == {"B": {"B": 1}, "C": {"D": 1}}
    assert versus["judge (j1)"]["agree"] == 1.0
    # scores: the judge's f1 0.5, f2 1.0, f3 0.0; humans 1.0 for f1 and f2. The humans agree
    # with each other whatever the judge says (cov(Y, f) = 0), so PPI++ tunes lambda to 0: the
    # humans' mean 1.0 with their zero-width interval (PPI's lambda = 1 would give 0.25)
    score = found["score"]
    assert score["judge"][0] == pytest.approx(0.5) and score["human"][0] == pytest.approx(1.0)
    assert score["ppi"] == pytest.approx([1.0, 1.0, 1.0])
    shown = CliRunner().invoke(app, ["agreement", str(run), "--human", str(human)])
    assert shown.exit_code == 0 and "prediction-powered" in shown.output


def test_runs_judged_by_different_models_compared_on_their_item_scores(tmp_path):
    panel_run(tmp_path / "a", ["j1"])
    panel_run(tmp_path / "b", ["j2"])
    runs = [str(tmp_path / d / "run" / "closed-book") for d in ("a", "b")]
    result = CliRunner().invoke(app, ["agreement", *runs, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert all(not run["stages"] for run in found["runs"])  # no panel in either
    across = found["across_runs"]
    # item scores: j1 passes f1 and f2 (B, C), j2 passes f1 only (B, D); f3 is 0 in both
    assert across["level"] == "interval" and across["units"] == 3
    # an item one run has not scored leaves the scores interval, and is left out of the pair
    units = [Unit("a", "score", 0, [0.5, None]), Unit("b", "score", 0, [1.0, 0.75])]
    stats = raters_agreement(units, ["x", "y"], None)
    assert stats["level"] == "interval" and stats["pairwise"][0]["units"] == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "f1", "label": "B"}', "field stage: missing"),
        ('{"id": "f1", "stage": "score", "label": "high"}', "a score label is a number"),
        ('{"id": "f1", "stage": "judge", "label": "B", "key": -1}', "field key: a whole number"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_a_bad_human_label_is_one_line_naming_file_and_field(tmp_path, line, message):
    panel_run(tmp_path / "p", ["j1", "j2"])
    human = tmp_path / "human.jsonl"
    human.write_text('{"id": "f2", "stage": "judge", "label": "C"}\n' + line + "\n")
    result = CliRunner().invoke(
        app, ["agreement", str(tmp_path / "p" / "run" / "closed-book"), "--human", str(human)]
    )
    assert result.exit_code == 2
    assert f"{human}:2: record" in result.output and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_wikicontradict_runs_against_the_labels_its_annotators_gave(tmp_path):
    """The meta-evaluation's records carry WikiContradict's grades: the label each score
    predicts (spec: exact 1 / between / 0) against them, and the mean grade three ways."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.test_runtime import WC_ROW, run, wc_client

    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="wikicontradict", method="e2e", protocol="spec", resamples=1000
    )
    run(COMPREHENSIVENESS, options, wc_client(), tmp_path / "run")
    result = CliRunner().invoke(app, ["agreement", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)["runs"][0]
    label = found["dataset_labels"]["label"]
    # S: 1, 1/2, 1, 0, none -> C, PC, C, I, -; the annotators (SPEC rule): C, PC, PC, I, C.
    # Four units have both: 3 agree; chance (2*1 + 1*2 + 1*1) / 16 -> kappa (12 - 5) / 11
    assert (label["units"], label["not_decided"], label["agree"]) == (4, 1, 0.75)
    assert label["kappa"] == pytest.approx(7 / 11)
    assert label["confusion"] == {"C": {"C": 1}, "PC": {"PC": 1, "C": 1}, "I": {"I": 1}}
    assert label["kendall_tau"] is not None  # the grades are ordered: I < PC < C
    # every item graded: the judge's mean (1 + 0.5 + 1 + 0) / 4,
    # the grades' (1 + .5 + .5 + 0 + 1) / 5
    score = found["score"]
    assert score["judge"][0] == pytest.approx(0.625) and score["human"][0] == pytest.approx(0.6)
    assert score["labelled_without_a_score"] == 1  # response 4: graded, but no S
    assert "ppi" not in score  # no unlabelled item: nothing to correct
    sampled = CliRunner().invoke(
        app, ["agreement", str(tmp_path / "run"), "--human-sample", "2", "--json"]
    )
    found = json.loads(sampled.output)["runs"][0]
    assert found["score"]["labelled"] == 2 and "ppi" in found["score"]  # 2 of 5 graded
    assert found["dataset_score_mean"][0] == pytest.approx(0.6)


def test_report_and_the_html_page_show_a_panels_agreement(tmp_path):
    from tests.test_runtime import report_json

    panel_run(tmp_path / "p", ["j1", "j2", "j3"])
    run = tmp_path / "p" / "run" / "closed-book"
    [payload] = report_json(run)
    judge = payload["agreement"]["stages"]["judge"]
    assert judge["pairwise"][0]["kappa"] == pytest.approx(1 / 3)
    shown = CliRunner().invoke(app, ["report", str(run)])
    assert shown.exit_code == 0 and "stage judge: 2 units in 2 items" in shown.output
    page = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["report", str(run), "--html", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "Judge panel agreement" in html and 'href="#item=0:f2"' in html
    # a run without a panel has no such section
    panel_run(tmp_path / "one", ["j1"])
    [single] = report_json(tmp_path / "one" / "run" / "closed-book")
    assert "agreement" not in single


def test_the_sampling_figure_draws_as_agreement_does(tmp_path):
    """scripts/fig_ppi_sampling.py on the graded WikiContradict run above: every draw labels
    exactly N items with their shipped grades; the table and the SVG are written."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.support.scripts import load_script
    from tests.test_runtime import WC_ROW, run, wc_client

    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="wikicontradict", method="e2e", protocol="spec", resamples=1000
    )
    run(COMPREHENSIVENESS, options, wc_client(), tmp_path / "run")
    figure = load_script("scripts/fig_ppi_sampling.py")
    out = tmp_path / "fig" / "ppi"
    args = [str(tmp_path / "run"), "--sizes", "2", "--seeds", "4", "--out", str(out)]
    assert figure.main(args) == 0
    found = json.loads(out.with_suffix(".json").read_text())
    assert found["meta"] == {
        "run": str(tmp_path / "run"),
        "items": 5,
        "scored": 4,
        "graded": 5,
        "seeds": 4,
    }
    assert set(found["draws"]) == {"random", "stratified", "balanced", "active"}
    for by_size in found["draws"].values():
        assert [d["labels"] for d in by_size["2"]] == [2, 2, 2, 2]
    assert out.with_suffix(".svg").read_text().lstrip().startswith("<?xml")
