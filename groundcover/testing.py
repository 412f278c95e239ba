"""Exact-score tests of a framework: a scripted judge. ``ScriptedClient`` is the real
``EvalClient`` with only its network call replaced, so caching, accounting, re-asks, label
scoring and parsing all run the production code; each stage answers from its script (a string,
a list in call order, or a function of the rendered prompt), and an output a real server could
not give under the request's constrained decoding fails the test. Give it to ``evaluate``::

    from groundcover import evaluate
    from groundcover.testing import ScriptedClient, field_of

    def relevance(prompt):
        return "yes" if "Paris" in field_of(prompt, "Answer") else "no"

    judge = ScriptedClient({"relevance": relevance})
    done = evaluate(MY_FRAMEWORK, options={"input": "items.jsonl"}, client=judge)
    assert [r.score for r in done.results] == [1.0, 0.0]
    assert len(judge.stage_calls("relevance")) == 2  # requests counted per stage
"""

from __future__ import annotations

from .serving.scripted import (
    Call,
    Reply,
    Sampled,
    ScriptedClient,
    by_text,
    field_of,
    label,
    marked,
    rated,
    tool_call,
)

__all__ = [
    "Call",
    "Reply",
    "Sampled",
    "ScriptedClient",
    "by_text",
    "field_of",
    "label",
    "marked",
    "rated",
    "tool_call",
]
