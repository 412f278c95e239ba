"""N vLLM replicas behind one OpenAI-compatible URL: a Ray Serve LLM app.

``RayReplicas(spec, replicas=N)`` deploys ``ray.serve.llm.build_openai_app`` with one
``LLMConfig``: N replicas of the model (one GPU each on GPU nodes -- ``tensor_parallel_size``
GPUs with a TP preset -- and one CPU bundle each on CPU-only machines, with the CPU engine flags the
plain launcher uses). The app answers at ``http://127.0.0.1:PORT/v1`` like a single vLLM server,
so the evaluator client stays the one request path; Serve routes each request to a replica and
restarts a replica that dies. ``address`` joins an existing cluster (``ray start --head``);
without it a local Ray is started with enough logical CPUs for the controller, the proxy and the
replicas.

LoRA adapters go through Serve's multiplexing: a request for ``BASE:ADAPTER`` is routed to a
replica that has the adapter loaded (or loads it there, ``serving.ray_lora``), so the served name
of an adapter is ``adapter_model(name)``, not the bare name a plain vLLM server uses.

Not yet: an API key on the Serve proxy -- the app binds loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import httpx

from serving.launcher import (
    CPU_ENV,
    ServerSpec,
    ServerStartError,
    engine_device,
    is_loopback,
    lora_rank_for,
)
from serving.ray_cluster import cluster_gone, connect
from serving.registry import model_source

APP = "groundcover"


def llm_config(spec: ServerSpec, replicas: int, device: str) -> Any:
    from ray.serve.llm import LLMConfig

    preset = spec.preset
    engine: dict[str, Any] = {
        "dtype": preset.dtype,
        "max_model_len": spec.max_model_len or preset.max_model_len,
    }
    if device == "cpu":  # the flags measured to work on the CPU build (see ServerSpec.command)
        engine |= {
            "distributed_executor_backend": "uni",
            "enforce_eager": True,
            "kv_cache_memory_bytes": _bytes(spec.kv_cache_bytes),
            "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        }
        bundles = [{"CPU": 1}]
    else:
        engine["tensor_parallel_size"] = preset.tensor_parallel_size
        bundles = [{"GPU": 1, "CPU": 1}] * preset.tensor_parallel_size
    env = (CPU_ENV if device == "cpu" else {}) | spec.env
    adapters: dict[str, Any] = {}
    if spec.loras:  # every replica can load every adapter; Serve decides which one does
        from serving.ray_lora import ADAPTERS_ENV, AdapterServer

        engine |= {"enable_lora": True, "max_lora_rank": lora_rank_for(spec.loras),
                   "max_loras": len(spec.loras)}  # fmt: skip
        env = env | {ADAPTERS_ENV: json.dumps({a.name: a.path for a in spec.loras})}
        adapters = {"server_cls": AdapterServer,
                    "lora_config": {"max_num_adapters_per_replica": len(spec.loras)}}  # fmt: skip
    return LLMConfig(
        model_loading_config={"model_id": preset.name, "model_source": model_source(preset)},
        deployment_config={"num_replicas": replicas, "max_ongoing_requests": 256},
        placement_group_config={"bundles": bundles},
        engine_kwargs=engine,
        runtime_env={"env_vars": env},
        log_engine_metrics=False,
        **adapters,
    )


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return (
        int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)
    )


class RayReplicas:
    """Start, use (``base_url``, ``served_name``), stop; a context manager like VLLMServer."""

    def __init__(self, spec: ServerSpec, replicas: int, *, address: str | None = None,
                 port: int | None = None):  # fmt: skip
        if not is_loopback(spec.host):
            raise ServerStartError("the Ray Serve app binds loopback only (it has no API key)")
        from serving.launcher import free_port

        self.spec, self.replicas, self.address = spec, replicas, address
        self.port = port or spec.port or free_port()
        self.device = engine_device() if spec.device == "auto" else spec.device
        self.started_ray = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def served_name(self) -> str:
        return self.spec.preset.name

    @property
    def adapter_prefix(self) -> str:
        """What turns an adapter's name into the model name Serve routes: ``BASE:ADAPTER``."""
        return f"{self.served_name}:"

    def start(self, timeout: float = 900.0) -> RayReplicas:
        import ray
        from ray import serve
        from ray.serve.llm import build_openai_app

        config = llm_config(self.spec, self.replicas, self.device)  # converts the model first
        if not ray.is_initialized():
            # controller + proxy + router + replicas each hold a logical CPU of a local Ray
            connect(self.address, num_cpus=max(8, 2 * self.replicas + 4))
            self.started_ray = True
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        serve.run(build_openai_app({"llm_configs": [config]}), name=APP, blocking=False)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                models = httpx.get(f"{self.base_url}/models", timeout=5).json()
                if any(m.get("id") == self.served_name for m in models.get("data", [])):
                    return
            time.sleep(1.0)
        self.stop()
        raise ServerStartError(f"Ray Serve app not ready after {timeout:.0f}s")

    def gone(self) -> str | None:
        """Why the app cannot come back (its cluster is unreachable), for the client to stop
        retrying before Ray ends this process; None while the cluster answers."""
        return cluster_gone(timeout=0.5)

    def replica_pids(self) -> list[int]:
        """Process ids of the model replicas (each runs its engine in-process on CPU); the
        deployment is named after its server class (``LLMServer``, or ``AdapterServer`` when
        adapters are served)."""
        import ray

        pids = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"] if isinstance(entry, dict) else entry
            namespace = entry.get("namespace", "serve") if isinstance(entry, dict) else "serve"
            if "SERVE_REPLICA" in name and ("LLMServer" in name or "AdapterServer" in name):
                actor = ray.get_actor(name, namespace=namespace)
                pids.append(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid())))
        return sorted(pids)

    def stop(self) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        with contextlib.suppress(Exception):
            serve.delete(APP)
        with contextlib.suppress(Exception):
            serve.shutdown()
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False

    def __enter__(self) -> RayReplicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
