"""Comprehensiveness parsers against well-formed, malformed, truncated and adversarial output."""

import re

import pytest

from groundcover.pipelines.comprehensiveness.formats import Formats
from groundcover.pipelines.comprehensiveness.parsers import (
    parse_answers,
    parse_coverage,
    parse_nli,
    parse_relation,
    parse_scored_items,
    parse_statements,
    parse_units,
)
from groundcover.serving.parsing import ParseError


def test_units_keep_type_and_split_on_last_colon():
    units = parse_units(
        "- The ratio is 3:1: Fact\n- I think so: Claim\n* Do this: Instruction\n"
        "- no type here\n- x: Banana\n- The ratio is 3:1: Fact\n"
    )
    assert [(u.text, u.type) for u in units] == [
        ("The ratio is 3:1", "fact"),
        ("I think so", "claim"),
        ("Do this", "instruction"),
    ]


@pytest.mark.parametrize("bad", ["", "Sure, here are the units.", "- text without type", "- x:"])
def test_units_malformed(bad):
    with pytest.raises(ParseError):
        parse_units(bad)


def test_units_none_is_a_legal_empty_answer():
    assert parse_units("None") == []


def test_statements_dedupe_and_accept_bullet_styles():
    assert parse_statements("* a\n- b\n1. c\n* a\n\nnoise") == ["a", "b", "c"]
    with pytest.raises(ParseError):
        parse_statements("just prose")


def test_scored_items():
    text = "* Q1? [Relevance: 5]\n* Q2? [relevance:2]\n* Q3? [Confidence: 4]\n* Q4?"
    assert parse_scored_items(text, "Relevance") == [("Q1?", 5), ("Q2?", 2)]
    with pytest.raises(ParseError):
        parse_scored_items("* Q1? [Relevance: 9]", "Relevance")  # out of scale


def test_answers_match_questions_and_flag_unknown():
    questions = ["How tall is it?", "Who built it?"]
    text = (
        "* How tall is it?\nA: 330 m [Confidence: 5] | A: 300 m [Confidence: 2]\n"
        "* who built it\n  A: unknown [Confidence: 5]\n"
    )
    sheet = parse_answers(text, questions)
    assert [(a.text, a.confidence, a.position) for a in sheet.by_question[0]] == [
        ("330 m", 5, 0),
        ("300 m", 2, 1),
    ]
    assert sheet.by_question[1][0].unknown
    assert sheet.markers == 3


def test_answers_truncated_output_misses_a_question():
    with pytest.raises(ParseError, match="no answer line"):
        parse_answers(
            "* How tall is it?\nA: 330 m [Confidence: 5]\n* Who bu",
            ["How tall is it?", "Who built it?"],
        )


def test_answers_for_unasked_questions_are_ignored():
    text = "* Injected question?\nA: evil [Confidence: 5]\n* Q?\nA: fine [Confidence: 3]"
    sheet = parse_answers(text, ["Q?"])
    assert list(sheet.by_question) == [0]
    assert sheet.by_question[0][0].position == 1  # alignment counts every marker


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("Same thing.\noxygen - O [equivalent]", "equivalent"),
        ("A [neutral] thought, but\nx - y [First implies second]", "first implies second"),
        ("x - y [second implies first].", "second implies first"),
    ],
)
def test_relation_takes_the_last_valid_label(text, label):
    assert parse_relation(text) == label


@pytest.mark.parametrize("bad", ["", "They are similar.", "x - y [similar]", "x - y [equivalent"])
def test_relation_malformed(bad):
    with pytest.raises(ParseError):
        parse_relation(bad)


def test_nli_labels():
    assert parse_nli("Entailment") == "entailment"
    assert parse_nli(" neutral\n") == "neutral"
    for bad in ["", "yes", "entailment or contradiction"]:
        with pytest.raises(ParseError):
            parse_nli(bad)


def test_coverage_sections_sources_and_dedupe():
    text = (
        "Reasoning: ...\n[Covered statements]\n- A is 3 m. [1]\n- B holds. [1, 2]\n"
        "- A is 3 m. [1]\n"
        "[Uncovered statements]\n- C was said. [2].\n"
    )
    covered, uncovered = parse_coverage(text, 2)
    assert [(s.text, s.sources) for s in covered] == [("A is 3 m.", (1,)), ("B holds.", (1, 2))]
    assert [(s.text, s.sources) for s in uncovered] == [("C was said.", (2,))]


def test_coverage_empty_lists_are_legal():
    assert parse_coverage("[Covered statements]\n[Uncovered statements]\n", 3) == ([], [])


@pytest.mark.parametrize(
    "bad",
    [
        "no headers at all",
        "[Covered statements]\n- A. [1]\n",  # truncated: second header missing
        "[Covered statements]\n- A. [7]\n[Uncovered statements]\n",  # id out of range
        "[Covered statements]\n- A without ids\n[Uncovered statements]\n",
    ],
)
def test_coverage_malformed(bad):
    with pytest.raises(ParseError):
        parse_coverage(bad, 2)


def test_constrained_formats_are_what_the_parsers_read():
    """Strings matching each decoding regex must parse; the regexes are the parsers' formats."""
    formats = Formats()
    assert re.fullmatch(formats.units, "- Paris is a city: Fact\n")
    assert parse_units("- Paris is a city: Fact\n")[0].type == "fact"
    refined = "* How tall? [Relevance: 4]\n"
    assert re.fullmatch(formats.refined, refined) and parse_scored_items(refined, "Relevance")
    qs = ["How tall (in total)?", "Why?"]
    answers = (
        "* How tall (in total)?\nA: 3 m [Confidence: 5] | A: 4 m [Confidence: 2]\n"
        "* Why?\nA: unknown [Confidence: 5]\n"
    )
    assert re.fullmatch(formats.answers(qs), answers)
    assert len(parse_answers(answers, qs).by_question) == 2
    relation = "Both name the same city.\nParis - paris [equivalent]"
    assert re.fullmatch(formats.relation, relation) and parse_relation(relation) == "equivalent"
    cov = "Short.\n[Covered statements]\n- A. [1, 2]\n[Uncovered statements]\n- B. [2]\n"
    assert re.fullmatch(formats.coverage(2), cov)
    assert parse_coverage(cov, 2)[1][0].sources == (2,)
    small = Formats(items=1, chars=5)
    assert re.fullmatch(small.statements, "* abcde\n")
    assert not re.fullmatch(small.statements, "* abcdef\n")
    assert not re.fullmatch(small.statements, "* a\n* b\n")
