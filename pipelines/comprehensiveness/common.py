"""What the three comprehensiveness methods share: items, options, context summarisation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from groundcover import FrameworkOptions, InputFile, ItemContext, load_dir
from groundcover.inputs import Content, GivenAnswers, ModelName, RecordId
from groundcover.nli import NliPlacement

from ...serving.client import Parsed, marker_label_scores
from .formats import Formats
from .rules import Protocol, Rules, rules_for

PROMPTS = load_dir(Path(__file__).parent / "prompts")
Method = Literal["nli", "qa", "e2e"]
Dataset = Literal["items", "wikicontradict", "conflictbank"]


class Item(BaseModel):
    """One evaluated response: the user query, the response, the background texts."""

    model_config = ConfigDict(extra="allow")

    id: RecordId
    query: str = Field(min_length=1)
    response: str
    contexts: list[str] = Field(min_length=1)

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class QueryItem(Item):
    """An item whose response comes from an answers file (``--answers``): its own is optional."""

    response: str = ""


DEFAULT_DATA = {"wikicontradict": "wikicontradict-humaneval", "conflictbank": "conflictbank"}


CROSS_ENCODER_BATCH = 32  # pairs per forward pass of the NLI cross-encoder


def encoder_path(name: str) -> str | None:
    """Where the sentence-transformers model a name stands for lives (``default``: the one a
    package ships), so its content identifies the run."""
    from ...index_build.build import resolve_model

    return resolve_model(name)


class ComprehensivenessOptions(FrameworkOptions, NliPlacement, GivenAnswers):
    input: InputFile | None = Field(
        None, description="items JSONL, or the meta-evaluation data file"
    )
    dataset: Dataset = Field("items", description="items | wikicontradict | conflictbank")
    limit: int | None = Field(None, ge=1, description="only the first N data rows")
    resamples: int = Field(10_000, ge=100, description="bootstrap resamples of LMR intervals")
    method: Method = Field("qa", description="NLI-based, Q&A-based or end-to-end")
    protocol: Protocol = Field("paper", description="paper (authors' code) | spec")
    t_rel: float = Field(
        3.5, ge=1, le=5, description="keep context atoms/questions scoring >= this"
    )
    t_conf: float = Field(2.0, ge=1, le=5, description="keep answers with confidence >= this")
    summarise: bool | None = Field(
        None, description="condense each context to the query first (default: on in paper)"
    )
    nli_backend: Literal["llm", "cross-encoder"] = Field(
        "llm", description="NLI by the judge model or by a cross-encoder (nli_model)"
    )
    nli_model: ModelName | None = Field(
        None, description="NLI checkpoint (name or path) for cross-encoder"
    )
    nli_device: str = "cpu"
    prune_below: float | None = Field(
        None, ge=-1, le=1, description="skip NLI pairs with cosine similarity below this (spec)"
    )
    prune_model: Annotated[str, Content("model", resolve=encoder_path)] = Field(
        "default", description="sentence-transformers model for pruning"
    )
    tools: bool = Field(False, description="comparator may call the units tool (server tool calls)")
    list_max_tokens: int = Field(2048, ge=64, description="max tokens for list-producing stages")
    list_max_items: int = Field(25, ge=1, le=200, description="most items per list (vLLM)")
    line_max_chars: int = Field(200, ge=20, le=2000, description="longest list line (vLLM)")
    export_graphs: bool = True

    @model_validator(mode="after")
    def _default_data(self) -> ComprehensivenessOptions:
        """A meta-evaluation without a data file reads its catalogued dataset."""
        if self.input is None and self.dataset in DEFAULT_DATA:
            self.input = Path(DEFAULT_DATA[self.dataset])
        return self

    @model_validator(mode="after")
    def _answers_for_items(self) -> ComprehensivenessOptions:
        if self.answers is not None and self.dataset != "items":
            raise ValueError("answers: only items are scored from an answers file")
        return self

    @model_validator(mode="after")
    def _nli_model_needed(self) -> ComprehensivenessOptions:
        if self.nli_backend == "cross-encoder" and not self.nli_model:
            raise ValueError("nli_backend cross-encoder needs nli_model (checkpoint name or path)")
        if self.nli_on_ray and self.nli_backend != "cross-encoder":
            raise ValueError("nli_replicas/nli_app: Ray runs the cross-encoder (--nli-backend)")
        if self.prune_below is not None and not self.rules.pruning_allowed:
            raise ValueError("prune_below: pruning is off in the paper protocol (use spec)")
        return self

    def cross_encoder(self) -> tuple[str, str, int] | None:
        if self.method != "nli" or self.nli_backend != "cross-encoder" or not self.nli_model:
            return None
        return self.nli_model, self.nli_device, CROSS_ENCODER_BATCH

    @property
    def rules(self) -> Rules:
        """The rules ``protocol`` (and ``summarise``) choose; one object per combination."""
        return rules_for(self.protocol, self.summarise)


LABELS = {str(i): float(i) for i in range(1, 6)}
LOGPROBS = {"logprobs": True, "top_logprobs": 20}


def weighted_scores(
    parsed: Parsed, marker: str, ints: list[int], *, any_integer: bool = False
) -> tuple[list[float], bool]:
    """Probability-weighted scores at each '[<marker>: n]' when they line up with the parsed
    items; else the parsed integers (and False, so the record says they were not weighted)."""
    tokens = parsed.result.token_logprobs if parsed.result else []
    scores = marker_label_scores(tokens, marker, LABELS, any_integer=any_integer)
    if len(scores) == len(ints) and all(s.status == "ok" for s in scores):
        return [s.score for s in scores], True  # type: ignore[misc]
    return [float(i) for i in ints], False


def formats(options: ComprehensivenessOptions) -> Formats:
    """The output-format regexes of the stages, bounded by the options."""
    return Formats(options.list_max_items, options.line_max_chars)


def source_ids(contexts: list[str]) -> list[str]:
    return [f"c{i}" for i in range(1, len(contexts) + 1)]


async def summarise_contexts(ctx: ItemContext, query: str, contexts: list[str]) -> list[str]:
    """Listing-1 style condensation; a context with nothing relevant becomes empty."""
    template = PROMPTS["summarise"]

    async def one(text: str) -> str:
        parsed = await ctx.ask(
            template,
            "summarise",
            lambda t: t.strip(),
            "the summary text or None",
            {"query": query, "text": text},
            max_tokens=ctx.options.list_max_tokens,
        )
        summary = parsed.value
        return "" if summary.strip().strip(".").lower() == "none" else summary

    return list(await asyncio.gather(*(one(t) for t in contexts)))
