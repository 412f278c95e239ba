"""The mean from actively sampled labels (``agreement --sample N --strategy active``): each
item's inclusion probability from the judge's confidence (Zrnic and Candes), the cost-optimal
share given what a judgement and a label cost (Angelopoulos et al. 2025), worked out by hand;
the draw recorded with each probability; the prediction-powered mean weighted by 1 / pi, equal
to ppi_py's where the design is uniform and to the formula by hand where it is not."""

from __future__ import annotations

import json
import math

import numpy as np
import ppi_py
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.audits.agreement import ppi_mean, score_estimates
from groundcover.pipelines.reports.people.active import (
    Costs,
    capped,
    inclusion,
    systematic,
    uncertainty,
)
from groundcover.pipelines.reports.people.labels import append_labels
from groundcover.pipelines.runtime.contract.results import ItemResult
from tests.test_cascade_queue import confidence_of, many_judged

Z = 1.959963984540054


def test_inclusion_probabilities_worked_out_by_hand():
    """u = 0, 0.25, 0.25, 1 (roots 0, 0.5, 0.5, 1: shares 0, 1/4, 1/4, 1/2), 2 labels, a tenth
    spread evenly: pi = 2 (0.9 share + 0.1 / 4) = 0.05, 0.5, 0.5, 0.95. u = 1, 0, 0, 0: shares
    0.925, 0.025 x 3; 2 x 0.925 passes 1, so that item is sure and the other label is shared:
    1, 1/3, 1/3, 1/3. Costs 1 (judge) and 100 (label), judge scores' variance 0.25, u = 0.04,
    0.16, 0.36, 0.64: pi = min(1, sqrt(1 u / (100 x 0.25))) = 0.04, 0.08, 0.12, 0.16 (0.4
    expected), then a tenth of 0.4 spread: 0.046, 0.082, 0.118, 0.154."""
    assert inclusion([0, 0.25, 0.25, 1], 2, 0.25) == pytest.approx([0.05, 0.5, 0.5, 0.95])
    assert inclusion([1, 0, 0, 0], 2, 0.25) == pytest.approx([1, 1 / 3, 1 / 3, 1 / 3])
    costed = inclusion([0.04, 0.16, 0.36, 0.64], None, 0.25, Costs(judge=1, person=100))
    assert costed == pytest.approx([0.046, 0.082, 0.118, 0.154])
    # labels as cheap as judgements: min(1, 2 sqrt(u)) = 0.4, 0.8, 1, 1 (3.2), --sample 2 caps it
    cheap = inclusion([0.04, 0.16, 0.36, 0.64], 2, 0.25, Costs(1, 1))
    assert cheap.sum() == pytest.approx(2) and cheap.max() <= 1
    assert inclusion([0.3, 0.3], None, 0.0, Costs(1, 100)) == pytest.approx([1, 1])  # no spread
    assert capped(np.array([0.5, 0.25, 0.25]), 2) == pytest.approx([1, 0.5, 0.5])
    with pytest.raises(ValueError, match="costs: positive numbers"):
        Costs(0, 1)


def test_the_uncertainty_is_the_judges_least_confidence_else_its_score():
    """1 - the least confidence among the item's judgements: a lone judge's 0.9 and 0.7 give
    0.3, a panel's 2 of 3 gives 1/3, the cascade tier that kept it 0.8 gives 0.2; none: the
    score's s (1 - s), 0.25 x 0.75 = 0.1875."""
    lone = ItemResult(
        id="a",
        status="ok",
        score=1.0,
        explanation="judged",
        details={
            "confidence": [
                {"stage": "judge", "value": "B", "confidence": 0.9},
                {"stage": "judge", "value": "C", "confidence": 0.7},
            ]
        },
    )
    assert uncertainty(lone) == (pytest.approx(0.3), "confidence")
    panel = ItemResult(
        id="b",
        status="ok",
        score=1.0,
        explanation="judged",
        details={
            "panel": [
                {"stage": "judge", "members": ["B", "B", "A"], "value": "B"},
            ]
        },
    )
    assert uncertainty(panel) == (pytest.approx(1 / 3), "confidence")
    cascade = ItemResult(
        id="c",
        status="ok",
        score=1.0,
        explanation="judged",
        details={
            "cascade": [
                {
                    "stage": "judge",
                    "kept": 2,
                    "value": "B",
                    "tiers": [{"confidence": 0.4}, {"confidence": 0.8}],
                },
            ]
        },
    )
    assert uncertainty(cascade) == (pytest.approx(0.2), "confidence")
    bare = ItemResult(id="d", status="ok", score=0.25, explanation="judged", details={})
    assert uncertainty(bare) == (pytest.approx(0.1875), "score")


def test_systematic_sampling_draws_each_item_as_often_as_its_probability():
    """Probabilities 0.9, 0.6, 0.3, 0.1, 0.1 (2 expected): always 2 drawn, each item in 4,000
    seeded draws as often as its probability (within 3 binomial sigma)."""
    probabilities = np.array([0.9, 0.6, 0.3, 0.1, 0.1])
    counts = np.zeros(5)
    for seed in range(4000):
        picked = systematic(probabilities, np.random.default_rng(seed))
        assert len(picked) == 2
        counts[picked] += 1
    sigma = np.sqrt(probabilities * (1 - probabilities) / 4000)
    assert np.all(np.abs(counts / 4000 - probabilities) <= 3 * sigma + 1e-9), counts / 4000
    assert len(systematic(np.array([1.0, 0.5, 0.5]), np.random.default_rng(0))) == 2


def test_the_weighted_mean_is_ppi_pys_where_uniform_and_the_formula_where_not():
    """Labelled y = 1, 0, 1, 1 with judge 1, 1, 1, 0; unlabelled judge 1, 1, 0, 1, 1, 1. Equal
    weights: exactly ppi_py's unweighted PPI++ (tuned lambda). Weights 1, 1, 3, 3 at lambda = 1
    (normalised to mean 1: 0.5, 0.5, 1.5, 1.5): the estimate is the unlabelled mean 5/6 plus the
    weighted mean error (0.5 x 0 + 0.5 x -1 + 1.5 x 0 + 1.5 x 1) / 4 = 1/4, 13/12; the
    half-width 1.96 sqrt(var(f_u) / 6 + var(w (y - f)) / 4), population variances: var of
    (1, 1, 0, 1, 1, 1) = 5/36, of (0, -0.5, 0, 1.5) = 0.625 - 0.0625 = 9/16."""
    y, f, g = [1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 0, 1, 1, 1]
    uniform = ppi_mean(y, f, g, weights=[2, 2, 2, 2])
    low, high = ppi_py.ppi_mean_ci(
        np.array(y, float), np.array(f, float), np.array(g, float), alpha=0.05
    )
    point = ppi_py.ppi_mean_pointestimate(
        np.array(y, float), np.array(f, float), np.array(g, float)
    )
    assert uniform == pytest.approx((float(point[0]), float(low[0]), float(high[0])))
    estimate, low, high = ppi_mean(y, f, g, lam=1, weights=[1, 1, 3, 3])
    assert estimate == pytest.approx(5 / 6 + 1 / 4)
    half = Z * math.sqrt((5 / 36) / 6 + (9 / 16) / 4)
    assert (low, high) == (pytest.approx(13 / 12 - half), pytest.approx(13 / 12 + half))


def test_an_active_queue_is_drawn_recorded_and_weighs_the_mean(tmp_path):
    """30 items whose judge says B with confidence 0.5 + i / 60: `agreement --sample 10
    --strategy active --label-cost 100 --judge-cost 1` draws 10 items with probabilities from
    the judge's confidence (the least sure most often), each recorded with its inclusion
    probability and weight 1 / pi, the design in the header; the labels people give them make
    the prediction-powered mean weighted by those weights (through ppi_py)."""
    run = many_judged(tmp_path / "many")
    argv = ["agreement", str(run.dir), "--sample", "10", "--strategy", "active"]
    made = CliRunner().invoke(app, [*argv, "--label-cost", "100", "--judge-cost", "1"])
    assert made.exit_code == 0, made.output
    lines = [json.loads(x) for x in (run.dir / "labels" / "queue.jsonl").read_text().splitlines()]
    header, drawn = lines[0]["queue"], lines[1:]
    assert header["strategy"] == "active" and len(drawn) == 10
    design = header["design"]
    assert design["costs"] == {"judge": 1.0, "person": 100.0} and design["mix"] == 0.1
    assert design["uncertainty"] == ["confidence"]
    scores = np.array([r.score for r in sorted(run.results, key=lambda r: r.id)], dtype=float)
    uncertain = [1 - confidence_of(i) for i in range(30)]
    expected = inclusion(uncertain, 10, float(scores.var()), Costs(1, 100))
    by_id = {f"q{i:02d}": expected[i] for i in range(30)}
    for line in drawn:
        assert line["inclusion"] == pytest.approx(by_id[line["id"]])
        assert line["weight"] == pytest.approx(1 / by_id[line["id"]])
    assert "labels expected" in made.output
    people = [
        {"id": line["id"], "stage": "score", "key": 0, "label": 1.0, "annotator": "p"}
        | {"judge": line["judge"]}
        for line in drawn
    ]
    append_labels(run.dir, people)
    found = CliRunner().invoke(app, ["agreement", str(run.dir), "--json"])
    assert found.exit_code == 0, found.output
    score = json.loads(found.output)["runs"][0]["score"]
    assert score["weighted"] is True
    records = {r.id: r for r in run.results}
    labelled = [line["id"] for line in drawn]
    weights = {line["id"]: line["weight"] for line in drawn}
    by_hand = score_estimates(
        list(records.values()),
        {(i, "score", 0): 1.0 for i in labelled},
        weights,
    )
    assert score["ppi"] == pytest.approx(list(by_hand["ppi"]))
    rest = [records[i].score for i in sorted(records) if i not in labelled]
    direct = ppi_mean(
        [1.0] * 10,
        [records[i].score for i in labelled],
        rest,
        weights=[weights[i] for i in labelled],
    )
    assert score["ppi"] == pytest.approx(list(direct))
