"""What the three comprehensiveness methods share: inputs, configuration, the per-item context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipelines.comprehensiveness.formats import Formats
from serving.client import EvalClient, Parsed, StageUsage
from serving.templates import PromptTemplate, load_dir

PROMPTS = load_dir(Path(__file__).parent / "prompts")
Method = Literal["nli", "qa", "e2e"]


class Item(BaseModel):
    """One evaluated response: the user query, the response, the background texts."""

    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    id: str
    query: str = Field(min_length=1)
    response: str
    contexts: list[str] = Field(min_length=1)

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ComprehensivenessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Method = "qa"
    t_rel: float = Field(
        3.5, ge=1, le=5, description="keep context atoms/questions scoring >= this"
    )
    t_conf: float = Field(2.0, ge=1, le=5, description="keep answers with confidence >= this")
    summarise: bool = Field(False, description="condense each context to the query first")
    nli_backend: Literal["llm", "cross-encoder"] = "llm"
    nli_model: str | None = Field(
        None, description="NLI checkpoint (name or path) for cross-encoder"
    )
    nli_device: str = "cpu"
    tools: bool = Field(False, description="comparator may call the units tool (server tool calls)")
    max_reasks: int = Field(2, ge=0, le=5)
    list_max_tokens: int = Field(2048, ge=64, description="max tokens for list-producing stages")
    list_max_items: int = Field(25, ge=1, le=200, description="most items per list (vLLM)")
    line_max_chars: int = Field(200, ge=20, le=2000, description="longest list line (vLLM)")
    export_graphs: bool = True

    @model_validator(mode="after")
    def _nli_model_needed(self) -> ComprehensivenessConfig:
        if self.nli_backend == "cross-encoder" and not self.nli_model:
            raise ValueError("nli_backend cross-encoder needs nli_model (checkpoint name or path)")
        return self


class StageFailed(Exception):
    """A stage's output stayed unparseable after the re-asks: the item is recorded as such."""

    def __init__(self, stage: str, parsed: Parsed | None = None, error: str | None = None):
        self.stage = stage
        self.error = error or (parsed.error if parsed else "unparseable")
        self.outputs = parsed.outputs if parsed else []
        super().__init__(f"{stage}: {self.error}")


@dataclass
class Context:
    """Everything one item's evaluation needs, plus its own accounting."""

    client: EvalClient
    config: ComprehensivenessConfig
    nli: Any = None  # an NliJudge for the NLI method
    meter: dict[str, StageUsage] = field(default_factory=dict)

    @property
    def formats(self) -> Formats:
        return Formats(self.config.list_max_items, self.config.line_max_chars)

    async def ask(
        self,
        template: PromptTemplate,
        stage: str,
        parse: Callable[[str], Any],
        expected: str,
        values: dict[str, Any],
        regex: str | None = None,
        **params: Any,
    ) -> Parsed:
        """One stage call: template, format constraint (vLLM), parse, re-asks, accounting."""
        if regex and self.client.vllm_extensions:
            params["extra_body"] = {"structured_outputs": {"regex": regex}}
        parsed = await self.client.parsed(
            template.messages(**values), parse, expected, self.config.max_reasks,
            stage=stage, template=template.id, meter=self.meter, **params,
        )  # fmt: skip
        if not parsed.ok:
            raise StageFailed(stage, parsed)
        return parsed

    def usage(self) -> dict[str, dict[str, Any]]:
        return {stage: u.as_dict() for stage, u in self.meter.items()}


def source_ids(contexts: list[str]) -> list[str]:
    return [f"c{i}" for i in range(1, len(contexts) + 1)]


async def summarise_contexts(ctx: Context, query: str, contexts: list[str]) -> list[str]:
    """Listing-1 style condensation; a context with nothing relevant becomes empty."""
    import asyncio

    template = PROMPTS["summarise"]

    async def one(text: str) -> str:
        parsed = await ctx.ask(
            template, "summarise", lambda t: t.strip(), "the summary text or None",
            {"query": query, "text": text}, max_tokens=ctx.config.list_max_tokens,
        )  # fmt: skip
        summary = parsed.value
        return "" if summary.strip().strip(".").lower() == "none" else summary

    return list(await asyncio.gather(*(one(t) for t in contexts)))
