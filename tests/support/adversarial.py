"""Adversarial model outputs: what a broken, weak or hostile evaluator can send back.

``pool(seed, n)`` mixes families (empty, whitespace, truncated, wrong format, prose around an
answer, unicode confusables, out-of-range numbers, "10" on a 0-5 scale, duplicates, huge outputs,
HTML/script, nested JSON, refusals) with near-valid outputs of every stage format, so replaying
it exercises the parsers' edges rather than only their rejections.
"""

from __future__ import annotations

import random


def huge(text: str, size: int = 50_000) -> str:
    """``text`` repeated to about ``size`` characters."""
    return text * (size // len(text) + 1)


NEAR_VALID = [
    "- A fact: Fact\n",
    "* A statement.\n",
    "* Is it so? [Relevance: 5]\n",
    "A: yes [Confidence: 4]\n",
    "x\na - b [equivalent]\n",
    "entailment",
    "neutral",
    "[Covered statements]\n- a [1]\n[Uncovered statements]\n- b [2]\n",
    '{"topic_id": 1, "evidence": [1]}\n',
    '{"topic": "an aspect"}\n',
    "- a claim\n",
    "3",
    "No Issues",
    "supported",
    "missing",
    "attempted",
    "A",
    "B",
    "The answer is Paris.",
]
FAMILIES = {
    "empty": lambda r: "",
    "whitespace": lambda r: r.choice([" ", "\n\n", "\t \n", "\u00a0"]),
    "truncated": lambda r: r.choice(NEAR_VALID)[: r.randint(0, 12)],
    "wrong_format": lambda r: r.choice(
        [
            "Sure! Here you go.",
            "1. 2. 3.",
            "{}",
            "[]",
            "null",
            "true",
            "<answer/>",
            "###",
            "- \n- \n",
        ]
    ),
    "prose_around": lambda r: f"Let me think.\n{r.choice(NEAR_VALID)}\nHope this helps!",
    "confusables": lambda r: r.choice(
        [
            "ｅｎｔａｉｌｍｅｎｔ",
            "[Relevance: ５]",
            "Α: yes [Confidence: 4]",
            "－ a claim",
            "[Cоvered statements]\n- a [1]",
        ]
    ),
    "out_of_range": lambda r: r.choice(
        [
            "[Relevance: 9]",
            "Rating: 7",
            "A: x [Confidence: 0]",
            '{"topic_id": 99, "evidence": [-1]}',
            "- a [0]\n",
        ]
    ),
    "ten_on_five": lambda r: r.choice(["10", "Rating: 10/10", "[Relevance: 10]"]),
    "duplicates": lambda r: r.choice(NEAR_VALID) * r.randint(2, 5),
    "huge": lambda r: huge(r.choice(NEAR_VALID)),
    "html": lambda r: (
        r.choice(["<script>alert(1)</script>", "</script><b>x</b>", "<img src=x onerror=alert(1)>"])
        + r.choice(NEAR_VALID)
    ),
    "nested_json": lambda r: r.choice(
        [
            '{"a": {"b": {"c": [1, {"d": 2}]}}}',
            '{"topic_id": {"x": 1}, "evidence": [[1]]}',
            '{"topic": ["a"]}',
        ]
    ),
    "refusal": lambda r: r.choice(
        ["I'm sorry, but I can't help with that.", "As an AI, I cannot judge this."]
    ),
    "near_valid": lambda r: r.choice(NEAR_VALID),
}


def pool(seed: int = 0, n: int = 1400) -> list[tuple[str, str]]:
    """(family, output) pairs, every family about equally often."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    return [(names[i % len(names)], FAMILIES[names[i % len(names)]](rng)) for i in range(n)]
