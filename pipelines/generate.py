"""Response generation: answer each question, optionally from background texts only.

The simplest task on the run machinery (dataset + solver + per-item record), and the generator
the ELI5 study and the closed-book FanOutQA setting build on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from serving.client import EvalClient
from serving.templates import PromptTemplate

TEMPLATE = PromptTemplate.load(Path(__file__).parent / "prompts" / "answer.yaml")


class GenerateItem(BaseModel):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)

    id: str
    question: str = Field(min_length=1, validation_alias=AliasChoices("question", "query"))
    contexts: list[str] = Field(default_factory=list)


async def generate_one(
    client: EvalClient, item: GenerateItem, template: PromptTemplate = TEMPLATE
) -> dict[str, Any]:
    messages = template.messages(
        question=item.question, query=item.question, contexts=item.contexts
    )
    result = await client.chat(messages, stage="generate", template=template.id)
    text = result.text.strip()
    return {
        # An empty answer is recorded as an abstention, never as an ok empty string.
        "status": "ok" if text else "abstained",
        "response": text,
        "finish_reason": result.finish_reason,
        "truncated": result.finish_reason == "length",
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
        "explanation": "generated" if text else "the model returned no text",
    }
