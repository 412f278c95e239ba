"""Connect a pipeline to its evaluator: a given endpoint, or a vLLM server started for the run."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from pipelines.config import EvaluatorConfig
from serving.cache import ResponseCache
from serving.client import EvalClient
from serving.launcher import ServerSpec, VLLMServer
from serving.registry import PRESETS, lora_adapter, resolve


def served_model_name(cfg: EvaluatorConfig) -> str:
    """The name requests carry: the preset name for servers we start, else as configured."""
    return cfg.model if cfg.endpoint else resolve(cfg.model).name


def model_record(cfg: EvaluatorConfig) -> dict:
    preset = resolve(cfg.model) if not cfg.endpoint else None
    return {
        "model": cfg.model,
        "hub_id": preset.hub_id if preset else None,
        "endpoint": cfg.endpoint or "started for this run",
        "adapter": cfg.adapter,
        "adapters": cfg.adapters,
    }


@contextlib.asynccontextmanager
async def open_evaluator(
    cfg: EvaluatorConfig, run_dir: Path, cache_path: Path | None
) -> AsyncIterator[EvalClient]:
    cache = ResponseCache(cache_path) if cache_path else None
    server = None
    try:
        base_url = cfg.endpoint
        defaults = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        if cfg.model in PRESETS or any(p.hub_id == cfg.model for p in PRESETS.values()):
            defaults |= resolve(cfg.model).sampling_defaults()  # e.g. gpt-oss reasoning effort
        if base_url is None:
            preset = resolve(cfg.model)
            loras = [lora_adapter(n, p, preset.name) for n, p in cfg.adapters.items()]
            spec = ServerSpec(model=cfg.model, loras=loras, max_model_len=cfg.max_model_len)
            server = VLLMServer(spec, run_dir / "serve.log").start()
            base_url = server.base_url
        client = EvalClient(
            base_url,
            served_model_name(cfg),
            api_key=cfg.api_key(),
            concurrency=cfg.concurrency,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            cache=cache,
            default_params=defaults,
            vllm_extensions=cfg.vllm_extensions,
        )
        async with client:
            yield client
    finally:
        if server is not None:
            server.stop()
        if cache is not None:
            cache.close()
