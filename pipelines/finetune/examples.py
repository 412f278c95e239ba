"""Training examples for a claim extractor: exactly the conversation ICAT's claim stage sends
(template ``extract_claims``), answered with the teacher's claims in ICAT's output format."""

from __future__ import annotations

from typing import Any

from ..shared.claims import CLAIMS_PROMPT

TEMPLATE = CLAIMS_PROMPT


def claims_text(claims: list[str]) -> str:
    return "".join(f"- {claim}\n" for claim in claims)


def chat_example(paragraph: str, claims: list[str], **meta: Any) -> dict[str, Any]:
    messages = TEMPLATE.messages(response=paragraph)
    return {
        "messages": [*messages, {"role": "assistant", "content": claims_text(claims)}],
        "template": TEMPLATE.id,
        "paragraph": paragraph,
        **meta,
    }
