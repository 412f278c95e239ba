"""The example's own exact-score test, as a framework author writes one: the scripted judge of
``groundcover.testing`` answers each stage by the prompt, ``evaluate`` runs the framework object,
and the scores are the ones worked out by hand (yes 1, partly 0.5, no 0)."""

from __future__ import annotations

import json

from answer_relevance import RELEVANCE

from groundcover import evaluate
from groundcover.testing import ScriptedClient, field_of

ANSWERS = {"Paris.": "yes", "Blue, mostly.": "partly", "I like tea.": "no"}


def test_each_label_scores_as_worked_out_by_hand(tmp_path):
    items = tmp_path / "items.jsonl"
    rows = [
        {"id": f"q{k}", "question": f"Question {k}?", "answer": answer}
        for k, answer in enumerate(ANSWERS)
    ]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge = ScriptedClient({"relevance": lambda prompt: ANSWERS[field_of(prompt, "Answer")]})
    done = evaluate(
        RELEVANCE,
        options={"input": str(items)},
        client=judge,
        run={"run_dir": str(tmp_path / "run"), "cache": None},
    )
    assert [r.score for r in done.results] == [1.0, 0.5, 0.0]
    assert done.tables is not None and done.tables["mean"] == 0.5
    assert len(judge.stage_calls("relevance")) == 3  # one request per item, none re-asked
