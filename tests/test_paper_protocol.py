"""The paper protocol (SPEC §1 "Reference behaviour"): each rule pinned by hand with scripted
outputs, next to what the spec protocol gives on the same outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from groundcover.pipelines.comprehensiveness import qa_method
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions, Item
from groundcover.pipelines.comprehensiveness.framework import _mean_with_ci, evaluate_item
from groundcover.pipelines.comprehensiveness.graph import Judgement, edges_from_judgements
from groundcover.pipelines.comprehensiveness.meta import lmr_wikicontradict
from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
from groundcover.pipelines.comprehensiveness.parsers import parse_answers
from groundcover.pipelines.comprehensiveness.qa_method import relation_by_probability
from groundcover.pipelines.comprehensiveness.rules import rules_for
from groundcover.pipelines.comprehensiveness.units import compare_quantities
from groundcover.pipelines.runtime.contract.context import ItemContext
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
from groundcover.serving.parsing import ParseError
from tests.support.scripted import (
    Reply,
    ScriptedClient,
    by_text,
    field_of,
    label,
    marked,
    rated,
    tool_call,
)


def nli_label(name: str, probability: float) -> Reply:
    return Reply(name, [{"token": name, "logprob": math.log(probability), "top_logprobs": []}])


# ---- the edge rule -----------------------------------------------------------------------------


def test_edge_rule_by_hand():
    def pair(label_ab, p_ab, label_ba, p_ba):  # (a -> b preferred on a tie, b -> a)
        return (Judgement("a", "b", label_ab, p_ab), Judgement("b", "a", label_ba, p_ba))

    # Both entail: an equivalence, whatever the probabilities.
    assert edges_from_judgements([pair("entailment", 0.6, "entailment", 0.9)])[0] == [
        ("a", "b"),
        ("b", "a"),
    ]
    # A more probable neutral overrules entailment: no edge (the plain reading would add b->a).
    edges, kept = edges_from_judgements([pair("neutral", 0.95, "entailment", 0.80)])
    assert edges == [] and kept[0]["relation"] == "neutral"
    assert edges_from_judgements([pair("neutral", 0.80, "entailment", 0.95)])[0] == [("b", "a")]
    # Ties go to the preferred direction, whichever label it has.
    assert edges_from_judgements([pair("entailment", 0.7, "neutral", 0.7)])[0] == [("a", "b")]
    assert edges_from_judgements([pair("neutral", 0.7, "entailment", 0.7)])[0] == []
    # A contradiction kept is no edge.
    assert edges_from_judgements([pair("contradiction", 0.9, "entailment", 0.5)])[0] == []


# ---- NLI-based, end to end ---------------------------------------------------------------------

ITEM = Item(
    id="t",
    query="Who designed the tower?",
    response="Gustave Eiffel's firm designed it.",
    contexts=["CTX ONE about the design.", "CTX TWO about the engineers."],
)
R, A1, A2 = (
    "Eiffel's firm designed the tower.",
    "Koechlin drew the tower.",
    "The firm hired Koechlin.",
)
SUMMARIES = {"CTX ONE": "Summary one.", "CTX TWO": "Summary two."}


def nli_scripts(nli) -> dict:
    return {
        "summarise": lambda p: by_text(SUMMARIES, field_of(p, "Background text")),
        "extract": lambda p: by_text(
            {
                "Gustave": f"- {R}: Fact\n",
                "Summary one": f"- {A1}: Fact\n",
                "Summary two": f"- {A2}: Fact\n",
            },
            p,
        ),
        "revise": lambda p: by_text(
            {"Gustave": f"* {R}\n", "Summary one": f"* {A1}\n", "Summary two": f"* {A2}\n"},
            field_of(p, "Background text"),
        ),
        "relevance": rated({"5": 1.0}),
        "nli": lambda p: nli.get(
            (field_of(p, "Premise"), field_of(p, "Hypothesis")), nli_label("neutral", 0.99)
        ),
    }


async def score(scripts, protocol="paper", **kwargs):
    # summarise=True in both protocols, so the same scripted outputs apply (spec's default: off)
    options = ComprehensivenessOptions(
        method="nli", protocol=protocol, summarise=True, export_graphs=False
    )
    async with ScriptedClient(scripts, **kwargs) as client:
        result = await evaluate_item(client, ITEM, options, nli_judge=LlmNli())
    return result, client


async def test_paper_nli_summarises_first_and_a_confident_neutral_wins():
    # r -> c1 entailment at 0.80, c1 -> r neutral at 0.95: the paper keeps the neutral, so
    # nothing is covered (S = 0 of 2); the spec protocol takes the entailment (S = 1/2).
    scripts = nli_scripts({(R, A1): nli_label("entailment", 0.80)})
    paper, client = await score(scripts)
    assert paper.score == 0.0
    assert [c.prompt.count("Summary") for c in client.stage_calls("extract")].count(1) == 2
    assert paper.details["summaries"] == ["Summary one.", "Summary two."]
    spec, _ = await score(scripts, protocol="spec")
    assert spec.score == 0.5


@pytest.mark.parametrize(
    ("c2_to_c1", "c1_to_c2", "expected"),
    [
        # tie between the context atoms: c_j -> c_i (c2 -> c1) is kept
        (("entailment", 0.7), ("neutral", 0.7), 1.0),
        (("neutral", 0.7), ("entailment", 0.7), 0.5),
    ],
)
async def test_paper_nli_tie_break_between_contexts(c2_to_c1, c1_to_c2, expected):
    # r -> c2 entails (0.9 beats neutral 0.6), so c2 is covered; c1 only through c2 -> c1.
    scripts = nli_scripts(
        {
            (R, A2): nli_label("entailment", 0.9),
            (A2, R): nli_label("neutral", 0.6),
            (A2, A1): nli_label(*c2_to_c1),
            (A1, A2): nli_label(*c1_to_c2),
        }
    )
    result, _ = await score(scripts)
    assert result.score == expected


@pytest.mark.parametrize(
    ("r_to_c", "c_to_r", "expected"),
    [(("entailment", 0.6), ("neutral", 0.6), 0.5), (("neutral", 0.6), ("entailment", 0.6), 0.0)],
)
async def test_paper_nli_tie_break_goes_to_response_to_context(r_to_c, c_to_r, expected):
    scripts = nli_scripts({(R, A1): nli_label(*r_to_c), (A1, R): nli_label(*c_to_r)})
    result, _ = await score(scripts)
    assert result.score == expected


async def test_paper_nli_equivalence_and_unreadable_label():
    # r <-> c1 both entail (equivalence: covered); every other label is unreadable -> neutral
    # p=1 in the paper protocol (S = 1/2); the spec protocol records the item unparseable.
    equal = {(R, A1): nli_label("entailment", 0.5), (A1, R): nli_label("entailment", 0.5)}
    scripts = nli_scripts(equal) | {
        "nli": lambda p: equal.get((field_of(p, "Premise"), field_of(p, "Hypothesis")), "maybe")
    }
    result, client = await score(scripts, vllm_extensions=False)
    assert result.status == "ok" and result.score == 0.5
    assert result.details["nli_unreadable"] == 4  # r<->c2 and c1<->c2, both ways
    spec, _ = await score(scripts, protocol="spec", vllm_extensions=False)
    assert spec.status == "unparseable" and spec.failure.stage == "nli"


RELEVANCE = {A1: {"4": 0.5, "3": 0.25, "0": 0.25}, A2: {"5": 0.75, "6": 0.25}}


def relevance_by_atom(prompt: str) -> Reply:
    if "Rated statements:" not in prompt:  # spec: one atom per call
        return label(RELEVANCE[field_of(prompt, "Statement")])
    block = prompt.rsplit("Statements:", 1)[1]
    [atom] = [a for a in RELEVANCE if f"* {a}" in block]
    digit = max(RELEVANCE[atom], key=RELEVANCE[atom].__getitem__)
    return marked(f"* {atom} [Relevance: {digit}]\n", [RELEVANCE[atom]])


async def test_paper_relevance_one_call_per_source_weighs_every_integer():
    scripts = nli_scripts({}) | {"relevance": relevance_by_atom}
    paper, client = await score(scripts)
    # paper: every integer among the alternatives: c1 (4*.5 + 3*.25 + 0*.25) = 2.75 -> dropped;
    # c2 5*.75 + 6*.25 = 5.25 -> kept. One call per source text with atoms (two).
    assert paper.details["relevance"] == {"c1.a1": 2.75, "c2.a1": 5.25}
    assert paper.details["kept_context_atoms"] == ["c2.a1"]
    assert len(client.stage_calls("relevance")) == 2
    # spec: labels 1-5 only, renormalised: c1 (4*.5 + 3*.25) / .75 = 3.6667 -> kept; c2 = 5.
    spec, client = await score(scripts, protocol="spec")
    assert spec.details["relevance"] == {"c1.a1": 3.6667, "c2.a1": 5.0}
    assert spec.details["kept_context_atoms"] == ["c1.a1", "c2.a1"]


# ---- Q&A-based ---------------------------------------------------------------------------------

Q = "Who designed the tower?"


def compared(pair: str) -> str:
    relation = "equivalent" if pair == "Gustave Eiffel - Eiffel's company" else "neutral"
    return f"x\n{pair} [{relation}]"


QA_SCRIPTS = {
    "summarise": lambda p: by_text(SUMMARIES, field_of(p, "Background text")),
    "mine": f"* {Q}\n",
    "refine": marked(f"* {Q} [Relevance: 5]\n", [{"5": 1.0}]),
    "answer": lambda p: by_text(
        {
            "Gustave": f"* {Q}\nA: Gustave Eiffel [Confidence: 5] | "
            "A: Eiffel's company [Confidence: 5]\n",
            "Summary one": f"* {Q}\nA: gustave eiffel [Confidence: 5]\n",
            "Summary two": f"* {Q}\nA: EIFFEL'S COMPANY [Confidence: 5] | A: Maurice Koechlin "
            "[Confidence: 4]\n",
        },
        field_of(p, "Background text"),
    ),
    # Only the two response answers are judged equivalent; every other pair is neutral.
    "compare": lambda p: compared(field_of(p, "Answer pair")),
}


async def test_paper_qa_compares_response_answers_which_merges_context_answers():
    # Paper: r1 = c1 and r2 = c2a (identical after lower-casing), r1 = r2 (model) -> one
    # covered cluster {r1, r2, c1, c2a}; c2b uncovered: S = 1/2. Spec (no response-response
    # comparison): clusters {r1, c1} and {r2, c2a} covered, c2b not: S = 2/3.
    options = ComprehensivenessOptions(method="qa", export_graphs=False)
    async with ScriptedClient(QA_SCRIPTS) as client:
        paper = await evaluate_item(client, ITEM, options)
    assert paper.score == 0.5
    pairs = {(c["first"], c["second"]): c["method"] for c in paper.details["comparisons"]}
    assert pairs[("q1.r.1", "q1.r.2")] == "llm"
    assert pairs[("q1.r.1", "q1.c1.1")] == pairs[("q1.r.2", "q1.c2.1")] == "identical"
    spec_options = options.model_copy(update={"protocol": "spec", "summarise": True})
    async with ScriptedClient(QA_SCRIPTS) as client:
        spec = await evaluate_item(client, ITEM, spec_options)
    assert spec.score == pytest.approx(2 / 3)
    assert ("q1.r.1", "q1.r.2") not in {
        (c["first"], c["second"]) for c in spec.details["comparisons"]
    }


def test_missing_question_is_skipped_in_paper_and_fails_in_spec():
    text = "* first?\nA: yes [Confidence: 4]\n"
    sheet = parse_answers(text, ["first?", "second?"], require_all=False)
    assert list(sheet.by_question) == [0]
    with pytest.raises(ParseError, match="no answer line for 1 question"):
        parse_answers(text, ["first?", "second?"])
    with pytest.raises(ParseError):  # an output answering nothing is still unreadable
        parse_answers("nothing here", ["first?"], require_all=False)


def label_tokens(head: str, alternatives: dict[str, float], tail: str = "]") -> list[dict]:
    """Output tokens: ``head`` (ending at '['), the label token with its alternatives, ``tail``."""
    emitted = max(alternatives, key=alternatives.__getitem__)
    top = [{"token": t, "logprob": math.log(p)} for t, p in alternatives.items()]
    return [
        {"token": head, "logprob": 0.0, "top_logprobs": []},
        {"token": emitted, "logprob": math.log(alternatives[emitted]), "top_logprobs": top},
        {"token": tail, "logprob": 0.0, "top_logprobs": []},
    ]


def test_relation_by_probability_reads_the_label_token():
    tokens = label_tokens("x\na - b [", {"neutral": 0.3, "equ": 0.6, "first": 0.1})
    # The generated label (what greedy decoding under a constraint may emit) loses to the
    # more probable one at its first token.
    relation, probabilities = relation_by_probability(tokens, "neutral")
    assert relation == "equivalent"
    assert probabilities == pytest.approx(
        {"neutral": 0.3, "equivalent": 0.6, "first implies second": 0.1}
    )
    # A token that starts the label inside it ("[sec"), and one that fits no relation ("[x").
    merged = label_tokens("x\na - b ", {" [sec": 0.5, " [neutral": 0.2, " [x": 0.3})
    assert relation_by_probability(merged, "neutral")[0] == "second implies first"
    # No alternatives: the generated label stands.
    assert relation_by_probability([{"token": "a [neutral]"}], "neutral") == ("neutral", {})


async def test_paper_comparator_label_is_the_most_probable_of_the_five():
    # r1 - r2 generated "neutral" but "equivalent" is more probable at the label token: the paper
    # merges r1 and r2 (and with them c1 and c2a) -> S = 1/2, as with an "equivalent" output.
    def compare(prompt: str) -> Reply | str:
        pair = field_of(prompt, "Answer pair")
        if pair != "Gustave Eiffel - Eiffel's company":
            return f"x\n{pair} [neutral]"
        tokens = label_tokens(
            f"x\n{pair} [", {"neutral": 0.4, "equivalent": 0.45, "contradictory": 0.15}
        )
        tokens[1]["token"] = "neutral"  # emitted under a constraint, not the most probable
        return Reply(f"x\n{pair} [neutral]", tokens)

    options = ComprehensivenessOptions(method="qa", export_graphs=False)
    async with ScriptedClient(QA_SCRIPTS | {"compare": compare}) as client:
        result = await evaluate_item(client, ITEM, options)
    assert result.score == 0.5
    [r1r2] = [c for c in result.details["comparisons"] if c["second"] == "q1.r.2"]
    assert r1r2["relation"] == "equivalent" and r1r2["generated"] == "neutral"


def ctx_for(client, protocol: str, **options) -> ItemContext:
    opts = ComprehensivenessOptions(method="qa", protocol=protocol, **options)
    return ItemContext("t", client, opts, None, Path("."), opts.max_reasks)


@pytest.mark.parametrize(
    ("protocol", "relation", "method"),
    # 4810 km vs 4850 km: within 1% (paper: the tool decides equivalent); outside the stated
    # precision of both (+/-0.5 each) -> the spec protocol keeps the model's label.
    [("paper", "equivalent", "tool"), ("spec", "neutral", "llm+tool")],
)
async def test_units_tool_result_decides_the_label_in_paper(protocol, relation, method):
    call = tool_call("compare_quantities", '{"first": "4810 km", "second": "4850 km"}')
    scripts = {"compare": [call, "x\n4810 km - 4850 km [neutral]"]}
    async with ScriptedClient(scripts, check_constraints=False) as client:
        ctx = ctx_for(client, protocol, tools=True)
        outcome = await qa_method.compare(ctx, "How long?", "4810 km", "4850 km")
    assert (outcome["relation"], outcome["method"]) == (relation, method)
    assert json.loads(outcome["tool_calls"][0]["result"])["equal"] is (protocol == "paper")


def test_reference_tolerances_of_the_units_tool():
    assert compare_quantities("100 km", "100.9 km", relative=True)["equal"]  # 0.9% <= 1%
    assert not compare_quantities("100 km", "101.5 km", relative=True)["equal"]
    # years, months, days: 1e-5 -- 1.5 vs 1.51 years differ, though spec precision calls it equal
    assert not compare_quantities("1.5 years", "1.51 years", relative=True)["equal"]
    assert compare_quantities("1.5 years", "1.51 years")["equal"]
    assert compare_quantities("8,000 nmi", "14,816 km", relative=True)["equal"]


# ---- end-to-end and LMR ------------------------------------------------------------------------


async def test_paper_e2e_counts_repeated_statements_as_listed():
    output = (
        "x\n[Covered statements]\n- Eiffel designed it [1]\n- Eiffel designed it [1]\n"
        "[Uncovered statements]\n- Koechlin drew it [2]\n"
    )
    scripts = {"summarise": "Short.", "coverage": output}
    for protocol, expected in (("paper", 2 / 3), ("spec", 1 / 2)):
        options = ComprehensivenessOptions(method="e2e", protocol=protocol, summarise=False)
        async with ScriptedClient(scripts) as client:
            result = await evaluate_item(client, ITEM, options)
        assert result.score == pytest.approx(expected), protocol


def wc(score, label_, status=None):
    status = status or ("ok" if score is not None else "undefined")
    return ItemResult(
        id=str(score),
        status=status,
        score=score,
        explanation="by hand",
        details={"meta": {"label": label_}},
    )


def test_paper_lmr_thresholds_and_undefined_as_zero():
    records = [
        wc(None, "I"),  # undefined: S = 0 in the paper -> I matches; spec: never matches
        wc(1 - 1e-6, "C"),  # above 1 - 1e-5: C in the paper; spec needs exactly 1
        wc(5e-6, "I"),  # below 1e-5: I in the paper; spec: 0 < S < 1 is PC
        wc(0.5, "PC"),  # both match
    ]
    paper = lmr_wikicontradict(records, resamples=1000, rules=rules_for("paper"))
    assert paper["lmr"] == 1.0 and paper["undefined_scored_as_zero"] == 1
    assert paper["ci95"]["method"].startswith("degenerate")
    spec = lmr_wikicontradict(records, resamples=1000, rules=rules_for("spec"))
    assert spec["lmr"] == 0.25 and "undefined_scored_as_zero" not in spec


def test_eli5_mean_counts_undefined_answers_as_zero_in_paper():
    failed = ItemResult(
        id="u",
        status="unparseable",
        explanation="by hand",
        failure=StageFailure(stage="coverage", error="x"),
    )
    records = [wc(0.5, "-"), wc(None, "-"), failed]
    paper = _mean_with_ci(records, rules_for("paper"))
    assert (paper["n"], paper["mean"], paper["not_scored"]) == (2, 0.25, {"unparseable": 1})
    assert paper["undefined_scored_as_zero"] == 1
    spec = _mean_with_ci(records, rules_for("spec"))
    assert (spec["n"], spec["mean"]) == (1, 0.5)
    assert spec["not_scored"] == {"undefined": 1, "unparseable": 1}
