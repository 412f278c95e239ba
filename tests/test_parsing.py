import pytest

from groundcover.serving.parsing import ParseError, extract_json, match_choice


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": [1, 2]}\n', {"a": [1, 2]}),
        ('Sure! Here it is:\n```json\n{"a": "x"}\n```\nDone.', {"a": "x"}),
        ("```\n[1, 2, 3]\n```", [1, 2, 3]),
        ('The answer is {"score": 4} as requested.', {"score": 4}),
        ('{"text": "line one\nline two"}', {"text": "line one\nline two"}),  # raw newline
        ('noise { not json } then {"ok": true}', {"ok": True}),
        ('[{"a": 1}, {"b": 2}] trailing', [{"a": 1}, {"b": 2}]),
    ],
)
def test_extract_json_finds_the_value(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json here at all",
        '{"a": 1',  # truncated
        '{"a": "unterminated',
        "```json\n{broken: }\n```",
        "}{][",
    ],
)
def test_extract_json_rejects_malformed_and_truncated(text):
    with pytest.raises(ParseError):
        extract_json(text)


def test_extract_json_none():
    with pytest.raises(ParseError):
        extract_json(None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("yes", "yes"),
        ("  YES. ", "yes"),
        ('"no"', "no"),
        ("**unknown**", "unknown"),
        ("The answer is: no", "no"),
    ],
)
def test_match_choice(text, expected):
    assert match_choice(text, ["yes", "no", "unknown"]) == expected


@pytest.mark.parametrize("text", ["", "maybe", "yes or no", "yesterday", "nothing"])
def test_match_choice_rejects_none_or_ambiguous(text):
    with pytest.raises(ParseError):
        match_choice(text, ["yes", "no"])
