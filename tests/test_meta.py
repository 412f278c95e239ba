"""LMR and confidence intervals on fixed scores, checked by hand; the data loaders."""

import json

import numpy as np
import pytest
from scipy import stats

from groundcover.pipelines.comprehensiveness.meta import (
    ClaimTerms,
    bca_interval,
    cb_claim_terms,
    cb_pair_scores,
    combined_lmr,
    conflictbank_items,
    lmr_conflictbank,
    lmr_wikicontradict,
    wc_match,
    wikicontradict_items,
)
from groundcover.pipelines.comprehensiveness.rules import rules_for
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
from tests.conftest import SHARED

WC = SHARED / "data" / "wikicontradict" / "humaneval-dev.jsonl"


def scored(score, meta, status=None):
    status = status or ("ok" if score is not None else "undefined")
    failure = StageFailure(stage="coverage", error="x") if status == "unparseable" else None
    return ItemResult(
        id="i",
        status=status,
        score=score,
        explanation="by hand",
        details={"meta": meta},
        failure=failure,
    )


def rec(score, label, status=None):
    return scored(score, {"label": label}, status)


def test_wc_match_rules():
    assert wc_match(1.0, "C") and not wc_match(0.9, "C")
    assert wc_match(0.5, "PC") and not wc_match(1.0, "PC") and not wc_match(0.0, "PC")
    assert wc_match(0.0, "I") and not wc_match(0.1, "I")
    assert wc_match(None, "I") == 0  # undefined never matches


def test_lmr_wc_by_hand():
    records = [
        rec(1.0, "C"),
        rec(0.5, "C"),  # 1, 0
        rec(0.5, "PC"),
        rec(0.0, "PC"),
        rec(None, "PC", "undefined"),  # 1, 0, 0
        rec(0.0, "I"),
        rec(None, "I", "unparseable"),  # 1, 0
    ]
    result = lmr_wikicontradict(records, resamples=2000, rules=rules_for("spec"))
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
        (np.asarray(values, float),),
        np.mean,
        n_resamples=10_000,
        method="BCa",
        random_state=np.random.default_rng(3),
    ).confidence_interval
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


def test_lmr_conflictbank_spec_by_hand():
    def records(sample, kind, scores):
        return [
            scored(v, {"sample": sample, "response_kind": kind, "context_set": k})
            for k, v in scores.items()
        ]

    rs = records("1", "RD", {"all": 0.25, "D": 1.0, "C1": 0.0, "C2": 0.0, "C3": 0.0})
    rs += records("1", "RC", {"all": 1.0, "D": 1.0, "C1": 0.0, "C2": 0.5, "C3": None})
    result = lmr_conflictbank(rs, resamples=1000, rules=rules_for("spec"))
    # RD: strict 1, lax 1. RC: strict = (0 + 0 + 0 + 0 + 0)/5 = 0; lax: C_X > D? none -> 0.
    assert result["strict"] == pytest.approx(0.5)
    assert result["lax"] == pytest.approx(0.5)
    assert result["lmr"] == pytest.approx(0.5)
    assert result["n_claims"] == 2


def counts(nodes, covered):
    return {"nodes": nodes, "covered": covered}


def terms(strict, lax, moderate, n):
    return ClaimTerms(pytest.approx(strict), pytest.approx(lax), pytest.approx(moderate), n)


def test_cb_claim_terms_every_source_present_by_hand():
    ideal = {"D": counts(2, 2), "C1": counts(1, 0), "C2": counts(3, 0), "C3": counts(1, 0)}
    # S = 2/7 in (0, 1) and in (0.2, 0.8); S_D ~ 1; every S_X = 0 -> 5 of 4 + 1 for strict and
    # moderate; lax 3 of 3.
    assert cb_claim_terms(2 / 7, ideal, "RD") == terms(1, 1, 1, 4)
    # The same graph for the conflict claim: only S counts -> 1/5; S_X > S_D never -> 0.
    assert cb_claim_terms(2 / 7, ideal, "RC") == terms(1 / 5, 0, 1 / 5, 4)
    # S = 1 is no hit; C2 half covered is neither 0 (strict) nor below 0.2 (moderate), but
    # 0.5 < S_D is a lax hit.
    mixed = {"D": counts(2, 2), "C1": counts(1, 0), "C2": counts(2, 1), "C3": counts(1, 0)}
    assert cb_claim_terms(1.0, mixed, "RD") == terms(3 / 5, 1, 3 / 5, 4)


def test_cb_claim_terms_conflict_source_without_node_by_hand():
    # C3 has no node: it is not a source. RD: S in (0,1) yes, S_D = 1 yes, C1 = 0 yes,
    # C2 = 1/2 no -> 3 / (3 + 1); lax: C1 < 1 yes, C2 < 1 yes -> 2 / (3 - 1).
    sources = {"D": counts(1, 1), "C1": counts(2, 0), "C2": counts(2, 1), "C3": counts(0, 0)}
    assert cb_claim_terms(0.4, sources, "RD") == terms(3 / 4, 1, 3 / 4, 3)


def test_cb_claim_terms_default_text_is_a_source_even_without_a_node():
    # The reference reads the default's count first: D is a source with S_D = 0. RC: S = 1 no;
    # S_D = 0 yes; C1 ~ 1 yes, C2 ~ 1 yes, C3 = 1/3 no -> 3 / (4 + 1). lax S_X > 0 holds for all
    # three, over 4 - 1. moderate: S_D < 0.2, C1, C2 > 0.8 -> 3 / 5.
    sources = {"D": counts(0, 0), "C1": counts(1, 1), "C2": counts(2, 2), "C3": counts(3, 1)}
    assert cb_claim_terms(1.0, sources, "RC") == terms(3 / 5, 1, 3 / 5, 4)
    # For the default claim S_D = 0 is no hit and S_X < 0 never holds: only S counts.
    assert cb_claim_terms(0.5, sources, "RD") == terms(1 / 5, 0, 1 / 5, 4)
    # Nothing at all: the default alone (n = 1); for the conflict claim S_D = 0 is a hit.
    assert cb_claim_terms(None, {"D": counts(0, 0)}, "RD") == terms(0, 0, 0, 1)
    assert cb_claim_terms(None, {}, "RC") == terms(1 / 2, 0, 1 / 2, 1)


def test_cb_claim_terms_keep_the_1e9_order_of_full_sources():
    # S_X = covered / (nodes + 1e-9): two fully covered sources compare by their node counts.
    fewer_conflict = {"D": counts(2, 2), "C1": counts(1, 1)}
    # RD: S_C1 = 1/(1+1e-9) < 2/(2+1e-9) = S_D -> a lax hit although both are "1".
    assert cb_claim_terms(0.5, fewer_conflict, "RD") == terms(2 / 3, 1, 2 / 3, 2)
    more_conflict = {"D": counts(1, 1), "C1": counts(2, 2)}
    assert cb_claim_terms(0.5, more_conflict, "RD") == terms(2 / 3, 0, 2 / 3, 2)
    # RC: S_C1 > S_D with more conflict nodes; both still count as 1 for strict (isclose).
    assert cb_claim_terms(0.5, more_conflict, "RC") == terms(2 / 3, 1, 2 / 3, 2)


def test_cb_claim_terms_moderate_thresholds_by_hand():
    # S = 0.5 in (0.2, 0.8) but S_D = 3/4 is not > 0.8, C1 = 1/10 < 0.2 and C2 = 1/4 is not.
    sources = {"D": counts(4, 3), "C1": counts(10, 1), "C2": counts(4, 1)}
    found = cb_claim_terms(0.5, sources, "RD")
    assert found.moderate == pytest.approx(2 / 4)
    assert found.strict == pytest.approx(1 / 4)  # only S: no S_X is 0 or 1
    assert found.lax == pytest.approx(2 / 2)  # 0.1 and 0.25 < 0.75
    assert found.main == pytest.approx((2 / 4 + 1 / 4 + 1) / 3)


def test_lmr_conflictbank_paper_by_hand():
    roles = ["D", "C1", "C2", "C3"]

    def claim(kind, score, per_context, status=None):
        r = scored(score, {"sample": "1", "response_kind": kind, "roles": roles}, status)
        r.details["sources"] = per_context
        return r

    rd = claim("RD", 0.5, {"c1": counts(1, 1), "c2": counts(1, 0)})  # D, C1 only
    rc = claim("RC", None, {})  # undefined: scored 0; the default alone, S_D = 0
    result = lmr_conflictbank([rd, rc], resamples=1000)
    # rd: strict (1 + 1 + 1) / 3, lax 1 / 1, moderate (1 + 1 + 1) / 3.
    # rc: strict (0 + 1) / 2 (S_D = 0 is a hit), lax 0 / max(0, 1), moderate (0 + 1) / 2.
    assert result["strict"] == pytest.approx((1 + 1 / 2) / 2)
    assert result["lax"] == pytest.approx(1 / 2)
    assert result["lmr"] == pytest.approx(((1 + 1) / 2 + (1 / 2 + 0) / 2) / 2)
    assert result["moderate"] == pytest.approx((1 + 1 / 2) / 2)
    assert result["main"] == pytest.approx((1 + (1 / 2 + 0 + 1 / 2) / 3) / 2)
    assert result["undefined_scored_as_zero"] == 1
    assert result["default_source_without_nodes"] == 1  # rc
    assert result["single_source_lax"] == 1  # rc: lax over the default alone
    assert result["n_claims"] == 2


def test_combined_lmr_is_the_mean_of_both_with_an_unpaired_interval():
    wc = [1, 0, 1, 1, 0, 1, 1, 1]
    cb = [0.9, 0.6, 0.8, 1.0, 0.7]
    out = combined_lmr(wc, cb, resamples=2000)
    assert out["lmr"] == pytest.approx((np.mean(wc) + np.mean(cb)) / 2)
    assert out["ci95"]["low"] < out["lmr"] < out["ci95"]["high"]
    assert "unpaired" in out["ci95"]["method"]


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
        "question": "Who founded X?",
        "default_claim": "A founded X.",
        "misinformation_conflict_claim": "B founded X.",
        "default_evidence": "Records show A founded X.",
        "misinformation_conflict_evidence": "A blog says B founded X.",
        "temporal_conflict_evidence": "In 2031 B founded X.",
        "semantic_conflict_evidence": "X, founded by B, ...",
    }
    return row | over


def test_conflictbank_loader_paper_one_joint_item_per_claim(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps(cb_row()) + "\n")
    items = conflictbank_items(path)
    assert [i.id for i in items] == ["1:RD", "1:RC"]
    assert items[0].contexts == [
        cb_row()[f]
        for f in (
            "default_evidence",
            "misinformation_conflict_evidence",
            "temporal_conflict_evidence",
            "semantic_conflict_evidence",
        )
    ]
    assert items[1].response == "B founded X." and items[1].meta["roles"] == ["D", "C1", "C2", "C3"]


def test_conflictbank_loader_spec_runs_each_text_alone(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps(cb_row()) + "\n")
    by_id = {i.id: i for i in conflictbank_items(path, rules=rules_for("spec"))}
    assert len(by_id) == 10  # 2 claims x (all + 4 single texts)
    assert len(by_id["1:RD:all"].contexts) == 4
    assert by_id["1:RC:C2"].contexts == ["In 2031 B founded X."]


def test_conflictbank_sample_is_the_reference_shuffle(tmp_path):
    path = tmp_path / "cb.jsonl"
    rows = [cb_row(question=f"q{n}?") for n in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = conflictbank_items(path, limit=7)
    # HF Dataset.shuffle(seed=42) is numpy default_rng(42).permutation; the first 7 rows of it.
    chosen = np.random.default_rng(42).permutation(40)[:7]
    assert {i.query for i in items} == {f"q{n}?" for n in chosen}
    assert len(items) == 14
    assert len(conflictbank_items(path)) == 80  # fewer than 500 rows: all of them


def test_conflictbank_reads_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "cb.parquet"
    pq.write_table(pa.Table.from_pylist([cb_row(), cb_row(question="Other?")]), path)
    assert sorted({i.query for i in conflictbank_items(path)}) == ["Other?", "Who founded X?"]


def test_conflictbank_malformed_files_fail_in_one_line(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps({"question": "q", "correct_pair": "a"}) + "\n")
    with pytest.raises(UserError, match=r"cb.jsonl:1: field default_claim: missing; .*CB_qa_v2"):
        conflictbank_items(path)
    path.write_text(json.dumps(cb_row(temporal_conflict_evidence=None)) + "\n")
    with pytest.raises(UserError, match="cb.jsonl:1: field temporal_conflict_evidence"):
        conflictbank_items(path)
    fake = tmp_path / "cb.parquet"
    fake.write_text("not parquet")
    with pytest.raises(UserError, match="cb.parquet: not a readable Parquet file"):
        conflictbank_items(fake)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="empty.jsonl: no records"):
        conflictbank_items(empty)


def test_meta_eval_conflictbank_bad_file_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps({"question": "q", "correct_pair": "a"}) + "\n")
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["meta-eval", "conflictbank", "--data", str(path), "--run-dir", str(run_dir)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cb.jsonl:1: field default_claim: missing" in lines[0]
    assert not run_dir.exists()  # nothing written
