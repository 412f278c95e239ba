"""Exact scores from known model outputs: every framework's scoring path, worked by hand.

The scripted client replays given outputs (and logprobs) through the real EvalClient, so
constrained-decoding regexes, parsers, re-asks, label scoring and graph logic are the production
code; each expected number below is derived in the comments.
"""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions, Item
from groundcover.pipelines.comprehensiveness.framework import evaluate_item
from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
from tests.support.scripted import Reply, ScriptedClient, by_text, field_of, label, marked

ITEM = Item(
    id="tower",
    query="How tall is the Eiffel Tower?",
    response="The Eiffel Tower is 330 metres tall. I hope this helps!",
    contexts=[
        "The Eiffel Tower is 330 metres tall including antennas. It opened in 1889. "
        "Paris has many cafes.",
        "Without antennas, the Eiffel Tower is 300 metres tall. It is taller than 250 metres.",
    ],
)
R1 = "The Eiffel Tower is 330 metres tall."
C1 = [
    "The Eiffel Tower is 330 metres tall including antennas.",
    "The Eiffel Tower opened in 1889.",
    "Paris has many cafes.",
]
C2 = [
    "The Eiffel Tower is 300 metres tall without antennas.",
    "The Eiffel Tower is taller than 250 metres.",
]


# ---- NLI-based ---------------------------------------------------------------------------------

NLI_SCRIPTS = {
    "extract": lambda p: by_text(
        {
            "I hope this helps": "- The Eiffel Tower is 330 metres tall: Fact\n"
            "- I hope this helps: Meta Statement\n",
            "It opened in 1889": "- The tower is 330 metres tall with antennas: Fact\n"
            "- It opened in 1889: Fact\n- Paris has many cafes: Fact\n",
            "Without antennas": "- It is 300 metres without antennas: Fact\n"
            "- It is taller than 250 metres: Fact\n",
        },
        field_of(p, "TEXT"),
    ),
    "revise": lambda p: by_text(
        {
            "I hope this helps": f"* {R1}\n",
            "It opened in 1889": "".join(f"* {a}\n" for a in C1),
            "Without antennas": "".join(f"* {a}\n" for a in C2),
        },
        field_of(p, "Background text"),
    ),
    # relevance: 5 | 0.5*3 + 0.5*4 = 3.5 (kept: the threshold is inclusive) | 1*0.5 + 2*0.3 +
    # 5*0.2 = 2.1 (dropped) | 4*0.6 + 5*0.4 = 4.4 | 4
    "relevance": lambda p: label(
        {
            C1[0]: {"5": 1.0},
            C1[1]: {"3": 0.5, "4": 0.5},
            C1[2]: {"1": 0.5, "2": 0.3, "5": 0.2},
            C2[0]: {"4": 0.6, "5": 0.4},
            C2[1]: {"4": 1.0},
        }[field_of(p, "Statement")]
    ),
    # r1 <-> c1.a1 are equivalent; c1.a1 -> c2.a2 (330 m entails "taller than 250 m"); the
    # rest neutral. Covered: {r1, c1.a1} and c2.a2 (by the path r1 -> c1.a1 -> c2.a2);
    # uncovered: c1.a2 and c2.a1. S = 2 / 4.
    "nli": lambda p: (
        "entailment"
        if (field_of(p, "Premise"), field_of(p, "Hypothesis"))
        in {(R1, C1[0]), (C1[0], R1), (C1[0], C2[1])}
        else "neutral"
    ),
}


async def test_nli_method_exact_score(tmp_path):
    options = ComprehensivenessOptions(protocol="spec", method="nli")
    async with ScriptedClient(NLI_SCRIPTS) as client:
        result = await evaluate_item(client, ITEM, options, nli_judge=LlmNli(), run_dir=tmp_path)
    assert result.status == "ok", result.failure
    assert result.score == 0.5
    d = result.details
    assert d["relevance"] == {"c1.a1": 5.0, "c1.a2": 3.5, "c1.a3": 2.1, "c2.a1": 4.4, "c2.a2": 4.0}
    assert d["kept_context_atoms"] == ["c1.a1", "c1.a2", "c2.a1", "c2.a2"]
    assert d["atoms"]["response"] == [R1]  # the meta statement is not an atom
    # 2 * |R| * |C| + |C| * (|C| - 1) ordered pairs, all distinct texts: each judged once.
    assert d["pairs"] == {"ordered": 20, "judged": 20, "formula": 20}
    assert len(client.stage_calls("nli")) == 20
    assert [c["text"] for c in d["covered"]] == [C1[0], C2[1]]
    assert [c["text"] for c in d["uncovered"]] == [C1[1], C2[0]]
    assert d["components"]["c1.a1"] == ["r1", "c1.a1"]
    assert result.explanation == "2 of 4 relevant context statements are covered"
    graph = json.loads((tmp_path / "graphs" / "tower.json").read_text())
    status = {n["id"]: n["status"] for n in graph["nodes"]}
    assert status == {
        "r1": "covered",
        "c1.a1": "covered",
        "c1.a2": "uncovered",
        "c2.a1": "uncovered",
        "c2.a2": "covered",
    }
    assert result.usage["nli"]["calls"] == 20 and result.usage["extract"]["calls"] == 3


async def test_nli_method_nothing_relevant_is_undefined_not_zero():
    scripts = dict(NLI_SCRIPTS, relevance=lambda p: label({"1": 1.0}))
    async with ScriptedClient(scripts) as client:
        options = ComprehensivenessOptions(protocol="spec", method="nli")
        result = await evaluate_item(client, ITEM, options, nli_judge=LlmNli())
    assert result.status == "undefined" and result.score is None
    assert client.stage_calls("nli") == []  # no context atom survived: no pair to judge


async def test_unparseable_stage_is_recorded_with_every_output():
    # An endpoint without constrained decoding that never follows the unit format: the stage is
    # asked 1 + max_reasks times, then the item is recorded unparseable with each raw output.
    scripts = dict(NLI_SCRIPTS, extract="Sure! Here are the units you asked for.")
    options = ComprehensivenessOptions(protocol="spec", method="nli", max_reasks=2)
    async with ScriptedClient(scripts, vllm_extensions=False) as client:
        result = await evaluate_item(client, ITEM, options, nli_judge=LlmNli())
    assert result.status == "unparseable" and result.score is None
    assert result.failure.stage == "extract"
    assert result.failure.outputs == ["Sure! Here are the units you asked for."] * 3
    assert "expected bullet lines" in result.failure.error
    # The re-ask sends the parse error back to the model.
    reasks = [
        c.messages
        for c in client.stage_calls("extract")
        if any(m["role"] == "assistant" for m in c.messages)
    ]
    assert reasks and all("expected bullet lines" in m[-1]["content"] for m in reasks)


# ---- Q&A-based ---------------------------------------------------------------------------------

Q1, Q2, Q3 = (
    "How tall is the Eiffel Tower?",
    "When did the Eiffel Tower open?",
    "How tall is the Eiffel Tower without antennas?",
)
QA_SCRIPTS = {
    "mine": lambda p: by_text(
        {
            "I hope this helps": f"* {Q1}\n",
            "It opened in 1889": f"* {Q1}\n* {Q2}\n",
            "Without antennas": f"* {Q3}\n",
        },
        field_of(p, "Background text"),
    ),
    # Relevance 5 | 0.6*2 + 0.4*5 = 3.2 (< 3.5: Q2 dropped) | 0.5*4 + 0.25*3 + 0.25*5 = 4.0.
    "refine": marked(
        f"* {Q1} [Relevance: 5]\n* {Q2} [Relevance: 2]\n* {Q3} [Relevance: 4]\n",
        [{"5": 1.0}, {"2": 0.6, "5": 0.4}, {"4": 0.5, "3": 0.25, "5": 0.25}],
    ),
    # Confidences (t_conf = 2): an "unknown" answer is no statement; c2's "300 metres" for Q1
    # has 0.5*2 + 0.5*1 = 1.5 and is dropped.
    "answer": lambda p: by_text(
        {
            "I hope this helps": marked(
                f"* {Q1}\nA: 330 metres [Confidence: 5]\n"
                f"* {Q3}\nA: the full height [Confidence: 3]\n",
                [{"5": 1.0}, {"3": 1.0}],
            ),
            "It opened in 1889": marked(
                f"* {Q1}\nA: 330 metres [Confidence: 4]\n* {Q3}\nA: 324 metres [Confidence: 3]\n",
                [{"4": 1.0}, {"3": 1.0}],
            ),
            "Without antennas": marked(
                f"* {Q1}\nA: 300 metres [Confidence: 2] | A: 1,083 feet [Confidence: 4]\n"
                f"* {Q3}\nA: 300 metres [Confidence: 5] | A: unknown [Confidence: 1]\n",
                [{"2": 0.5, "1": 0.5}, {"4": 1.0}, {"5": 1.0}, {"1": 1.0}],
            ),
        },
        field_of(p, "Background text"),
    ),
    "compare": lambda p: {
        "the full height - 324 metres": "Both are heights.\nthe full height - 324 metres "
        "[second implies first]",
        "the full height - 300 metres": "Different.\nthe full height - 300 metres [neutral]",
    }[field_of(p, "Answer pair")],
}


async def test_qa_method_exact_score(tmp_path):
    # Q1 (q1): r "330 metres" = c1 "330 metres" (identical text) = c2 "1,083 feet" (pint:
    # 330.1 m, within stated precision) -> one covered component.
    # Q3 (q2): c1 "324 metres" vs c2 "300 metres" differ (pint) -> contradictory; r "the full
    # height" is compared by the model: 324 m implies it (an edge into the response only), 300 m
    # is neutral -> both context answers uncovered. S = 1 / 3.
    options = ComprehensivenessOptions(protocol="spec", method="qa")
    async with ScriptedClient(QA_SCRIPTS) as client:
        result = await evaluate_item(client, ITEM, options, run_dir=tmp_path)
    assert result.status == "ok", result.failure
    assert result.score == pytest.approx(1 / 3)
    d = result.details
    assert d["questions"] == [Q1, Q3]
    assert [q["relevance"] for q in d["refined_questions"]] == [5.0, 3.2, 4.0]
    assert all(q["weighted"] for q in d["refined_questions"])
    kept = {a["id"]: a["confidence"] for a in d["answers"] if a["kept"]}
    assert kept == {
        "q1.r.1": 5.0,
        "q2.r.1": 3.0,
        "q1.c1.1": 4.0,
        "q2.c1.1": 3.0,
        "q1.c2.2": 4.0,
        "q2.c2.1": 5.0,
    }
    assert [a["confidence"] for a in d["answers"] if a["id"] == "q1.c2.1"] == [1.5]
    methods = {(c["first"], c["second"]): (c["relation"], c["method"]) for c in d["comparisons"]}
    assert methods == {
        ("q1.r.1", "q1.c1.1"): ("equivalent", "identical"),
        ("q1.r.1", "q1.c2.2"): ("equivalent", "units"),
        ("q1.c1.1", "q1.c2.2"): ("equivalent", "units"),
        ("q2.r.1", "q2.c1.1"): ("second implies first", "llm"),
        ("q2.r.1", "q2.c2.1"): ("neutral", "llm"),
        ("q2.c1.1", "q2.c2.1"): ("contradictory", "units"),
    }
    assert [c["id"] for c in d["covered"]] == ["q1.c1.1"]
    assert [c["id"] for c in d["uncovered"]] == ["q2.c1.1", "q2.c2.1"]
    assert len(client.stage_calls("compare")) == 2  # only where no rule decides


async def test_qa_confidence_falls_back_to_stated_integers_without_logprobs():
    # Same outputs without logprobs: the stated integers stand and the record says so;
    # c2's "300 metres" for Q1 now has confidence 2 >= t_conf and joins the graph, where pint
    # finds it contradicts 330 m: S = 1 / 4.
    scripts = dict(QA_SCRIPTS)
    scripts["answer"] = lambda p: Reply(QA_SCRIPTS["answer"](p).text)
    scripts["refine"] = Reply(QA_SCRIPTS["refine"].text)
    async with ScriptedClient(scripts) as client:
        result = await evaluate_item(
            client, ITEM, ComprehensivenessOptions(protocol="spec", method="qa")
        )
    d = result.details
    assert [q["relevance"] for q in d["refined_questions"]] == [5.0, 2.0, 4.0]
    assert not any(q["weighted"] for q in d["refined_questions"])
    assert not any(a["weighted"] for a in d["answers"])
    assert [c["id"] for c in d["uncovered"]] == ["q2.c1.1", "q1.c2.1", "q2.c2.1"]
    assert result.score == pytest.approx(1 / 4)


# ---- end-to-end --------------------------------------------------------------------------------


async def test_e2e_method_exact_score_and_source_ids():
    # An empty background text is not shown to the model: text #2 is the third context.
    item = ITEM.model_copy(update={"contexts": [ITEM.contexts[0], "  ", ITEM.contexts[1]]})
    output = (
        "The answer states the height only.\n[Covered statements]\n"
        "- The Eiffel Tower is 330 metres tall [1]\n[Uncovered statements]\n"
        "- It is 300 metres tall without antennas [2]\n- It opened in 1889 [1]\n"
        "- It opened in 1889 [1]\n"
    )
    async with ScriptedClient({"coverage": output}) as client:
        result = await evaluate_item(
            client, item, ComprehensivenessOptions(protocol="spec", method="e2e")
        )
    assert result.status == "ok" and result.score == pytest.approx(1 / 3)  # repeats count once
    assert [s["sources"] for s in result.details["uncovered"]] == [["c3"], ["c1"]]
    assert "Background text #2: Without antennas" in client.calls[0].prompt


async def test_e2e_source_id_out_of_range_is_reasked_then_scored():
    bad = "x\n[Covered statements]\n- A [3]\n[Uncovered statements]\n"
    good = "x\n[Covered statements]\n[Uncovered statements]\n- B [2]\n"
    async with ScriptedClient({"coverage": [bad, good]}, check_constraints=False) as client:
        result = await evaluate_item(
            client, ITEM, ComprehensivenessOptions(protocol="spec", method="e2e")
        )
    assert result.status == "ok" and result.score == 0.0  # nothing covered: 0, defined
    assert "out of range 1..2" in client.calls[1].messages[-1]["content"]
