"""Response generation: one answer per question, optionally from its background texts only.

The simplest framework on the runtime (dataset + solver, no score), and the answer generator the
ELI5 study builds on (template ``answer_from_texts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from groundcover import Framework, FrameworkOptions, InputFile, ItemContext, ItemResult, load_dir
from groundcover.inputs import RecordId, read_jsonl

PROMPTS = load_dir(Path(__file__).parent / "prompts" / "answering")


class GenerateItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: RecordId
    question: str = Field(min_length=1, validation_alias=AliasChoices("question", "query"))
    contexts: list[str] = Field(default_factory=list)


class GenerateOptions(FrameworkOptions):
    input: InputFile = Field(description="questions JSONL: id, question, optional contexts")
    template: Literal["answer", "answer_from_texts"] = Field(
        "answer", description="prompt: answer, or answer_from_texts (from the contexts only)"
    )


class Generate(Framework[GenerateOptions, GenerateItem]):
    name = "generate"
    Options = GenerateOptions
    prompts = PROMPTS
    roles = {"answer": "writes the answers"}
    stage_roles = {"generate": "answer"}

    def known_calls(self, item: GenerateItem, options: GenerateOptions) -> dict[str, int]:
        return {"generate": 1}

    def load(self, options: GenerateOptions) -> Sequence[GenerateItem]:
        return read_jsonl(options.input, GenerateItem)

    def prompt_ids(self, options: GenerateOptions) -> dict[str, str]:
        return {options.template: PROMPTS[options.template].id}

    async def solve(self, item: GenerateItem, ctx: ItemContext) -> ItemResult:
        template = PROMPTS[ctx.options.template]
        messages = template.messages(
            question=item.question, query=item.question, contexts=item.contexts
        )
        result = await ctx.chat(messages, stage="generate", template=template.id)
        text = result.text.strip()
        ctx.details |= {
            "response": text,
            "finish_reason": result.finish_reason,
            "truncated": result.finish_reason == "length",
        }
        if not text:  # an empty answer is an abstention, never an ok empty string
            return ctx.result("abstained", None, "the model returned no text")
        return ctx.result("ok", None, f"answered in {result.completion_tokens} tokens")


GENERATE = Generate()
STUDIES = [GENERATE]
