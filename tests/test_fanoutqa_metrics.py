"""Our FanOutQA string metrics against the original scorer (`fanoutqa` package), dev set."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from groundcover.pipelines.fanoutqa.metrics import (
    aggregate,
    answer_text,
    match_answer,
    rouge,
    string_metrics,
)
from tests.conftest import SHARED
from tests.support.scripts import load_script

DEV = SHARED / "data" / "fanoutqa" / "fanout-final-dev.json"


def reference_scorer():
    """The package's string scorer, loaded by file path: importing fanoutqa.eval would build an
    OpenAI client and import TensorFlow BLEURT, neither of which the string metrics use."""
    pytest.importorskip("fanoutqa")
    import fanoutqa
    import fanoutqa.norm
    import spacy

    from groundcover.pipelines.fanoutqa.metrics import SPACY_PACKAGE

    fanoutqa.norm.nlp.pipe = spacy.load(SPACY_PACKAGE)  # offline en_core_web_sm 3.8.0
    root = Path(fanoutqa.__file__).parent / "eval"
    modules = {}
    for name in ("string", "utils"):
        modules[name] = load_script(root / f"{name}.py", f"fanoutqa_reference_{name}")
    # normalize() is pure: caching it changes no result, only the time the reference takes.
    modules["string"].normalize = lru_cache(maxsize=None)(modules["string"].normalize)
    return modules["string"].answer_in_text, modules["utils"].str_answer


@pytest.mark.skipif(not DEV.is_file(), reason=f"FanOutQA dev set not found at {DEV}")
def test_parity_with_the_original_scorer_on_310_dev_questions():
    from rouge_score.rouge_scorer import RougeScorer

    answer_in_text, str_answer = reference_scorer()
    ref_rouge = RougeScorer(("rouge1", "rouge2", "rougeL"), use_stemmer=True)
    questions = json.loads(DEV.read_text())
    assert len(questions) == 310
    kinds = set()
    ours, theirs = [], []
    for q in questions:
        gold = str_answer(q["answer"])
        kinds.add(type(q["answer"]).__name__)
        generations = [
            gold,  # the reference itself
            "I believe it is " + gold[: max(1, len(gold) // 2)] + " or so.",  # perturbed
            "The 1,000 answers are unknown; sorry!",  # free text
        ]
        for g in generations:
            expected = answer_in_text(q["answer"], g)
            got = match_answer(q["answer"], g)
            assert got.score == pytest.approx(expected.score, abs=1e-9), (q["id"], g)
            assert got.found == expected.found
            ref = ref_rouge.score(str_answer(q["answer"]), str_answer(g))
            mine = rouge(q["answer"], g)
            for k, v in ref.items():
                assert mine[k]["f1"] == pytest.approx(v.fmeasure, abs=1e-9)
            ours.append(string_metrics(q["answer"], g))
            theirs.append((expected.score, expected.found))
    assert kinds == {"dict", "list", "int", "bool", "str"}  # every answer shape was exercised
    total = aggregate(ours)
    assert total["loose"] == pytest.approx(sum(s for s, _ in theirs) / len(theirs), abs=1e-9)
    assert total["strict"] == pytest.approx(sum(f for _, f in theirs) / len(theirs), abs=1e-9)


def test_shapes_by_hand():
    assert match_answer(True, "Yes, it did.").found
    assert match_answer({"Paris": 2, "Rome": 3}, "Paris has 2, Rome has 4").score == 0.75
    assert match_answer(["a cat", "a dog"], "I saw a cat").score == 0.5
    assert match_answer("1,234", "about 1234 people").found  # commas inside numbers dropped
    assert not match_answer("cat", "concatenate").found  # word boundaries
    assert answer_text({"a": [1, 2]}) == "a - 1\n2"
    unanswered = string_metrics("x", None)
    assert unanswered["loose"] == 0.0 and unanswered["rouge"]["rougeL"]["f1"] == 0.0


def write_articles(questions: list[dict], path: Path) -> None:
    """A small article collection written for the test: each evidence page states its facts."""
    pages: dict[int, dict] = {}

    def walk(subs):
        for sub in subs:
            evidence = sub.get("evidence") or {}
            if "pageid" in evidence:
                blank = {"pageid": evidence["pageid"], "title": evidence["title"], "text": ""}
                page = pages.setdefault(evidence["pageid"], blank)
                page["text"] += f"{sub['question']} {json.dumps(sub['answer'])}.\n\n"
            walk(sub.get("decomposition") or [])

    for q in questions:
        walk(q["decomposition"])
    path.write_text("".join(json.dumps(p) + "\n" for p in pages.values()))


@pytest.mark.engine
@pytest.mark.skipif(not DEV.is_file(), reason=f"FanOutQA dev set not found at {DEV}")
def test_eval_fanoutqa_end_to_end(vllm_server, tmp_path):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from tests.support.tiny import build_tiny_classifier

    questions = json.loads(DEV.read_text())[:2]
    write_articles(questions, tmp_path / "articles.jsonl")
    bleurt = build_tiny_classifier(tmp_path / "bleurt", "bert", labels=("score",))
    args = [
        "eval",
        "fanoutqa",
        "--data",
        str(DEV),
        "--limit",
        "2",
        "--setting",
        "closed-book",
        "--setting",
        "evidence",
        "--setting",
        "open-book",
        "--judge",
        "--articles",
        str(tmp_path / "articles.jsonl"),
        "--context-tokens",
        "300",
        "--endpoint",
        vllm_server.base_url,
        "--bleurt",
        str(bleurt),
        "--model",
        vllm_server.served_name,
        "--max-tokens",
        "24",
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
    ]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    gold = {q["id"]: q["answer"] for q in questions}
    for setting in ("closed-book", "evidence", "open-book"):
        records = [
            json.loads(x)
            for x in (tmp_path / "run" / setting / "results.jsonl").read_text().splitlines()
        ]
        assert sorted(r["id"] for r in records) == sorted(gold)
        for record in records:
            details = record["details"]
            expected = string_metrics(gold[record["id"]], details["generation"] or None)
            assert details["metrics"]["loose"] == expected["loose"]
            assert record["score"] == expected["loose"]
            if details["generation"]:
                judge = details["judge"]
                assert judge.get("category") in set("ABCDEF") or judge["status"] == "unparseable"
        table = json.loads((tmp_path / "run" / setting / "table1.json").read_text())
        from groundcover.pipelines.fanoutqa.bleurt import Bleurt
        from groundcover.pipelines.fanoutqa.metrics import answer_text

        answered = [r for r in records if r["details"]["generation"]]
        references = [answer_text(gold[r["id"]]) for r in answered]
        generations = [r["details"]["generation"] for r in answered]
        direct = Bleurt(str(bleurt)).score(references, generations)
        assert table["bleurt"] == pytest.approx(sum(direct) / len(questions), abs=1e-6)
        assert table["loose"] == pytest.approx(sum(r["score"] for r in records) / len(records))
    evidence = [
        json.loads(x)["details"]["evidence"]
        for x in (tmp_path / "run" / "evidence" / "results.jsonl").read_text().splitlines()
    ]
    assert all(e["used"] >= 1 and e["missing_pages"] == [] for e in evidence)
    assert all(e["used"] <= e["chunks"] for e in evidence)
    # The articles were indexed once, into the study root, and both article settings used it.
    assert (tmp_path / "run" / "articles-index" / "manifest.json").is_file()


def test_fanoutqa_input_errors(tmp_path):
    from groundcover.pipelines.fanoutqa.framework import check_articles, load_questions
    from groundcover.pipelines.runtime.contract.config import UserError

    bad = tmp_path / "q.json"
    bad.write_text('{"not": "a list"}')
    with pytest.raises(UserError, match="expected a JSON list"):
        load_questions(bad)
    bad.write_text('[{"id": "x", "question": "q?"}]')
    with pytest.raises(UserError, match="question #0 \('x'\): field answer"):
        load_questions(bad)
    arts = tmp_path / "a.jsonl"
    arts.write_text('{"pageid": "12", "text": "x"}\n')
    with pytest.raises(UserError, match="a.jsonl:1: need integer pageid"):
        check_articles(arts)


@pytest.mark.skipif(not DEV.is_file(), reason=f"FanOutQA dev set not found at {DEV}")
def test_open_book_tools_search_and_read(tmp_path):
    from groundcover.pipelines.fanoutqa.framework import (
        ArticleIndex,
        FanoutOptions,
        open_article_index,
    )

    questions = json.loads(DEV.read_text())[:3]
    write_articles(questions, tmp_path / "a.jsonl")
    index = open_article_index(FanoutOptions(articles=tmp_path / "a.jsonl"), tmp_path)
    search, read = ArticleIndex(index).tools(budget_tokens=100)
    found = json.loads(search.call({"query": "1998 MLB draft first picks"}))
    assert found[0]["title"] == "1998 Major League Baseball draft"
    page = json.loads(read.call({"pageid": found[0]["pageid"], "query": "first picks"}))
    assert "Pat Burrell" in page["content"]
    assert len(page["content"]) <= 100 * 4 // 2  # half the budget per document
    assert "no article" in read.call({"pageid": 1, "query": "x"})
    assert "ValidationError" in search.call({"query": ""})


def test_table_row_counts_unanswered_and_reports_bleurt_absent():
    from groundcover.pipelines.fanoutqa.framework import table_row
    from groundcover.pipelines.runtime.contract.results import ItemResult

    def result(status, gold, generation):
        metrics = string_metrics(gold, generation)
        details = {"setting": "closed-book", "generation": generation or "", "metrics": metrics}
        return ItemResult(
            id=str(gold), status=status, score=metrics["loose"], explanation="x", details=details
        )

    row = table_row([result("ok", "Paris", "Paris."), result("abstained", ["x", "y"], None)])
    assert row["loose"] == 0.5 and row["strict"] == 0.5  # the unanswered question scores 0
    assert row["bleurt"] is None and row["gpt_judge"] is None
    # the unanswered question is scored (0 everywhere, as the original): counted, not "not scored"
    assert row["unanswered"] == 1 and row["not_scored"] == {} and row["setting"] == "closed-book"


def test_an_answer_over_spacys_limit_is_scored_in_pieces(monkeypatch):
    from groundcover.pipelines.fanoutqa import metrics

    assert metrics.pieces("aa bb cc", 5) == ["aa bb", "cc"]
    assert metrics.pieces("abcdefg h", 3) == ["abc", "def", "g h"]  # no space: cut anyway
    # spaCy's limit scaled down (1M chars -> 2,000) so the test stays fast; same code path
    monkeypatch.setattr(metrics.spacy_pipeline(), "max_length", 2_000)
    monkeypatch.setattr(metrics, "SPACY_CHUNK", 1_000)
    metrics.normalize.cache_clear()
    text = "word " * 1_000 + "Lyon and Paris"  # 5,014 chars: one spaCy call would raise
    assert " ".join(metrics.pieces(text, 1_000)) == text
    match = match_answer(["Paris", "Lyon"], text)
    assert match.found and match.score == 1.0
    assert not match_answer(["Marseille"], text).found
    metrics.normalize.cache_clear()


def generated_answers(questions: list[dict], count: int, seed: int = 7) -> list[tuple[Any, str]]:
    """(reference, generation) pairs a model might write about the dev set's answers: the gold
    strings as plurals and possessives of names, in lists (", ", " / ", " and ", bullets),
    in mixed case, wrapped in sentences with pronouns (the parser's subject and object labels
    change the attribute ruler's lemmas), with punctuation and with non-ASCII letters."""
    import random

    rng = random.Random(seed)
    names = [
        leaf
        for q in questions
        for leaf in _leaves(q["answer"])
        if isinstance(leaf, str) and 0 < len(leaf) < 60
    ]
    names += ["Michael Dell", "Bill Hewlett", "David Packard", "Zoë Saldaña", "Škoda", "Αθήνα"]

    def variant(name: str) -> str:
        shapes = [
            lambda s: s + "s",
            lambda s: s + "'s",
            lambda s: s + "’s",
            lambda s: s.upper(),
            lambda s: s.title(),
            lambda s: s.swapcase(),
            lambda s: f'"{s}"',
            lambda s: f"({s})",
            lambda s: s + "!?",
            lambda s: s.replace("a", "á").replace("e", "é"),
            lambda s: s,
        ]
        return rng.choice(shapes)(name)

    frames = [
        "{}",
        "It was {}.",
        "I think it is {}, but I am not sure.",
        "They gave it to {} and it stayed there.",
        "That is what {} did; those who knew {} agree.",
        "The answer: {}",
        "Do you mean {}? Yes, it is {}.",
    ]
    pairs: list[tuple[Any, str]] = [
        (["Michael Dell", "Bill Hewlett"], "… Michael Dells / Bill Hewlett, David Packards")
    ]
    while len(pairs) < count:
        q = rng.choice(questions)
        picked = [variant(rng.choice(names)) for _ in range(rng.randint(1, 4))]
        joiner = rng.choice([", ", " / ", " and ", "\n- ", "; "])
        listed = joiner.join(picked)
        frame = rng.choice(frames)
        pairs.append((q["answer"], frame.format(*([listed] * frame.count("{}")))))
    return pairs


def _leaves(answer: Any) -> list[Any]:
    if isinstance(answer, list):
        return [leaf for a in answer for leaf in _leaves(a)]
    if isinstance(answer, dict):
        return [*answer, *(leaf for v in answer.values() for leaf in _leaves(v))]
    return [answer]


@pytest.mark.skipif(not DEV.is_file(), reason=f"FanOutQA dev set not found at {DEV}")
def test_lemmas_and_matches_equal_the_original_scorer_on_generated_answers():
    """Not only the gold answers: 600 generated ones, each normal form equal to the original
    pipeline's (en_core_web_sm whole, as the authors load it) and each match equal to its."""
    import fanoutqa.norm

    from groundcover.pipelines.fanoutqa.metrics import normalize

    answer_in_text, _ = reference_scorer()
    pairs = generated_answers(json.loads(DEV.read_text()), 600)
    for reference, generation in pairs:
        assert normalize(generation) == fanoutqa.norm.normalize(generation), generation
        expected = answer_in_text(reference, generation)
        got = match_answer(reference, generation)
        assert (got.score, got.found) == (pytest.approx(expected.score), expected.found), (
            reference,
            generation,
        )


def test_only_what_runs_after_the_lemmatizer_is_left_out():
    from groundcover.pipelines.fanoutqa.metrics import after_lemmas, spacy_pipeline

    names = ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "ner"]
    assert after_lemmas(names) == ["ner"]
    assert after_lemmas(["tok2vec", "tagger"]) == []
    pytest.importorskip("spacy")
    # the parser stays: the attribute ruler reads its dependency labels
    assert spacy_pipeline().pipe_names == names[:-1]
