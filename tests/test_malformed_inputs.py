"""Malformed inputs through the real CLI, for every format we read: each case stops with exit code
2 and one line naming the file (and line, record and field where there is one), before anything is
written: the directory holding the inputs is byte-for-byte what it was.

Legitimate variants of a good file (a UTF-8 BOM, CRLF line ends) are read, not refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from tests.test_meta import cb_row
from tests.test_runtime import EXAMPLES, FANOUT, WC_ROW
from tests.test_runtime import G1_ID as G1

NO_SERVER = ["--endpoint", "http://127.0.0.1:9/v1"]  # a run that got past validation fails here


def jsonl(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


ITEM = {"id": "a", "query": "Who?", "response": "Eiffel.", "contexts": ["Eiffel built it."]}
TOPIC = {"topic": "t1", "query": "q", "questions": ["Q0?", "Q1?"]}
PASSAGE = {"id": "p1", "topic": "t1", "text": "two words"}
RATING = {"topic": "t1", "passage_id": "p1", "question": 0, "rating": 4}
QUERY = {"query_id": "q1", "query": "eiffel tower", "subtopics": ["where it is"]}
RESPONSE = {"system": "A", "query_id": "q1", "response": "It is in Paris."}
QREL = {"query_id": "q1", "doc_id": "d1", "relevance": 1, "subtopic_id": 1}
SNIPPET = {"claim": "It is in Paris.", "snippets": [{"id": "s1", "doc_id": "d1", "text": "Paris."}]}
CHAT = {
    "messages": [
        {"role": "user", "content": "Paragraph."},
        {"role": "assistant", "content": "- A claim."},
    ]
}

GOOD = {  # every input file, well-formed
    "items.jsonl": jsonl(ITEM, ITEM | {"id": "b"}),
    "questions.jsonl": jsonl({"id": "a", "question": "Why?"}),
    "wc.jsonl": jsonl(WC_ROW),
    "cb.jsonl": jsonl(cb_row(), cb_row(question="Who built Y?")),
    "dev.json": json.dumps(FANOUT),
    "garage.jsonl": (EXAMPLES / "garage.jsonl").read_text(),
    "corpus.jsonl": jsonl(
        {"id": "d1", "contents": "The tower is in Paris."}, {"id": "d2", "contents": "It is tall."}
    ),
    "topics.jsonl": jsonl(TOPIC),
    "passages.jsonl": jsonl(PASSAGE, PASSAGE | {"id": "p2", "text": "x"}),
    "ratings.jsonl": jsonl(RATING, RATING | {"question": 1, "rating": 2}),
    "run.trec": "t1 Q0 p1 1 9.0 sys\nt1 Q0 p2 2 8.0 sys\n",
    "queries.jsonl": jsonl(QUERY),
    "responses.jsonl": jsonl(RESPONSE),
    "qrels.jsonl": jsonl(QREL),
    "snippets.jsonl": jsonl(SNIPPET),
    "records.jsonl": jsonl({"id": "r1", "summary": "A summary.", "documents": ["Doc one."]}),
    "train.jsonl": jsonl(CHAT, CHAT),
    "config.yaml": "evaluator:\n  concurrency: 2\n",
}
COMMANDS = {  # what reads each file (paths relative to the case's directory)
    "items.jsonl": ["eval", "comprehensiveness", "items.jsonl"],
    "questions.jsonl": ["generate", "questions.jsonl"],
    "wc.jsonl": ["meta-eval", "wikicontradict", "--data", "wc.jsonl"],
    "cb.jsonl": ["meta-eval", "conflictbank", "--data", "cb.jsonl"],
    "dev.json": ["eval", "fanoutqa", "--data", "dev.json"],
    "garage.jsonl": ["eval", "garage", "garage.jsonl"],
    "corpus.jsonl": ["index", "build", "corpus.jsonl", "index", "--dense-model", "none"],
    "topics.jsonl": [
        "eval",
        "crux",
        "run.trec",
        "--topics",
        "topics.jsonl",
        "--passages",
        "passages.jsonl",
        "--ratings",
        "ratings.jsonl",
    ],
    "records.jsonl": ["crux", "build", "records.jsonl"],
    "responses.jsonl": [
        "eval",
        "icat",
        "responses.jsonl",
        "--queries",
        "queries.jsonl",
        "--qrels",
        "qrels.jsonl",
        "--snippets",
        "snippets.jsonl",
        "--variant",
        "m",
        "--nli-model",
        "none",
    ],
    "train.jsonl": [
        "finetune",
        "claims",
        "train",
        "train.jsonl",
        "--base",
        "embedded",
        "--out",
        "adapter",
    ],
    "config.yaml": ["eval", "comprehensiveness", "items.jsonl", "--config", "config.yaml"],
}
for name in ("passages.jsonl", "ratings.jsonl", "run.trec"):
    COMMANDS[name] = COMMANDS["topics.jsonl"]
for name in ("queries.jsonl", "qrels.jsonl", "snippets.jsonl"):
    COMMANDS[name] = COMMANDS["responses.jsonl"]
OWN_OUTPUT = {"index", "finetune"}  # commands that write elsewhere than a run directory


@dataclass
class Bad:
    file: str
    content: bytes | Callable[[str], bytes]
    expect: str  # what the one line must say besides the file name

    def bytes(self) -> bytes:
        good = GOOD[self.file]
        return self.content(good) if callable(self.content) else self.content


def binary(good: str) -> bytes:
    return good.encode()[:20] + b"\x00\xff\xfe\x89PNG\r\n\x1a\n" + bytes(range(256))


def latin1(good: str) -> bytes:
    return good.replace("Paris", "Pär\u00eds").replace("Eiffel", "Eiffél").encode("latin-1")


def truncated(good: str) -> bytes:
    return good.rstrip("\n")[:-3].encode()  # last record cut mid-value, no final newline


def huge_line(good: str) -> bytes:
    return good.encode() + b'{"id": "' + b"x" * 5_000_000 + b"\n"  # 5 MB, never closed


def swap_first(key: str, value) -> Callable[[str], bytes]:
    """The first JSONL record with ``key`` set to ``value`` (None: removed)."""

    def edit(good: str) -> bytes:
        first, *rest = good.splitlines(keepends=True)
        row = json.loads(first)
        if value is None:
            row.pop(key)
        else:
            row[key] = value
        return (json.dumps(row) + "\n" + "".join(rest)).encode()

    return edit


def duplicate_first(good: str) -> bytes:
    first = good.splitlines(keepends=True)[0]
    return (good + first).encode()


EVERY_JSONL = [f for f in GOOD if f.endswith(".jsonl")]
EMPTY = {
    "topics.jsonl": "no topics",
    "queries.jsonl": "no queries",
    "responses.jsonl": "no responses",
    "corpus.jsonl": "no text to index",
    "train.jsonl": "no examples",
}
CASES: list[Bad] = [
    *(Bad(f, b"", EMPTY.get(f, "no records")) for f in EVERY_JSONL),
    *(Bad(f, binary, ":1: not UTF-8") for f in EVERY_JSONL),
    *(Bad(f, truncated, "not valid JSON") for f in EVERY_JSONL),
    Bad("items.jsonl", huge_line, ":3: not valid JSON"),
    Bad("corpus.jsonl", huge_line, ":3: not valid JSON"),
    Bad("items.jsonl", latin1, ":1: not UTF-8"),
    Bad("responses.jsonl", latin1, ":1: not UTF-8"),
    Bad("wc.jsonl", b"[1, 2]\n", ":1: record must be a JSON object"),
    # duplicate ids
    Bad("items.jsonl", duplicate_first, ":3: record 'a': duplicate id"),
    Bad("questions.jsonl", duplicate_first, ":2: record 'a': duplicate id"),
    Bad("garage.jsonl", duplicate_first, "duplicate"),
    Bad("corpus.jsonl", duplicate_first, ":3: record 'd1': duplicate id"),
    Bad("passages.jsonl", duplicate_first, ":3: record 'p1': duplicate"),
    Bad("topics.jsonl", duplicate_first, ":2: record 't1': duplicate"),
    Bad("queries.jsonl", duplicate_first, ":2: record 'q1': duplicate"),
    Bad("responses.jsonl", duplicate_first, ":2: record 'A:q1': duplicate"),
    Bad("records.jsonl", duplicate_first, ":2: record 'r1': duplicate id"),
    # missing fields
    Bad("items.jsonl", swap_first("response", None), ":1: record 'a': field response"),
    Bad("questions.jsonl", swap_first("question", None), ":1: record 'a': field question"),
    Bad("wc.jsonl", swap_first("question", None), ":1: field question"),  # rows have no id
    Bad("cb.jsonl", swap_first("default_evidence", None), "default_evidence"),
    Bad("garage.jsonl", swap_first("grounding", None), f":1: record '{G1}': field grounding"),
    Bad("corpus.jsonl", swap_first("contents", None), ":1: record 'd1': field contents"),
    Bad("topics.jsonl", swap_first("questions", None), ":1: record 't1': field questions"),
    Bad("passages.jsonl", swap_first("text", None), ":1: record 'p1': field text"),
    Bad("ratings.jsonl", swap_first("rating", None), ":1: record 'p1': field rating"),
    Bad("queries.jsonl", swap_first("query", None), ":1: record 'q1': field query"),
    Bad("responses.jsonl", swap_first("response", None), ":1: record 'A:q1': field response"),
    Bad("qrels.jsonl", swap_first("doc_id", None), ":1: record q1/?: field doc_id"),
    Bad("snippets.jsonl", swap_first("snippets", None), ":1: record 'It is in Paris.': field"),
    Bad("records.jsonl", swap_first("documents", None), ":1: record 'r1': field documents"),
    Bad("train.jsonl", swap_first("messages", None), ":1: field messages"),
    # wrong types and values
    Bad("items.jsonl", swap_first("contexts", "one string"), ":1: record 'a': field contexts"),
    Bad("items.jsonl", swap_first("query", 42), ":1: record 'a': field query"),
    Bad("questions.jsonl", swap_first("question", ["x"]), ":1: record 'a': field question"),
    Bad("wc.jsonl", swap_first("label0", "Maybe"), ":1: field label0"),
    Bad("cb.jsonl", swap_first("question", 7), "question"),
    Bad("garage.jsonl", swap_first("evidence_relevant", "yes"), f":1: record '{G1}': field"),
    Bad("topics.jsonl", swap_first("questions", "Q0?"), ":1: record 't1': field questions"),
    Bad("passages.jsonl", swap_first("topic", "t9"), ":1: record 'p1': field topic"),
    Bad("ratings.jsonl", swap_first("rating", "high"), ":1: record 'p1': field rating"),
    Bad("ratings.jsonl", swap_first("rating", 9), ":1: record 'p1': field rating"),
    Bad("queries.jsonl", swap_first("subtopics", "where"), ":1: record 'q1': field subtopics"),
    Bad("responses.jsonl", swap_first("query_id", "q9"), ":1: record 'A:q9': field query_id"),
    Bad("qrels.jsonl", swap_first("relevance", "high"), ":1: record q1/d1: field relevance"),
    Bad("records.jsonl", swap_first("documents", "Doc one."), ":1: record 'r1': field"),
    Bad("train.jsonl", swap_first("messages", "no"), ":1: field messages"),
    # FanOutQA JSON
    Bad("dev.json", b"", "dev.json"),
    Bad("dev.json", binary, "dev.json"),
    Bad("dev.json", truncated, "not valid JSON"),
    Bad("dev.json", b'{"id": "x"}', "a JSON list"),
    Bad(
        "dev.json",
        lambda g: json.dumps([FANOUT[0], {"id": "f2"}]).encode(),
        "question #1 ('f2'): field answer",
    ),
    Bad(
        "dev.json",
        lambda g: json.dumps([FANOUT[0], {**FANOUT[1], "question": 5}]).encode(),
        "question #1 ('f2'): field question",
    ),
    Bad(
        "dev.json",
        lambda g: json.dumps([FANOUT[0], FANOUT[0]]).encode(),
        "question #1 ('f1'): field id: duplicate",
    ),
    # TREC runs
    Bad("run.trec", b"", "run.trec"),
    Bad("run.trec", binary, "run.trec:2: not UTF-8"),  # the first line is whole
    Bad("run.trec", b"t1 Q0 p1 1 9.0\n", "run.trec:1"),  # five columns
    Bad("run.trec", b"t1 Q0 p1 first 9.0 sys\n", "run.trec:1"),
    Bad("run.trec", b"t1 Q0 p1 1 high sys\n", "run.trec:1"),
    Bad("run.trec", b"t9 Q0 p1 1 9.0 sys\n", "run.trec:1"),  # unknown topic
    # YAML configs
    Bad("config.yaml", b"evaluator: [unclosed\n", "not valid YAML"),
    Bad("config.yaml", b"evaluator:\n  modle: x\n", "evaluator.modle"),
    Bad("config.yaml", b"evaluator:\n  concurrency: many\n", "evaluator.concurrency"),
    Bad("config.yaml", b"- a\n- b\n", "config.yaml"),
    Bad("config.yaml", binary, "config.yaml"),
]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("bad", CASES, ids=[f"{i:02d}-{b.file}" for i, b in enumerate(CASES)])
def test_malformed_input_is_one_line_exit_2_nothing_written(tmp_path, monkeypatch, bad):
    for name, text in GOOD.items():
        (tmp_path / name).write_text(text)
    (tmp_path / bad.file).write_bytes(bad.bytes())
    monkeypatch.chdir(tmp_path)
    args = COMMANDS[bad.file]
    if args[0] not in OWN_OUTPUT:
        args = [*args, "--run-dir", "run", *NO_SERVER]
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output[-2000:]
    assert len(lines) == 1 and len(lines[0]) < 400, lines[:5]
    assert bad.file in lines[0] and bad.expect in lines[0], lines[0]
    assert snapshot(tmp_path) == before  # no run directory, index, adapter or partial file


def test_there_are_at_least_fifty_cases_over_every_format():
    assert len(CASES) >= 50
    assert {b.file for b in CASES} == set(GOOD)


def test_a_bom_and_crlf_line_ends_are_read_like_the_clean_file(tmp_path):
    from groundcover.index_build.corpus import read_corpus
    from groundcover.pipelines.crux.data import load_run, load_topics
    from groundcover.pipelines.fanoutqa.framework import load_questions
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, load_config
    from groundcover.pipelines.runtime.contract.readers import iter_jsonl

    def variant(name: str) -> Path:
        path = tmp_path / f"bom-crlf-{name}"
        path.write_bytes(b"\xef\xbb\xbf" + GOOD[name].replace("\n", "\r\n").encode())
        return path

    for name in GOOD:
        (tmp_path / name).write_text(GOOD[name])
    for name in EVERY_JSONL:
        assert list(iter_jsonl(variant(name))) == list(iter_jsonl(tmp_path / name)), name
    corpus = [(d.id, d.text) for d in read_corpus(variant("corpus.jsonl"))]
    assert corpus == [(d.id, d.text) for d in read_corpus(tmp_path / "corpus.jsonl")]
    topics = load_topics(tmp_path / "topics.jsonl")
    assert load_run(variant("run.trec"), topics) == load_run(tmp_path / "run.trec", topics)
    assert load_questions(variant("dev.json")) == load_questions(tmp_path / "dev.json")
    config = tmp_path / "flat.yaml"
    config.write_bytes(b"\xef\xbb\xbfmodel: gpt-oss-20b\r\nconcurrency: 3\r\n")
    loaded = load_config(EvaluatorConfig, config, {})
    assert (loaded.model, loaded.concurrency) == ("gpt-oss-20b", 3)
