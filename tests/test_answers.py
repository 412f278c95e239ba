"""Answers made elsewhere: one reader in the runtime, each framework's published layout."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.runtime.contract.answers import AnswerFile, read_answers
from groundcover.pipelines.runtime.contract.config import UserError

JSONL = AnswerFile(id_field="sample_id")
LIST = AnswerFile(layout="json-list")
STRICT = AnswerFile(id_field="topic", unknown="error")


def _lines(path, *rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_json_list_layouts_read_the_same_answers(tmp_path):
    lines = _lines(
        tmp_path / "a.jsonl", {"sample_id": "s1", "answer": "x"}, {"sample_id": 7, "answer": "y"}
    )
    assert read_answers(lines, JSONL) == {"s1": "x", "7": "y"}  # an integer id is its digits
    listed = tmp_path / "a.json"
    listed.write_text(json.dumps([{"id": "q1", "answer": "x"}, {"id": "q2", "answer": ""}]))
    assert read_answers(listed, LIST, {"q1", "q2", "q3"}) == {"q1": "x", "q2": ""}


@pytest.mark.parametrize(
    ("spec", "rows", "message"),
    [
        (
            JSONL,
            [{"sample_id": "s1"}],
            "a.jsonl:1: record 's1': field answer: missing or not a string",
        ),
        (JSONL, [{"answer": "x"}], "a.jsonl:1: record None: field sample_id: missing"),
        (
            JSONL,
            [{"sample_id": "s1", "answer": "x"}, {"sample_id": "s1", "answer": "y"}],
            "a.jsonl:2: record 's1': field sample_id: duplicate",
        ),
        (
            STRICT,
            [{"topic": "t9", "answer": "x"}],
            "a.jsonl:1: record 't9': field topic: unknown topic",
        ),
        (JSONL, [{"sample_id": "zz", "answer": "x"}], "no answer's sample_id is an item"),
    ],
)
def test_bad_answers_are_one_line_naming_file_record_and_field(tmp_path, spec, rows, message):
    path = _lines(tmp_path / "a.jsonl", *rows)
    with pytest.raises(UserError) as caught:
        read_answers(path, spec, {"s1", "t1"})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_an_answer_for_no_item_is_ignored_unless_the_framework_refuses_it(tmp_path):
    path = _lines(
        tmp_path / "a.jsonl", {"sample_id": "s1", "answer": "x"}, {"sample_id": "s9", "answer": "y"}
    )
    assert read_answers(path, JSONL, {"s1"}) == {"s1": "x", "s9": "y"}  # s9 is never looked up


def test_empty_files_and_malformed_layouts_are_refused(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="no answers"):
        read_answers(empty, JSONL)
    listed = tmp_path / "a.json"
    listed.write_text('[["q1", "x"]]')
    with pytest.raises(UserError, match=r"answer #0: not a JSON object"):
        read_answers(listed, LIST)
    listed.write_text('[{"id": "q1", "answer": "x"},\n {"id": "q2" "answer": "y"}]')
    with pytest.raises(UserError) as caught:
        read_answers(listed, LIST)
    assert f"{listed}:2: neither a JSON list nor JSON Lines" in str(caught.value)
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"id": "q1", "answer": "x"}\n"just text"\n')
    with pytest.raises(UserError, match=r"a.jsonl:2: record must be a JSON object"):
        read_answers(lines, LIST)


@pytest.mark.parametrize("spec", [LIST, JSONL, STRICT])
def test_either_layout_is_read_by_every_framework_decided_by_the_content(tmp_path, spec):
    """The layout a framework's authors publish is what --help says; the reader takes JSON
    Lines or a JSON list whatever it is (a leading byte-order mark and blank lines too)."""
    rows = [
        {spec.id_field: "q1", "answer": "Paris"},
        {spec.id_field: "q2", "answer": "8 legs"},
    ]
    lines = tmp_path / "answers.jsonl"
    lines.write_text("\ufeff" + "".join(json.dumps(r) + "\n\n" for r in rows), encoding="utf-8")
    listed = tmp_path / "answers.json"
    listed.write_text("\n  " + json.dumps(rows, indent=2))
    ids = {"q1", "q2"}
    assert read_answers(lines, spec, ids) == read_answers(listed, spec, ids)
    assert read_answers(lines, spec, ids) == {"q1": "Paris", "q2": "8 legs"}


def test_every_framework_with_an_answering_role_reads_answers_through_the_runtime():
    """FanOutQA (the official JSON list), GaRAGe (sample_id JSONL) and CRUX (topic JSONL) each
    declare their layout; the answers file identifies the run by its content."""
    from groundcover.pipelines.runtime.contract.plugins import framework

    layouts = {
        name: (f.answer_file.id_field, f.answer_file.layout)
        for name in ("fanoutqa", "garage", "crux")
        if (f := framework(name)).answer_file is not None
    }
    assert layouts == {
        "fanoutqa": ("id", "json-list"),
        "garage": ("sample_id", "jsonl"),
        "crux": ("topic", "jsonl"),
    }
