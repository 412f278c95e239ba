"""GaRAGe: metric functions by hand, loader errors, and the pipeline on the real tiny server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.garage.data import citations, load_records, quality_band
from groundcover.pipelines.garage.framework import attribution, breakdowns, sentences, summarise
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "garage.jsonl"
# the examples are published-shape rows: their ids are the sample_id UUIDs
G1_ID, G2_ID = (json.loads(line)["sample_id"] for line in EXAMPLES.read_text().splitlines())


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("A [1]. B [2, 3]. C [3][4].", 5, {1, 2, 3, 4}),
        ("Full-width 【2】 and spaced [ 1 ]", 5, {2}),  # "[ 1 ]" is not a marker
        ("Out of range [9] and [0].", 3, set()),
        ("Year [2024] is not a passage", 3, set()),
        ("No markers at all.", 3, set()),
        ("[1,2,2]", 2, {1, 2}),
    ],
)
def test_citation_parsing(text, n, expected):
    assert citations(text, n) == expected


def test_attribution_by_hand():
    assert attribution({1, 2, 3}, {2, 3, 4, 5}) == {
        "precision": pytest.approx(2 / 3),
        "recall": 0.5,
        "f1": pytest.approx(4 / 7),
    }
    assert attribution(set(), {1}) == {"precision": None, "recall": 0.0, "f1": None}
    assert attribution({1}, {2}) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert attribution({1}, set())["recall"] is None  # nothing to recall: undefined, not 0


def test_sentences_drop_markers():
    text = "The tower is 330 m tall [1]. It opened in 1889 [2, 3]! Really? Yes 【1】."
    assert sentences(text) == ["The tower is 330 m tall.", "It opened in 1889!", "Really?", "Yes."]


def test_quality_bands():
    assert [quality_band(x) for x in (0.0, 0.32, 1 / 3, 0.5, 2 / 3, 0.7, 1.0)] == [
        "<33%",
        "<33%",
        "33-66%",
        "33-66%",
        "33-66%",
        ">66%",
        ">66%",
    ]


def record(expects, deflected, eligible=True, factual=True, raf=True, dims=None):
    d = {
        "expects_deflection": expects,
        "deflected": deflected,
        "dimensions": dims or {"domain": "Arts"},
        "grounding_quality": ">66%",
        "attribution": {"precision": 1.0, "recall": 0.5, "f1": 2 / 3},
    }
    if not expects:
        d |= {
            "eligible": eligible,
            "unadjusted_factual": factual,
            "factual": eligible and factual,
            "uraf_factual": raf,
            "raf": eligible and raf,
        }
    score = float(deflected) if expects else float(eligible and raf)
    return ItemResult(id="x", status="ok", score=score, explanation="by hand", details=d)


UNPARSEABLE = ItemResult(
    id="u",
    status="unparseable",
    explanation="judge",
    details={"expects_deflection": False},
    failure=StageFailure(stage="eligibility", error="no label"),
)


def test_summary_by_hand():
    records = [
        record(False, False, eligible=True, factual=True, raf=False),
        record(False, True, eligible=False, factual=True, raf=True),
        record(False, False, eligible=True, factual=False, raf=False),
        record(True, True),
        record(True, False),
        UNPARSEABLE,
    ]
    summary = summarise(records)
    t2 = summary["table2"]
    assert t2["n"] == 3
    assert t2["eligibility"] == pytest.approx(2 / 3)
    assert t2["unadjusted_factuality"] == pytest.approx(2 / 3)
    assert t2["factuality"] == pytest.approx(1 / 3)  # eligible and factual: only the first
    assert t2["uRAF"] == pytest.approx(1 / 3) and t2["RAF"] == 0.0
    assert summary["table3"] == {
        "n_deflection_items": 2,
        "true_positive_rate": 0.5,
        "n_answerable_items": 3,
        "false_positive_rate": pytest.approx(1 / 3),
    }
    assert summary["table4"]["recall"] == 0.5
    assert summary["not_scored"] == {"unparseable": 1}


def test_breakdowns_group_by_dimension_and_quality():
    records = [
        record(False, False, dims={"domain": "Arts"}),
        record(False, True, dims={"domain": "Law"}),
    ]
    groups = breakdowns(records)
    assert set(groups["domain"]) == {"Arts", "Law"}
    assert groups["domain"]["Law"]["table3"]["false_positive_rate"] == 1.0
    assert set(groups["grounding_quality"]) == {">66%"}


def test_loader_on_examples_and_errors(tmp_path):
    records = load_records(EXAMPLES)
    assert [r.expects_deflection for r in records] == [False, True]
    assert records[0].human_citations == {1, 2}
    assert records[1].dimension("source") == "Private"
    assert records[1].dimension("source_tag") == "sec"
    assert records[0].dimension("domain") == "Arts"
    row = json.loads(EXAMPLES.read_text().splitlines()[0])
    bad = tmp_path / "g.jsonl"
    for change, message in [
        ({"evidence_relevant": [True]}, "evidence_relevant has 1 labels for 3"),
        ({"evidence_correct": ["GREAT", "UNKNOWN", "UNKNOWN"]}, "label 'GREAT' is not one of"),
        ({"evidence_cited": [7]}, "outside 1..3"),
        ({"evidence_relevant": ["maybe", True, False]}, "relevance label 'maybe'"),
        ({"grounding": "text"}, "field grounding"),
    ]:
        bad.write_text(json.dumps(row | change) + "\n")
        with pytest.raises(UserError, match=message):
            load_records(bad)


@pytest.mark.engine
def test_eval_garage_end_to_end(vllm_server, tmp_path):
    from groundcover.pipelines.cli import app

    args = [
        "eval",
        "garage",
        str(EXAMPLES),
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--max-tokens",
        "40",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
    ]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = {
        json.loads(x)["id"]: json.loads(x)
        for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    }
    assert set(results) == {G1_ID, G2_ID}
    answerable = results[G1_ID]
    if answerable["status"] == "ok":
        details = answerable["details"]
        assert details["eligibility"] in {"No Issues", "Minor Issue(s)", "Major Issue(s)"}
        for s in details["sentences"]:
            assert s["all"] in {
                "supported",
                "unsupported",
                "contradictory",
                "no attribution needed",
            }
        assert answerable["score"] == float(details["raf"])
        assert "deflected" in details and "attribution" in details
    else:
        assert answerable["status"] in {"abstained", "unparseable"}
    assert "eligibility" not in results[G2_ID]["details"]  # deflection items: deflection only
    tables = json.loads((tmp_path / "run" / "tables.json").read_text())
    assert {"table2", "table3", "table4", "breakdowns"} <= set(tables)
    assert tables["n"] == 2


def test_precision_recall_f1_from_counts_by_hand():
    """The one helper behind GaRAGe's attribution and the claims evaluation: matched predicted
    and matched gold counted apart (claims eval: 2 of 4 predicted claims match, 3 of 5 gold)."""
    from groundcover.stats import precision_recall_f1

    got = precision_recall_f1(2, 4, 3, 5)
    assert got["precision"] == 0.5 and got["recall"] == 0.6
    assert got["f1"] == pytest.approx(2 * 0.5 * 0.6 / 1.1)  # 0.5454...
    assert precision_recall_f1(0, 3, 0, 2) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert precision_recall_f1(0, 0, 1, 2) == {"precision": None, "recall": 0.5, "f1": None}
