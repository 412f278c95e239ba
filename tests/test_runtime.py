"""The runtime end to end with scripted outputs: each framework's tables by hand, and `report`
rebuilding them from a run that was interrupted midway and from the finished run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.comprehensiveness.reproduce import REPRODUCE, ReproduceOptions
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.garage.framework import GARAGE, GarageOptions
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.serving.client import EndpointError
from tests.support.scripted import Reply, ScriptedClient, by_text, field_of

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(study, options, client, run_dir: Path, concurrency: int = 4, close: bool = False):
    """``study`` run with ``client`` for every role (``close``: closed at the end, as a client
    with an HTTP session must be in the run's own event loop)."""
    evaluator = EvaluatorConfig(
        model="judge", endpoint="http://127.0.0.1:9/v1", concurrency=concurrency
    )
    request = RunRequest(evaluator, RunConfig(run_dir=run_dir, cache=None), options)
    opened = closing_client if close else fixed_client
    return execute(study, request, quiet=True, open_client=lambda ev, d: opened(client))


@contextlib.asynccontextmanager
async def closing_client(client):
    async with client:
        yield client


def report_json(path: Path) -> list[dict]:
    result = CliRunner().invoke(app, ["report", str(path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


# ---- comprehensiveness meta-evaluation: LMR on WikiContradict ---------------------------------

WC_ROW = {
    "question": "Where was the treaty signed?",
    "context1_self_contained": "The treaty was signed in Paris.",
    "context2_self_contained": "Some historians say the treaty was signed in Versailles.",
    **{f"answer{k}": f"Response number {k}." for k in range(5)},
    # answer1 is a one-context answer: its Correct becomes Partially correct (SPEC rule).
    "label0": "Correct",
    "label1": "Correct",
    "label2": "Partially correct",
    "label3": "Incorrect",
    "label4": "Correct",
}
COVERED, UNCOVERED = "[Covered statements]", "[Uncovered statements]"
WC_OUTPUTS = {  # S per response: 1, 1/2, 1, 0, unparseable
    "Response number 0.": f"x\n{COVERED}\n- Paris [1]\n- Versailles [2]\n{UNCOVERED}\n",
    "Response number 1.": f"x\n{COVERED}\n- Paris [1]\n{UNCOVERED}\n- Versailles [2]\n",
    "Response number 2.": f"x\n{COVERED}\n- Paris [1]\n- Versailles [2]\n{UNCOVERED}\n",
    "Response number 3.": f"x\n{COVERED}\n{UNCOVERED}\n- Paris [1]\n- Versailles [2]\n",
    "Response number 4.": "I will not use the format.",
}


def wc_client(fail_on: str | None = None) -> ScriptedClient:
    def coverage(prompt: str) -> Reply | str:
        response = field_of(prompt, "Answer")
        if response == fail_on:
            return Reply(error=EndpointError("http://127.0.0.1:9/v1: connection refused"))
        return WC_OUTPUTS[response]

    return ScriptedClient({"coverage": coverage}, check_constraints=False)


def test_lmr_by_hand_through_an_interrupted_and_resumed_run(tmp_path):
    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="wikicontradict", method="e2e", protocol="spec", resamples=1000
    )
    run_dir = tmp_path / "run"
    # The endpoint dies at the fourth response: three items are recorded, the run stops.
    with pytest.raises(EndpointError):
        run(COMPREHENSIVENESS, options, wc_client(fail_on="Response number 3."), run_dir, 1)
    [partial] = report_json(run_dir)
    assert partial["summary"]["recorded"] == 3 and partial["summary"]["partial"]
    # Matches: C with S=1 yes; PC with S=1/2 yes; PC with S=1 no -> 2/3.
    assert partial["tables"]["lmr"] == pytest.approx(2 / 3)
    assert partial["tables"]["by_label"] == {"C": {"n": 1, "lmr": 1.0}, "PC": {"n": 2, "lmr": 0.5}}

    client = wc_client()
    outcome = run(COMPREHENSIVENESS, options, client, run_dir)[""]
    assert len(client.calls) == 1 + 3  # only the missing items: one answer, one unparseable x3
    # Adds: I with S=0 yes; C unparseable no (stays in the denominator) -> 3/5.
    lmr = json.loads((run_dir / "lmr.json").read_text())
    assert lmr["lmr"] == pytest.approx(3 / 5) and lmr["n"] == 5
    assert lmr["by_label"] == {
        "C": {"n": 2, "lmr": 0.5},
        "PC": {"n": 2, "lmr": 0.5},
        "I": {"n": 1, "lmr": 1.0},
    }
    assert lmr["not_scored"] == {"unparseable": 1}
    assert outcome.tables == lmr
    [finished] = report_json(run_dir)
    assert finished["tables"] == lmr
    assert finished["summary"]["statuses"] == {
        "ok": 4,
        "unparseable": 1,
        "undefined": 0,
        "abstained": 0,
        "error": 0,
        "cut_in_reasoning": 0,
        "unjudged": 0,
    }


# ---- comprehensiveness meta-evaluation: ConflictBank as the paper ran it -----------------------

CB_ROW = {
    "question": "Who founded X?",
    "default_claim": "A founded X.",
    "misinformation_conflict_claim": "B founded X.",
    "default_evidence": "EVIDENCE D",
    "misinformation_conflict_evidence": "EVIDENCE M",
    "temporal_conflict_evidence": "EVIDENCE T",
    "semantic_conflict_evidence": "EVIDENCE S",
}
CB_SUMMARIES = {
    "EVIDENCE D": "Sum D.",
    "EVIDENCE M": "Sum M.",
    "EVIDENCE T": "Sum T.",
    "EVIDENCE S": "Sum S.",
}
CB_OUTPUTS = {
    # Nodes by source: D 1 of 1 covered; C1 0 of 1; C2 0 of 2; C3 none (not a source).
    "A founded X.": f"x\n{COVERED}\n- A founded X [1]\n{UNCOVERED}\n- B founded X [2, 3]\n"
    "- B founded X in 2031 [3]\n",
    # D 0 of 1; C1 1 of 1; C2 1 of 1; C3 1 of 2.
    "B founded X.": f"x\n{COVERED}\n- B founded X [2, 3, 4]\n{UNCOVERED}\n- A founded X [1]\n"
    "- B was the sole founder [4]\n",
}


def test_conflictbank_strict_lax_by_hand_from_one_joint_run_per_claim(tmp_path):
    data = tmp_path / "cb.jsonl"
    data.write_text(json.dumps(CB_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="conflictbank", method="e2e", resamples=1000
    )
    scripts = {
        "summarise": lambda p: by_text(CB_SUMMARIES, field_of(p, "Background text")),
        "coverage": lambda p: CB_OUTPUTS[field_of(p, "Answer")],
    }
    client = ScriptedClient(scripts, check_constraints=False)
    run(COMPREHENSIVENESS, options, client, tmp_path / "run")
    coverage_calls = client.stage_calls("coverage")  # one joint run per claim, four texts each
    assert len(coverage_calls) == 2
    assert all("Background text #4: Sum S." in c.prompt for c in coverage_calls)
    lmr = json.loads((tmp_path / "run" / "lmr.json").read_text())
    # Default claim: S = 1/3 in (0,1), S_D = 1, S_C1 = 0, S_C2 = 0 -> strict 4 / (3 + 1) = 1;
    # lax C1 < 1, C2 < 1 -> 2 / (3 - 1) = 1.  Conflict claim: S = 1/3 yes, S_D = 0 yes,
    # S_C1 = 1 yes, S_C2 = 1 yes, S_C3 = 1/2 no -> 4/5; lax 1, 1, 1/2 > 0 -> 3/3.
    assert lmr["strict"] == pytest.approx((1 + 4 / 5) / 2)
    assert lmr["lax"] == pytest.approx(1.0)
    assert lmr["lmr"] == pytest.approx((1 + (4 / 5 + 1) / 2) / 2)
    # moderate: the same hits here (S in (0.2, 0.8); 1 and 0 are > 0.8 and < 0.2).
    assert lmr["moderate"] == pytest.approx((1 + 4 / 5) / 2)
    assert lmr["main"] == pytest.approx((1 + (4 / 5 + 1 + 4 / 5) / 3) / 2)
    assert lmr["n_claims"] == 2 and lmr["protocol"] == "paper"
    assert lmr["by_claim"]["RD"] == {"n": 1, "strict": 1.0, "lax": 1.0}
    assert lmr["by_claim"]["RC"] == {"n": 1, "strict": pytest.approx(0.8), "lax": 1.0}
    [record] = [r for r in report_json(tmp_path / "run")]
    assert record["tables"] == lmr


def test_reproduce_grid_by_hand_resumes_cell_by_cell(tmp_path):
    wc_data, cb_data = tmp_path / "wc.jsonl", tmp_path / "cb.jsonl"
    wc_data.write_text(json.dumps(WC_ROW) + "\n")
    cb_data.write_text(json.dumps(CB_ROW) + "\n")
    url = "http://127.0.0.1:9/v1"
    options = ReproduceOptions(
        models=[f"Llama-4-Maverick-17B-128E-Instruct@{url}", f"small@{url}"],
        methods=["e2e"],
        wikicontradict=wc_data,
        conflictbank=cb_data,
        metric=ComprehensivenessOptions(resamples=1000),
    )
    scripts = {
        "summarise": lambda p: CB_SUMMARIES.get(
            field_of(p, "Background text"), field_of(p, "Background text")
        ),
        "coverage": lambda p: (WC_OUTPUTS | CB_OUTPUTS)[field_of(p, "Answer")],
    }
    client = ScriptedClient(scripts, check_constraints=False)
    outcomes = run(REPRODUCE, options, client, tmp_path / "grid")
    assert set(outcomes) == {
        f"{m}/e2e/{d}"
        for m in ("Llama-4-Maverick-17B-128E-Instruct", "small")
        for d in ("wikicontradict", "conflictbank")
    }
    combined = json.loads((tmp_path / "grid" / "study.json").read_text())["combined"]
    [llama, small] = combined["rows"]
    # WikiContradict (paper thresholds): S = 1 (C) yes, 1/2 (PC) yes, 1 (PC) no, 0 (I) yes,
    # unparseable no -> 3/5. ConflictBank as in the test above: 0.95. Average (0.6 + 0.95) / 2.
    assert llama["wikicontradict"]["lmr"] == pytest.approx(0.6)
    assert llama["conflictbank"]["lmr"] == pytest.approx(0.95)
    assert llama["average"]["lmr"] == pytest.approx((0.6 + 0.95) / 2)
    assert "unpaired" in llama["average"]["ci95"]["method"]
    assert llama["paper"] == {"average": 0.8545} and "paper" not in small
    # the appendix ran Llama with the units tool; a model it did not run keeps the options
    assert llama["settings"] == {"tools": True} and small["settings"] == {}
    # A second invocation finds every cell finished: no model call.
    again = ScriptedClient(scripts, check_constraints=False)
    run(REPRODUCE, options, again, tmp_path / "grid")
    assert again.calls == []
    # report rebuilds the grid's table from disk, equal to what the study wrote.
    lines = report_json(tmp_path / "grid")
    assert lines[-1] == {"study": str(tmp_path / "grid"), "combined": combined}
    assert len(lines) == 1 + 4  # four cells, then the study


# ---- GaRAGe: Tables 2-4 ------------------------------------------------------------------------

G1 = (
    "The Eiffel Tower is 330 metres tall [1]. It was completed in 1889 [2]. Paris has bakeries [3]."
)
G2 = "I could not find that revenue in the passages."
G3 = "The tower is 330 metres tall [1]."
G1_ID, G2_ID = (
    json.loads(x)["sample_id"] for x in (EXAMPLES / "garage.jsonl").read_text().splitlines()
)
G3_ID = "5e0f9a7c-3b2d-4e1f-a6c8-0d9e8f7a6b5c"


def garage_records(tmp_path: Path) -> Path:
    rows = [json.loads(x) for x in (EXAMPLES / "garage.jsonl").read_text().splitlines()]
    third = rows[0] | {"sample_id": G3_ID, "question": "How tall is the Eiffel Tower?"}
    path = tmp_path / "garage.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, third]))
    return path


GARAGE_SCRIPTS = {
    "answer": lambda p: by_text(
        {"completed?": G1, "ACME": G2, "How tall": G3}, field_of(p, "Question")
    ),
    "deflection": lambda p: "missing" if field_of(p, "Answer") == G2 else "attempted",
    "eligibility": lambda p: (
        "No Issues" if "1889" in field_of(p, "Model answer") else "Major Issue(s)"
    ),
    "support-all": "supported",
    # Only passages 1 and 2 are relevant: the bakery sentence rests on passage 3 alone.
    "support-relevant": lambda p: (
        "unsupported" if "bakeries" in field_of(p, "Sentence") else "supported"
    ),
}


def test_garage_tables_by_hand(tmp_path):
    options = GarageOptions(input=garage_records(tmp_path))
    outcome = run(GARAGE, options, ScriptedClient(GARAGE_SCRIPTS), tmp_path / "run")[""]
    scores = {r.id: r.score for r in outcome.results}
    # g1 eligible, factual on all passages, not on the relevant ones: RAF 0. g2 deflected as
    # expected: 1. g3 factual both ways but ineligible (Major Issue): RAF 0.
    assert scores == {G1_ID: 0.0, G2_ID: 1.0, G3_ID: 0.0}
    tables = json.loads((tmp_path / "run" / "tables.json").read_text())
    assert tables["table2"] == {
        "n": 2,
        "eligibility": 0.5,
        "unadjusted_factuality": 1.0,
        "factuality": 0.5,
        "uRAF": 0.5,
        "RAF": 0.0,
    }
    assert tables["table3"] == {
        "n_deflection_items": 1,
        "true_positive_rate": 1.0,
        "n_answerable_items": 2,
        "false_positive_rate": 0.0,
    }
    # Citations vs the human ones {1, 2}: g1 {1,2,3} P 2/3 R 1 F1 0.8; g3 {1} P 1 R 1/2 F1 2/3.
    t4 = tables["table4"]
    assert (t4["precision"], t4["recall"], t4["f1"]) == pytest.approx((5 / 6, 0.75, 11 / 15))
    assert tables["breakdowns"]["domain"]["Arts"]["table2"]["n"] == 2
    [rebuilt] = report_json(tmp_path / "run")
    assert rebuilt["tables"] == tables


# ---- FanOutQA: Table 1 -------------------------------------------------------------------------

FANOUT = [
    {
        "id": "f1",
        "question": "Which French cities host the two largest ports?",
        "answer": ["Paris", "Lyon"],
    },
    {"id": "f2", "question": "When did the tower open?", "answer": "1889"},
    {"id": "f3", "question": "Is the sky blue?", "answer": True},
]
FANOUT_SCRIPTS = {
    "answer-closed-book": lambda p: by_text(
        {"French": "Paris and Marseille.", "tower": "It opened in 1889.", "sky": ""}, p
    ),
    "judge": lambda p: "Only one city matches.\nB" if "Marseille" in p else "no verdict",
}


def test_fanoutqa_table_by_hand(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    options = FanoutOptions(input=data, judge=True)
    client = ScriptedClient(FANOUT_SCRIPTS, check_constraints=False)
    outcomes = run(FANOUTQA, options, client, tmp_path / "run")
    table = outcomes["closed-book"].tables
    # loose: f1 finds 1 of 2 strings, f2 all, f3 gave no answer -> (0.5 + 1 + 0) / 3.
    assert table["loose"] == pytest.approx(0.5) and table["strict"] == pytest.approx(1 / 3)
    # Judge: f1 B (passes), f2 unreadable after re-asks, f3 not judged (no answer); a missing
    # verdict counts 0 over all questions, as in the original.
    assert table["gpt_judge"] == pytest.approx(1 / 3) and table["judge_unparseable"] == 1
    assert table["unanswered"] == 1 and table["not_scored"] == {}  # f3 scores 0, as the original
    assert len(client.stage_calls("judge")) == 1 + 3
    statuses = {r.id: (r.status, r.score) for r in outcomes["closed-book"].results}
    assert statuses == {"f1": ("ok", 0.5), "f2": ("ok", 1.0), "f3": ("abstained", 0.0)}
    study = json.loads((tmp_path / "run" / "study.json").read_text())
    rebuilt = report_json(tmp_path / "run")
    assert rebuilt[0]["tables"] == table == study["combined"]["closed-book"]
    assert rebuilt[-1]["combined"] == study["combined"]


# ---- items kept on disk --------------------------------------------------------------------------


def test_items_file_changed_mid_run_stops_it_and_restoring_it_resumes(tmp_path):
    """Items are parsed again when a worker takes them: a file edited under a running run stops
    it (what finished stays recorded) instead of answering other questions under the old id."""
    from groundcover.pipelines.runtime.store.lines import FileChanged
    from groundcover.pipelines.shared.answering import GENERATE, GenerateOptions

    items = tmp_path / "items.jsonl"
    original = "".join(json.dumps({"id": f"q{k}", "question": f"Q{k}?"}) + "\n" for k in range(4))
    items.write_text(original)

    def answer_then_edit(prompt: str) -> str:
        items.write_text(original.replace("Q3?", "Something else?"))
        return "An answer."

    options = GenerateOptions(input=items)
    with pytest.raises(FileChanged, match="items.jsonl: changed while the run was reading it"):
        run(GENERATE, options, ScriptedClient({"generate": answer_then_edit}), tmp_path / "r", 1)
    lines = (tmp_path / "r" / "results.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 and lines[0].endswith("\n") and json.loads(lines[0])["id"] == "q0"
    items.write_text(original)
    client = ScriptedClient({"generate": "Another answer."})
    outcome = run(GENERATE, options, client, tmp_path / "r", 1)[""]
    assert [r.id for r in outcome.results] == ["q0", "q1", "q2", "q3"]
    assert len(client.calls) == 3  # only what was missing


def test_auto_concurrency_reaches_the_client_and_the_summary_reports_the_limit(tmp_path):
    """--concurrency auto gives the run's client an adaptive limit up to concurrency_max; the
    summary reports each role's limit (here a scripted client's fixed one)."""
    from groundcover.pipelines.runtime.execution.models import open_evaluator

    auto = EvaluatorConfig(
        model="judge", endpoint="http://127.0.0.1:9/v1", concurrency="auto", concurrency_max=64
    )

    async def opened() -> dict:
        async with open_evaluator(auto, tmp_path, None) as client:
            return client.limit.report()

    assert asyncio.run(opened()) == {
        "mode": "auto",
        "ceiling": 64,
        "start": 8,
        "settled": 8,
        "mean": 8.0,
        "peak": 8,
        "decreases": 0,
    }
    data = tmp_path / "wc.jsonl"
    data.write_text(json.dumps(WC_ROW) + "\n")
    options = ComprehensivenessOptions(
        input=data, dataset="wikicontradict", method="e2e", protocol="spec", resamples=100
    )
    scripted = wc_client()
    run(COMPREHENSIVENESS, options, scripted, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(summary["concurrency_this_invocation"].values()) == [scripted.limit.report()]
