"""LMR and confidence intervals on fixed scores, checked by hand; the data loaders."""

import json

import numpy as np
import pytest
from scipy import stats

from pipelines.comprehensiveness.meta import (
    bca_interval,
    cb_pair_scores,
    conflictbank_items,
    lmr_conflictbank,
    lmr_wikicontradict,
    wc_match,
    wikicontradict_items,
)
from pipelines.config import UserError
from pipelines.results import ItemResult, StageFailure
from tests.conftest import SHARED

WC = SHARED / "data" / "wikicontradict" / "humaneval-dev.jsonl"


def scored(score, meta, status=None):
    status = status or ("ok" if score is not None else "undefined")
    failure = StageFailure(stage="coverage", error="x") if status == "unparseable" else None
    return ItemResult(id="i", status=status, score=score, explanation="by hand",
                      details={"meta": meta}, failure=failure)  # fmt: skip


def rec(score, label, status=None):
    return scored(score, {"label": label}, status)


def test_wc_match_rules():
    assert wc_match(1.0, "C") and not wc_match(0.9, "C")
    assert wc_match(0.5, "PC") and not wc_match(1.0, "PC") and not wc_match(0.0, "PC")
    assert wc_match(0.0, "I") and not wc_match(0.1, "I")
    assert wc_match(None, "I") == 0  # undefined never matches


def test_lmr_wc_by_hand():
    records = [
        rec(1.0, "C"), rec(0.5, "C"),  # 1, 0
        rec(0.5, "PC"), rec(0.0, "PC"), rec(None, "PC", "undefined"),  # 1, 0, 0
        rec(0.0, "I"), rec(None, "I", "unparseable"),  # 1, 0
    ]  # fmt: skip
    result = lmr_wikicontradict(records, resamples=2000, protocol="spec")
    assert result["lmr"] == pytest.approx(3 / 7)
    assert result["n"] == 7  # failures stay in the denominator
    assert result["by_label"]["C"] == {"n": 2, "lmr": 0.5}
    assert result["by_label"]["PC"]["lmr"] == pytest.approx(1 / 3)
    assert result["by_label"]["I"]["lmr"] == 0.5
    assert result["not_scored"] == {"undefined": 1, "unparseable": 1}
    assert result["ci95"]["low"] < 3 / 7 < result["ci95"]["high"]


def test_bca_interval_is_scipys_bca():
    values = [1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0]
    ours = bca_interval(values, resamples=10_000, seed=3)
    ref = stats.bootstrap(
        (np.asarray(values, float),), np.mean, n_resamples=10_000, method="BCa",
        random_state=np.random.default_rng(3),
    ).confidence_interval  # fmt: skip
    assert (ours.low, ours.high) == pytest.approx((ref.low, ref.high))
    assert ours.low < np.mean(values) < ours.high
    assert "BCa" in ours.method


def test_bca_interval_constant_data_is_degenerate_not_nan():
    interval = bca_interval([1, 1, 1])
    assert (interval.low, interval.high) == (1.0, 1.0)
    assert "degenerate" in interval.method


def test_cb_pair_scores_by_hand():
    # Default fact: full coverage of D only and partial overall -> every strict term holds.
    perfect_rd = {"all": 0.25, "D": 1.0, "C1": 0.0, "C2": 0.0, "C3": 0.0}
    assert cb_pair_scores(perfect_rd, "RD") == (1.0, 1.0)
    perfect_rc = {"all": 0.75, "D": 0.0, "C1": 1.0, "C2": 1.0, "C3": 1.0}
    assert cb_pair_scores(perfect_rc, "RC") == (1.0, 1.0)
    # Mixed: strict 0<S<1 no (1.0), D=1 yes, C1=0 yes, C2 0.5 no, C3 None no -> 2/5.
    # lax (RD): C1<D yes, C2<D yes, C3 None no -> 2/3.
    mixed = {"all": 1.0, "D": 1.0, "C1": 0.0, "C2": 0.5, "C3": None}
    assert cb_pair_scores(mixed, "RD") == (pytest.approx(2 / 5), pytest.approx(2 / 3))


def test_lmr_conflictbank_by_hand():
    def records(sample, kind, scores):
        return [
            scored(v, {"sample": sample, "response_kind": kind, "context_set": k})
            for k, v in scores.items()
        ]

    rs = records("1", "RD", {"all": 0.25, "D": 1.0, "C1": 0.0, "C2": 0.0, "C3": 0.0})
    rs += records("1", "RC", {"all": 1.0, "D": 1.0, "C1": 0.0, "C2": 0.5, "C3": None})
    result = lmr_conflictbank(rs, resamples=1000)
    # RD: strict 1, lax 1. RC: strict = (0 + 0 + 0 + 0 + 0)/5 = 0; lax: C_X > D? none -> 0.
    assert result["strict"] == pytest.approx(0.5)
    assert result["lax"] == pytest.approx(0.5)
    assert result["lmr"] == pytest.approx(0.5)
    assert result["n_pairs"] == 2


@pytest.mark.skipif(not WC.is_file(), reason=f"shared data not found at {WC}")
def test_wikicontradict_loader_on_real_data():
    items = wikicontradict_items(WC)
    assert len(items) == 300  # 60 rows x 5 responses
    rows = [json.loads(line) for line in WC.read_text().splitlines()]
    first = items[:5]
    assert first[0].contexts == [
        rows[0]["context1_self_contained"],
        rows[0]["context2_self_contained"],
    ]
    for k, item in enumerate(first):
        raw = rows[0][f"label{k}"]
        expected = {"Correct": "C", "Partially correct": "PC", "Incorrect": "I"}[raw]
        if expected == "C" and k in (1, 2):
            expected = "PC"  # single-context rule
        assert item.meta["label"] == expected
    # The rule leaves no "C" on answer1/answer2 anywhere.
    assert not [i for i in items if i.id.endswith(("-1", "-2")) and i.meta["label"] == "C"]


def test_wikicontradict_loader_errors(tmp_path):
    bad = tmp_path / "wc.jsonl"
    bad.write_text(json.dumps({"question": "q", "context1_self_contained": "a"}) + "\n")
    with pytest.raises(UserError, match="wc.jsonl:1: field context2_self_contained"):
        wikicontradict_items(bad)
    row = {"question": "q", "context1_self_contained": "a", "context2_self_contained": "b"}
    row |= {f"answer{k}": "x" for k in range(5)} | {f"label{k}": "Correct" for k in range(5)}
    row["label3"] = "Mostly"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(UserError, match="field label3: unknown label 'Mostly'"):
        wikicontradict_items(bad)


def cb_row(**over):
    row = {
        "question": "Who founded X?", "correct_pair": "A founded X.",
        "fact_conflict_pair": "B founded X.", "default_evidence": "Records show A founded X.",
        "misinformation_conflict_evidence": "A blog says B founded X.",
        "temporal_conflict_evidence": "In 2031 B founded X.",
        "semantic_conflict_evidence": "X, founded by B, ...",
    }  # fmt: skip
    return row | over


def test_conflictbank_loader(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps(cb_row(id="s1")) + "\n")
    items = conflictbank_items(path)
    assert len(items) == 10  # 2 responses x (all + 4 single contexts)
    by_id = {i.id: i for i in items}
    assert len(by_id["s1:RD:all"].contexts) == 4
    assert by_id["s1:RC:C2"].contexts == ["In 2031 B founded X."]
    assert by_id["s1:RC:C2"].response == "B founded X."
    path.write_text(json.dumps(cb_row(temporal_conflict_evidence=None)) + "\n")
    with pytest.raises(UserError, match="cb.jsonl:1: field temporal_conflict_evidence"):
        conflictbank_items(path)
