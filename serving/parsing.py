"""Tolerant parsing of model output: JSON buried in prose or code fences, and fixed choices."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


class ParseError(ValueError):
    """A model's output that a stage's parser cannot read; its message is what the re-ask tells
    the model (the stage asks again, then records the output as unparseable)."""


def extract_json(text: str) -> Any:
    """The first JSON object or array in ``text``: whole text, fenced block, or balanced span."""
    if text is None:
        raise ParseError("empty output")
    candidates = [text.strip()] + [m.strip() for m in _FENCE.findall(text)]
    for candidate in candidates:
        try:
            return json.loads(candidate, strict=False)
        except json.JSONDecodeError:
            pass
    decoder = json.JSONDecoder(strict=False)
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
            return value
        except json.JSONDecodeError:
            continue
    snippet = text.strip().replace("\n", " ")[:80]
    raise ParseError(f"no JSON value found in output: {snippet!r}")


def match_choice(text: str, choices: list[str]) -> str:
    """The one choice the output names: exact (case-insensitive) first, else a unique word match."""
    cleaned = (text or "").strip().strip("\"'`.*:").strip()
    for choice in choices:
        if cleaned.lower() == choice.lower():
            return choice
    found = [
        c for c in choices if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", text or "", re.IGNORECASE)
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ParseError(f"output names none of {choices}: {cleaned[:80]!r}")
    raise ParseError(f"output names several of {choices}: {cleaned[:80]!r}")


BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.*\S)\s*$")


def bullets(text: str) -> list[str]:
    """The items of '- item' / '* item' / '1. item' lines, in order."""
    return [m.group(1) for line in (text or "").splitlines() if (m := BULLET.match(line))]


def bullet_list(text: str) -> list[str]:
    """A list answer: its bullet items, repeated ones once; none at all is unreadable."""
    items = list(dict.fromkeys(item.strip() for item in bullets(text)))
    if not items:
        raise ParseError("expected one '- <item>' per line")
    return items
