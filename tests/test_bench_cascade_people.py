"""scripts/benchmarks/bench_cascade_people.py: WikiContradict's human evaluation read in the
authors' layout (the real rows where ../shared has them), each answer graded by a scripted judge
with logprobs, and the cascade's draws worked out by hand on answers whose grades are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groundcover import UserError
from groundcover.pipelines.reports.audits.cascade import Guarantee
from tests.support.scripted import ScriptedClient, field_of, label
from tests.support.scripts import load_script

bench = load_script("scripts/benchmarks/bench_cascade_people.py")
HUMANEVAL = Path(__file__).resolve().parents[2] / "shared/data/wikicontradict/humaneval-dev.jsonl"


@pytest.mark.skipif(
    not HUMANEVAL.is_file(), reason=f"no WikiContradict human evaluation at {HUMANEVAL}"
)
def test_the_authors_rows_are_five_answers_each_with_what_their_setting_expects():
    graded = bench.read_graded(HUMANEVAL)
    first = json.loads(HUMANEVAL.read_text().splitlines()[0])
    assert len(graded) == 300 and len({g.question for g in graded}) == 12
    both = (first["gt_answer_1"], first["gt_answer_2"])
    # no context, context 1, context 2, both, both with a hint
    assert [g.expected for g in graded[:5]] == [both, both[:1], both[1:], both, both]
    assert [g.answer for g in graded[:5]] == [first[f"answer{k}"] for k in range(5)]
    assert [g.human for g in graded[:5]] == ["partial", "correct", "correct", "partial", "partial"]


def test_a_grade_people_never_gave_is_one_line_naming_file_row_and_field(tmp_path):
    row = {"question": "q", "gt_answer_1": "a", "gt_answer_2": "b"}
    row |= {f"answer{k}": f"answer {k}" for k in range(5)}
    row |= {f"label{k}": "Correct" for k in range(5)} | {"label3": "Mostly right"}
    path = tmp_path / "humaneval.jsonl"
    path.write_text(json.dumps(row | {"label3": "Incorrect"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(UserError, match=r"humaneval.jsonl:2: row 2: field label3: 'Mostly right'"):
        bench.read_graded(path)


async def test_each_grade_is_asked_once_with_its_tokens_probability_as_confidence():
    graded = [
        bench.Graded("q1", ("Yes",), "Yes, it is.", "correct"),
        bench.Graded("q1", ("Yes", "No"), "Yes.", "partial"),
    ]

    def grade(prompt: str):  # sure where one answer is expected, torn where two are
        if "both of these answers" in prompt:
            return label({"partial": 0.55, "correct": 0.45})
        return label({"correct": 0.9, "incorrect": 0.1})

    client = ScriptedClient({"grade": grade})
    tier = await bench.grade_all(client, "cheap", graded)
    assert tier.grades == ["correct", "partial"]
    assert tier.confidences == pytest.approx([0.9, 0.55])
    assert tier.agrees == [True, True]
    assert tier.usage["calls"] == 2 and len(client.stage_calls("grade")) == 2
    assert all(c.body["logprobs"] for c in client.stage_calls("grade"))
    assert "Expected answer: Yes" in client.stage_calls("grade")[0].prompt
    assert field_of(client.stage_calls("grade")[0].prompt, "Answer to grade") == "Yes, it is."


def tier(name: str, grades: list[str], confidences: list[float]):
    """A tier's grades of answers people all graded 'correct'."""
    return bench.TierGrades(name, grades, confidences, [g == "correct" for g in grades], {})


def test_a_draw_keeps_at_the_cheap_tier_what_it_is_sure_of_and_escalates_the_rest():
    """20 questions of 4 answers, all 'correct' to people. The cheap tier: sure (0.95) and right
    on the first two answers of each question, unsure (0.4) and wrong on the other two; the
    strong one right and sure (0.9) on all. At alpha 0.2, delta 0.1 (0.05 a tier: 14 labels at
    the least), calibrated on 14 questions (56 answers), checked on 6 (24): the cheap tier keeps
    its 12 sure answers, the strong one the other 12, all agreeing; the strong judge is asked
    for half. The strong judge alone keeps all 24."""
    graded = [
        bench.Graded(f"q{q}", ("a",), f"{q}-{k}", "correct") for q in range(20) for k in range(4)
    ]
    cheap = tier(
        "cheap", ["correct", "correct", "partial", "partial"] * 20, [0.95, 0.95, 0.4, 0.4] * 20
    )
    strong = tier("strong", ["correct"] * 80, [0.9] * 80)
    draw = bench.one_draw([cheap, strong], graded, Guarantee(0.2, 0.1), seed=3, share=0.3)
    assert draw["coverage"] == 1.0 and draw["agreement"] == 1.0
    assert draw["saved"] == 0.5
    assert (draw["alone_coverage"], draw["alone_agreement"]) == (1.0, 1.0)
    assert draw["first_attainable"] is True
    calibrating, checking = bench.split(graded, 3, 0.3)
    assert (len(calibrating), len(checking)) == (56, 24)
    assert not {graded[i].question for i in calibrating} & {graded[i].question for i in checking}


def test_a_judge_too_weak_for_the_guarantee_keeps_nothing_and_says_how_many_labels_it_lacks():
    """Right on half of 40 answers whatever its confidence: no threshold holds 90% at delta 0.1,
    so nothing is kept, the agreement is no number, and the labels it would need are counted."""
    graded = [bench.Graded(f"q{q}", ("a",), str(q), "correct") for q in range(40)]
    weak = tier("weak", ["correct", "incorrect"] * 20, [0.9, 0.9] * 20)
    draw = bench.one_draw([weak], graded, Guarantee(0.1, 0.1), seed=0, share=0.3)
    assert (draw["coverage"], draw["agreement"]) == (0.0, None)
    assert draw["first_attainable"] is False and draw["first_labels_needed"] > 0
    row = bench.summary([draw], 0.1)
    assert (row["kept_any"], row["below"], row["agreement"]) == (0, 0, None)


async def test_a_judge_that_reasons_first_is_given_room_and_read_for_its_grade_alone():
    """A judge that reasons 40 tokens before its grade: the 8-token request cut in its
    reasoning is asked again with a reasoning budget, and the grade and its probability are the
    answer's (0.9), never the reasoning's tokens."""
    graded = [bench.Graded("q1", ("Yes",), "Yes, it is.", "correct")]
    client = ScriptedClient(
        {"grade": lambda p: label({"correct": 0.9, "incorrect": 0.1})},
        reasons=40,
        logprobs_with_reasoning=True,
    )
    tier = await bench.grade_all(client, "reasoner", graded)
    assert tier.grades == ["correct"] and tier.confidences == pytest.approx([0.9])
    asked = [c.body["max_tokens"] for c in client.stage_calls("grade")]
    assert asked[0] == 8 and asked[-1] > 40
