"""Our FanOutQA string metrics against the original scorer (`fanoutqa` package), dev set."""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

import pytest

from pipelines.fanoutqa.metrics import aggregate, answer_text, match_answer, rouge, string_metrics
from tests.conftest import SHARED

DEV = SHARED / "data" / "fanoutqa" / "fanout-final-dev.json"


def reference_scorer():
    """The package's string scorer, loaded by file path: importing fanoutqa.eval would build an
    OpenAI client and import TensorFlow BLEURT, neither of which the string metrics use."""
    pytest.importorskip("fanoutqa")
    import fanoutqa
    import fanoutqa.norm
    import spacy

    from pipelines.fanoutqa.metrics import SPACY_PACKAGE

    fanoutqa.norm.nlp.pipe = spacy.load(SPACY_PACKAGE)  # offline en_core_web_sm 3.8.0
    root = Path(fanoutqa.__file__).parent / "eval"
    modules = {}
    for name in ("string", "utils"):
        spec = importlib.util.spec_from_file_location(
            f"fanoutqa_reference_{name}", root / f"{name}.py"
        )
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
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
