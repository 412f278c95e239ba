"""End-to-end comprehensiveness: one call returns covered and uncovered statements (SPEC §1).
Each listed statement is one cluster; the paper protocol counts a repeated one as listed."""

from __future__ import annotations

from typing import Any

from groundcover import ItemContext

from .common import PROMPTS, Item, formats
from .parsers import parse_coverage


async def evaluate(ctx: ItemContext, item: Item, contexts: list[str]) -> dict[str, Any]:
    numbered = [text for text in contexts if text.strip()]
    repeats_listed = ctx.options.rules.e2e_repeats_listed
    parsed = await ctx.ask(
        PROMPTS["coverage"],
        "coverage",
        lambda t: parse_coverage(t, len(numbered), repeats_listed),
        "the two lists '[Covered statements]' and '[Uncovered statements]', each line "
        "'- <statement> [<text ids>]'",
        {"query": item.query, "contexts": numbered, "response": item.response},
        regex=formats(ctx.options).coverage(len(numbered)),
        max_tokens=ctx.options.list_max_tokens,
    )
    covered, uncovered = parsed.value
    # Text ids refer to the non-empty contexts in order; map them back to c1..cn.
    original = [f"c{i}" for i, text in enumerate(contexts, 1) if text.strip()]

    def records(statements, prefix):
        return [
            {"id": f"{prefix}{k}", "text": s.text, "sources": [original[i - 1] for i in s.sources]}
            for k, s in enumerate(statements, 1)
        ]

    return {"covered": records(covered, "in"), "uncovered": records(uncovered, "out")}
