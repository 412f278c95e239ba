"""Answers made elsewhere: one reader in the runtime, each framework's published layout."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.runtime.answers import AnswerFile, read_answers
from groundcover.pipelines.runtime.config import UserError

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


def test_empty_files_and_wrong_layouts_are_refused(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="no answers"):
        read_answers(empty, JSONL)
    listed = tmp_path / "a.json"
    listed.write_text('{"id": "q1", "answer": "x"}')
    with pytest.raises(UserError, match="expected a JSON list"):
        read_answers(listed, LIST)
    listed.write_text('[["q1", "x"]]')
    with pytest.raises(UserError, match=r"answer #0: not a JSON object"):
        read_answers(listed, LIST)


def test_every_framework_with_an_answering_role_reads_answers_through_the_runtime():
    """FanOutQA (the official JSON list), GaRAGe (sample_id JSONL) and CRUX (topic JSONL) each
    declare their layout; the answers file identifies the run by its content."""
    from groundcover.pipelines.runtime.registry import framework

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
