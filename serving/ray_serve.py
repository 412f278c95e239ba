"""N vLLM replicas behind one OpenAI-compatible URL: a Ray Serve LLM app.

``RayReplicas(spec, replicas=N)`` deploys ``ray.serve.llm.build_openai_app`` with one
``LLMConfig``: N replicas of the model (one GPU each on GPU nodes -- ``tensor_parallel_size``
GPUs with a TP preset -- and one CPU bundle each on CPU-only machines, with the CPU engine flags the
plain launcher uses). The app answers at ``http://127.0.0.1:PORT/v1`` like a single vLLM server,
so the evaluator client stays the one request path; Serve routes each request to a replica and
restarts a replica that dies. The app's Ray driver is a child process (``_host``), so a lost
cluster ends that child, not the run. ``address`` joins an existing cluster (``ray start --head``);
without it a local Ray is started with enough logical CPUs for the controller, the proxy and the
replicas.

LoRA adapters go through Serve's multiplexing: a request for ``BASE:ADAPTER`` is routed to a
replica that has the adapter loaded (or loads it there, ``serving.ray_lora``), so the served name
of an adapter is ``adapter_prefix + name``, not the bare name a plain vLLM server uses.

Not yet: an API key on the Serve proxy -- the app binds loopback only.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
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
from serving.ray_cluster import connect, unreachable
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


def _host(conn: Connection, spec: ServerSpec, replicas: int, address: str | None, port: int,
          device: str, timeout: float) -> None:  # fmt: skip
    """The app's Ray driver, in a child process: deploys, reports, answers, and on "stop"
    deletes the app and leaves Ray. Messages are JSON."""
    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    def say(message: dict[str, Any]) -> None:
        conn.send_bytes(json.dumps(message).encode())

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the run; it stops us in order
    try:
        # controller + proxy + router + replicas each hold a logical CPU of a local Ray
        connect(address, num_cpus=max(8, 2 * replicas + 4))
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = llm_config(spec, replicas, device)
        serve.run(build_openai_app({"llm_configs": [config]}), name=APP, blocking=False)
        _wait_ready(f"http://127.0.0.1:{port}/v1", spec.preset.name, timeout)
    except Exception as exc:
        say({"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"})
        return
    say({"ready": True, "gcs": ray.get_runtime_context().gcs_address})
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:  # the run is gone (even SIGKILLed): take the app down with it
            break
        if request.get("stop"):
            break
        if request.get("pids"):
            say({"pids": _replica_pids()})
    with contextlib.suppress(Exception):
        serve.delete(APP)
    with contextlib.suppress(Exception):
        serve.shutdown()
    ray.shutdown()


def _wait_ready(base_url: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            models = httpx.get(f"{base_url}/models", timeout=5).json()
            if any(m.get("id") == name for m in models.get("data", [])):
                return
        time.sleep(1.0)
    raise ServerStartError(f"Ray Serve app not ready after {timeout:.0f}s")


def _replica_pids() -> list[int]:
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


class RayReplicas:
    """Start, use (``base_url``, ``served_name``), stop; a context manager like VLLMServer.

    The app's Ray driver is a child process, as a plain server is: Ray ends a driver without an
    exception when its raylet or the cluster's GCS dies, and the run must outlive that to say so
    in one line (``gone``) and stop cleanly."""

    def __init__(self, spec: ServerSpec, replicas: int, *, address: str | None = None,
                 port: int | None = None):  # fmt: skip
        if not is_loopback(spec.host):
            raise ServerStartError("the Ray Serve app binds loopback only (it has no API key)")
        from serving.launcher import free_port

        self.spec, self.replicas, self.address = spec, replicas, address
        self.port = port or spec.port or free_port()
        self.device = engine_device() if spec.device == "auto" else spec.device
        self.process: Any = None
        self.gcs: str | None = None

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
        model_source(self.spec.preset)  # converts the embedded model here, once
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited Ray
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_host, name="groundcover-ray-serve", daemon=True,
            args=(child, self.spec, self.replicas, self.address, self.port, self.device, timeout),
        )  # fmt: skip
        self.process.start()
        child.close()
        answer = self._receive(timeout + 120)
        if "ready" not in answer:
            self.stop()
            raise ServerStartError(f"Ray Serve app: {answer.get('error', 'no answer')}")
        self.gcs = answer["gcs"]
        return self

    def _receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.5):
            if not self.process.is_alive() or time.monotonic() > deadline:
                return {"error": self._ended()}
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return {"error": self._ended()}

    def _ended(self) -> str:
        code = self.process.exitcode
        return "its Ray driver process " + ("is not answering" if code is None else
                                            f"ended (exit code {code})")  # fmt: skip

    def gone(self) -> str | None:
        """Why the app cannot come back (its driver ended, or its cluster is unreachable), for
        the client to stop retrying at once; None while both live."""
        if self.process is None:
            return None
        if not self.process.is_alive():
            return f"the Ray Serve app is gone: {self._ended()}"
        return unreachable(self.gcs, timeout=0.5) if self.gcs else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def replica_pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            self.conn.send_bytes(json.dumps({"pids": True}).encode())
        return self._receive(120).get("pids", [])

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive() and self.gone() is None:  # delete the app, leave Ray
            with contextlib.suppress(OSError):
                self.conn.send_bytes(json.dumps({"stop": True}).encode())
            self.process.join(60)
        if self.process.is_alive():  # a lost cluster: nothing to tidy, Ray calls would hang
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()
        self.process = None

    def __enter__(self) -> RayReplicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
