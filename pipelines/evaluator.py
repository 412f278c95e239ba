"""Connect a run to its evaluator: a given endpoint, or a vLLM server started for the run.

The model address (preset / directory / hub id, endpoint, adapter) is resolved once, in
``EvaluatorConfig.ref()``; here it becomes a client whose every request goes to the adapter when
one is asked for, after checking that the server really has it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from pipelines.config import EvaluatorConfig, UserError
from serving.cache import ResponseCache
from serving.client import EvalClient
from serving.launcher import ServerSpec, VLLMServer
from serving.registry import lora_adapter, resolve


def model_record(cfg: EvaluatorConfig) -> dict:
    return cfg.ref().describe() | {"adapters": cfg.adapters}


def sampling_defaults(cfg: EvaluatorConfig) -> dict:
    defaults = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
    preset = cfg.ref().preset
    if preset is not None:
        defaults |= preset.sampling_defaults()  # e.g. gpt-oss reasoning effort
    return defaults


def start_server(spec: ServerSpec, cfg: EvaluatorConfig, run_dir: Path):
    """One vLLM server, or ``cfg.replicas`` of them behind one Ray Serve LLM app."""
    if cfg.replicas > 1 or cfg.ray_address:
        from serving.ray_serve import RayReplicas

        return RayReplicas(spec, cfg.replicas, address=cfg.ray_address).start()
    return VLLMServer(spec, run_dir / "serve.log").start()


@contextlib.asynccontextmanager
async def open_evaluator(
    cfg: EvaluatorConfig, run_dir: Path, cache_path: Path | None
) -> AsyncIterator[EvalClient]:
    ref = cfg.ref()
    cache = ResponseCache(cache_path) if cache_path else None
    server = None
    gone = None
    try:
        base_url, adapter_prefix = cfg.endpoint, cfg.adapter_prefix
        if base_url is None:
            preset = resolve(cfg.model)
            loras = [lora_adapter(n, p, preset.name, cfg.model) for n, p in cfg.adapters.items()]
            spec = ServerSpec(model=cfg.model, loras=loras, max_model_len=cfg.max_model_len)
            server = start_server(spec, cfg, run_dir)
            base_url, adapter_prefix, gone = server.base_url, server.adapter_prefix, server.gone
        client = EvalClient(
            base_url,
            ref.base_name,
            adapter=ref.adapter,
            adapter_prefix=adapter_prefix,
            api_key=cfg.api_key(),
            concurrency=cfg.concurrency,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            cache=cache,
            default_params=sampling_defaults(cfg),
            vllm_extensions=cfg.vllm_extensions,
            gone=gone,
        )
        async with client:
            if ref.adapter and not adapter_prefix:  # Serve lists no multiplexed adapter
                served = await client.served_models()
                if served is not None and ref.adapter not in served:
                    raise UserError(
                        f"adapter {ref.adapter!r} is not served at {base_url} "
                        f"(it serves: {', '.join(served)})"
                    )
            yield client
    finally:
        if server is not None:
            server.stop()
        if cache is not None:
            cache.close()
