"""Claim extraction, as ICAT's first stage asks it and as the claim extractors are fine-tuned
and evaluated on it (``finetune``): the prompt (ICAT's output format: one ``- <claim>`` per
line, or ``None``), its parser and the stage itself, constrained on vLLM to that format."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from groundcover import ItemContext, ParseError, load_dir

CLAIMS_PROMPT = load_dir(Path(__file__).parent / "prompts" / "claims")["extract_claims"]

_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*(.+?)\s*$")
_NONE = {"none", "none.", "no claims", "no claims."}


def parse_claims(text: str) -> list[str]:
    """One claim per line ('- ' bullets or numbers; bare lines too); 'None' = no claim."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        raise ParseError("expected one claim per line, or None")
    if len(lines) == 1 and lines[0].lower() in _NONE:
        return []
    claims = []
    for line in lines:
        match = _BULLET.match(line)
        claim = (match.group(1) if match else line).strip()
        if claim and claim.lower() not in _NONE and not claim.endswith(":"):
            claims.append(claim)
    if not claims:
        raise ParseError("expected one claim per line, or None")
    return list(dict.fromkeys(claims))


def claims_regex(options: Any) -> str:
    """What the stage constrains its output to: at most ``list_max_items`` lines of at most
    ``line_max_chars`` characters each, or ``None`` (the options of ICAT and the fine-tuning)."""
    line = rf"- [^\n]{{1,{options.line_max_chars}}}\n"
    return rf"(({line}){{1,{options.list_max_items}}}|None\n?)"


async def extract_claims(ctx: ItemContext, response: str) -> list[str]:
    """The claims of ``response`` (stage ``claims``; none for an empty response)."""
    if not response.strip():
        return []
    parsed = await ctx.ask(
        CLAIMS_PROMPT,
        "claims",
        parse_claims,
        "one '- <claim>' per line, or None",
        {"response": response},
        regex=claims_regex(ctx.options),
    )
    return parsed.value
