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
replica that has the adapter loaded (or loads it there, ``serving.cluster.lora``), so the served
name of an adapter is ``adapter_prefix + name``, not the bare name a plain vLLM server uses.

An API key (``spec.api_key``; required off loopback) is checked by Serve's HTTP proxy: Serve
calls ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` in each proxy for Starlette middlewares, and
ours (``proxy_middlewares``) refuses a request without ``Authorization: Bearer KEY``. The proxy
reads both variables from its node's environment: a local Ray started here inherits them; a
cluster's nodes need them exported before ``ray start``. Either way the app is probed without the
key before it is reported ready, and an app that answers is stopped, not used.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import time
from typing import Any

import httpx

from ..launch.registry import model_source
from ..launch.server import (
    CPU_ENV,
    ServerSpec,
    ServerStartError,
    connect_host,
    engine_device,
    lora_rank_for,
)
from ..launch.startlog import timed
from .join import Channel, DriverChild, connect, error_line, unreachable

APP = "groundcover"
KEY_ENV = "GROUNDCOVER_SERVE_API_KEY"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "groundcover.serving.cluster.serve_app:proxy_middlewares"
# Serve LLM's engine class, by path, in each replica's environment (imported only there): on a
# CPU node the model runs in vLLM's engine process, not in one more spawned worker (``engine``)
ENGINE_CLASS_ENV = "RAYLLM_VLLM_ENGINE_CLS"
ONE_PROCESS_ENGINE = "groundcover.serving.cluster.engine:OneProcessEngine"


def proxy_middlewares() -> list[Any]:
    """Serve's proxy callback: the key check when the proxy's environment holds a key."""
    from starlette.middleware import Middleware

    key = os.environ.get(KEY_ENV, "")
    return [Middleware(BearerKey, key=key)] if key else []


class BearerKey:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer KEY`` (401 otherwise); the
    proxy's own ``/-/`` health routes stay open."""

    def __init__(self, app: Any, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/-/") or self._keyed(scope):
            await self.app(scope, receive, send)
            return
        error = {"message": "missing or wrong API key", "type": "authentication_error"}
        body = json.dumps({"error": error | {"code": 401}}).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _keyed(self, scope: dict) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)


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
        bundles: list[dict[str, float]] = [{"CPU": 1}]
    else:
        engine["tensor_parallel_size"] = spec.gpus_per_replica
        bundles = [{"GPU": spec.gpu_share, "CPU": 1}] * spec.gpus_per_replica
    if preset.reasoning_parser:  # the answer in content, the reasoning apart (as vllm serve)
        engine["reasoning_parser"] = preset.reasoning_parser
    if spec.revision:  # the hub commit the run's identity records
        engine["revision"] = spec.revision
    engine |= engine_flags(preset.extra_engine_args + spec.extra_args)  # later flags win
    env = (CPU_ENV | {ENGINE_CLASS_ENV: ONE_PROCESS_ENGINE} if device == "cpu" else {}) | spec.env
    if device != "cpu" and spec.gpu_share < 1:  # each engine worker asks Ray for its share
        env = env | {"VLLM_RAY_PER_WORKER_GPUS": f"{spec.gpu_share:g}"}
    from .replica import NO_MIRROR_CALLBACK, CountedServer

    adapters: dict[str, Any] = {"server_cls": CountedServer}  # answers counted per replica
    if spec.loras:  # every replica can load every adapter; Serve decides which one does
        from .lora import ADAPTERS_ENV, AdapterServer

        engine |= {
            "enable_lora": True,
            "max_lora_rank": lora_rank_for(spec.loras),
            "max_loras": len(spec.loras),
        }
        env = env | {ADAPTERS_ENV: json.dumps({a.name: a.path for a in spec.loras})}
        adapters = {
            "server_cls": AdapterServer,
            "lora_config": {"max_num_adapters_per_replica": len(spec.loras)},
        }
    if NO_MIRROR_CALLBACK:  # we name no cloud mirror: the per-node download task is a no-op
        adapters["callback_config"] = {"callback_class": NO_MIRROR_CALLBACK}
    return LLMConfig(
        model_loading_config={"model_id": preset.name, "model_source": model_source(preset)},
        deployment_config={"num_replicas": replicas, "max_ongoing_requests": 256},
        # a replica's GPUs on one node: tensor parallelism across nodes would run its
        # all-reduces over the network, and a PACK that cannot fit waits on more nodes
        placement_group_config={"bundles": bundles, "strategy": "STRICT_PACK"},
        engine_kwargs=engine,
        runtime_env={"env_vars": env},
        log_engine_metrics=False,
        **adapters,
    )


def engine_flags(flags: list[str]) -> dict[str, Any]:
    """vLLM flags (``serve --engine-arg``, a preset's) as Serve LLM's engine keywords, read by
    vLLM's own parser: each with the value and type ``vllm serve`` would give it. Only engine
    flags exist on a Serve replica (no server flags); anything else is refused, never dropped."""
    if not flags:
        return {}
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before 0.11 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(exit_on_error=False))
    try:
        given, unknown = parser.parse_known_args(flags)
    except (argparse.ArgumentError, SystemExit) as exc:  # a bad value: argparse may exit
        raise ServerStartError(f"--engine-arg {' '.join(flags)}: {exc}") from exc
    if unknown:
        raise ServerStartError(
            f"--engine-arg {' '.join(unknown)}: not a vLLM engine flag (a Ray Serve replica "
            "takes engine flags only)"
        )
    defaults = vars(parser.parse_args([]))
    return {k: v for k, v in vars(given).items() if defaults.get(k) != v}


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return (
        int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)
    )


def _host(
    channel: Channel,
    spec: ServerSpec,
    replicas: int,
    address: str | None,
    port: int,
    device: str,
    timeout: float,
) -> None:
    """The app's Ray driver, in a child process: deploys, reports, answers, and when the run
    says stop (or is gone) deletes the app and leaves Ray."""
    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    if spec.api_key:  # a local Ray started below hands these to its Serve proxy
        os.environ |= {KEY_ENV: spec.api_key, CALLBACK_ENV: CALLBACK}
    base_url, deployed = f"http://{connect_host(spec.host)}:{port}/v1", False
    # one deadline for the whole start (Serve's own 60 s wait for a new proxy aside): the run's
    # driver waits for it and 120 s more, so the answer is this line, not a silent driver
    deadline = time.monotonic() + timeout
    try:
        # controller + proxy + router + replicas each hold a logical CPU of a local Ray
        connect(address, num_cpus=max(8, 2 * replicas + 4))
        _start_serve(serve, spec.host, port)
        _check_proxy_settings(ray, serve, spec.host, port)
        _proxy_up(base_url, deadline, timeout)
        if spec.api_key:  # before the model is deployed: it is never served without its key
            _check_key_asked(base_url)
        config = llm_config(spec, replicas, device)
        deployed = True
        with timed("serve-llm", f"{spec.preset.name} x{replicas}"):
            try:
                serve.run(build_openai_app({"llm_configs": [config]}), name=APP, blocking=False)
            except RuntimeError as exc:  # Serve says the deploy failed, not why: its status does
                why = _app_state(serve)[1]
                name = spec.preset.name
                raise ServerStartError(f"Ray Serve could not deploy {name}: {why or exc}") from exc
            _wait_ready(
                base_url,
                spec.preset.name,
                deadline,
                timeout,
                spec.api_key,
                lambda: _app_state(serve),
            )
        if spec.api_key:
            _check_key_asked(base_url)
    except Exception as exc:
        if deployed:  # not left behind on a cluster (it may serve without its key)
            _take_down(serve, ray, address)
        channel.say({"error": error_line(exc)})
        return
    channel.say({"ready": True, "gcs": ray.get_runtime_context().gcs_address})
    for request in channel.requests():
        if request.get("pids"):
            channel.say({"pids": _replica_pids()})
        if request.get("served"):
            channel.say({"served": _served(serve)})
    _take_down(serve, ray, address)


def _check_proxy_settings(ray: Any, serve: Any, host: str, port: int) -> None:
    """Serve's HTTP proxy is set once, by whoever starts Serve on the cluster; a later
    ``serve.start`` joins it as it is. An instance started without a proxy (the NLI app's
    handles-only start) or on another port would leave the judge's wait to time out: said at
    once, with the fix."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:  # serve.start just made or found one: nothing to check without it
        return
    controller = client._controller
    location = str(ray.get(controller.get_proxy_location.remote()))
    config = ray.get(controller.get_http_config.remote())
    if "Disabled" in location or config.port != port or config.host != host:
        raise ServerStartError(
            f"Ray Serve already runs on this cluster with its HTTP proxy {location} at "
            f"{config.host}:{config.port}, not {host}:{port} (an NLI app deployed first starts "
            f"Serve without one): start Serve first with `serve start --http-host {host} "
            f"--http-port {port} --proxy-location EveryNode`, then the NLI app and the judge"
        )


def _served(serve: Any) -> list[dict[str, Any]]:
    """Each model replica's node, process and requests answered (``CountedServer.served``)."""
    deployments = serve.status().applications[APP].deployments
    name = next(d for d in deployments if d.startswith(("CountedServer", "AdapterServer")))
    handle = serve.get_deployment_handle(name, app_name=APP)
    return sorted(handle.broadcast("served").results(), key=lambda r: (r["node"], r["pid"]))


def _take_down(serve: Any, ray: Any, address: str | None) -> None:
    """Delete our app; stop Serve itself only on the Ray we started (on a shared cluster that
    would take other people's apps down with ours)."""
    with contextlib.suppress(Exception):
        serve.delete(APP)
    if address is None:
        with contextlib.suppress(Exception):
            serve.shutdown()
    ray.shutdown()


def _app_state(serve: Any) -> tuple[str, str | None]:
    """The app's status as Serve reports it (``RUNNING`` once every replica is healthy; the
    model list answers before that, from the ingress alone), and Serve's reason once the deploy
    has failed (a replica that cannot start: Serve gives up after its retries)."""
    try:
        app = serve.status().applications.get(APP)
    except Exception:  # the controller busy or starting: asked again
        return "UNKNOWN", None
    if app is None:
        return "NOT_STARTED", None
    status = str(app.status).rsplit(".", 1)[-1]
    if status != "DEPLOY_FAILED":
        return status, None
    # a deployment's message ends with its replica's error; the app's only says which failed
    for texts in ([d.message for d in app.deployments.values()], [app.message]):
        lines = [line.strip() for text in texts for line in str(text or "").splitlines()]
        errors = [line for line in lines if line and not line.startswith(("File ", "^", "~"))]
        if errors:
            return status, errors[-1][:500]
    return status, "the deploy failed"


def _wait_ready(
    base_url: str,
    name: str,
    deadline: float,
    timeout: float,
    key: str | None = None,
    state: Any = lambda: ("RUNNING", None),
) -> None:
    """Until Serve reports the app RUNNING and it lists the model, by ``deadline`` (monotonic;
    the start's whole ``timeout`` for the message). A deploy Serve has given up on ends the wait
    at once, with Serve's reason."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while True:
        status, why = state()
        if why:
            raise ServerStartError(f"Ray Serve could not deploy {name}: {why}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            models = httpx.get(f"{base_url}/models", headers=headers, timeout=5).json()
            listed = any(m.get("id") == name for m in models.get("data", []))
            if listed and status == "RUNNING":
                return
        if time.monotonic() >= deadline:
            raise ServerStartError(f"Ray Serve app not ready after {timeout:.0f}s")
        time.sleep(1.0)


def _start_serve(serve: Any, host: str, port: int) -> None:
    """Start Serve, or join the one running. Serve's own wait for a new proxy is a fixed 60 s,
    which a loaded node runs past (seen on a busy 2-core machine) while the proxy still comes
    up: past it, the controller Serve made is joined, and the caller waits for the proxy until
    the start's own deadline (``_proxy_up``)."""
    options = {"host": host, "port": port}
    try:
        serve.start(http_options=options)
    except TimeoutError:  # Serve's fixed wait, not ours: its controller and proxy stay
        serve.start(http_options=options)


def _proxy_up(base_url: str, deadline: float, timeout: float) -> None:
    """Wait until ``deadline`` (monotonic; the start's whole ``timeout`` for the message) for
    Serve's HTTP proxy to answer its open health route."""
    health = base_url.removesuffix("/v1") + "/-/healthz"
    while True:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(health, timeout=5)
            return
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"Ray Serve's proxy did not answer at {health} within the start's {timeout:.0f}s"
            )
        time.sleep(0.5)


def _check_key_asked(base_url: str) -> None:
    """A request without the key must be refused (401): a cluster whose nodes were started
    without the proxy callback would otherwise serve anyone who can reach the port. Asked of
    the bare proxy before the app is deployed (it answers 404 there without the callback), and
    of the app once it is up."""
    status = httpx.get(f"{base_url}/models", timeout=10).status_code
    if status != 401:
        raise ServerStartError(
            f"the Serve proxy answered {status} without the API key: start the cluster's nodes "
            f"with {CALLBACK_ENV}={CALLBACK} and {KEY_ENV} exported"
        )


def _replica_pids() -> list[int]:
    """Process ids of the model replicas (each runs its engine in-process on CPU); the
    deployment is named after its server class (``CountedServer``, or ``AdapterServer`` when
    adapters are served)."""
    import ray

    pids: list[int] = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        namespace = entry.get("namespace", "serve") if isinstance(entry, dict) else "serve"
        if "SERVE_REPLICA" in name and ("CountedServer" in name or "AdapterServer" in name):
            actor = ray.get_actor(name, namespace=namespace)
            pid: Any = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))
            pids.append(int(pid))
    return sorted(pids)


class RayReplicas:
    """Start, use (``base_url``, ``served_name``), stop; a context manager like VLLMServer.

    The app's Ray driver is a child process, as a plain server is: Ray ends a driver without an
    exception when its raylet or the cluster's GCS dies, and the run must outlive that to say so
    in one line (``gone``) and stop cleanly."""

    def __init__(
        self,
        spec: ServerSpec,
        replicas: int,
        *,
        address: str | None = None,
        port: int | None = None,
    ):
        spec.check_exposure()  # off loopback only with a key
        from ..launch.server import free_port

        self.spec, self.replicas, self.address = spec, replicas, address
        self.port = port or spec.port or free_port()
        self.device = engine_device() if spec.device == "auto" else spec.device
        self.child: DriverChild | None = None
        self.gcs: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{connect_host(self.spec.host)}:{self.port}/v1"

    @property
    def served_name(self) -> str:
        return self.spec.preset.name

    @property
    def adapter_prefix(self) -> str:
        """What turns an adapter's name into the model name Serve routes: ``BASE:ADAPTER``."""
        return f"{self.served_name}:"

    def start(self, timeout: float = 900.0) -> RayReplicas:
        model_source(self.spec.preset)  # converts the embedded model here, once
        args = (self.spec, self.replicas, self.address, self.port, self.device, timeout)
        self.child = DriverChild(_host, args, "groundcover-ray-serve")
        answer = self._receive(timeout + 120)
        if "ready" not in answer:
            self.stop()
            raise ServerStartError(f"Ray Serve app: {answer.get('error', 'no answer')}")
        self.gcs = answer["gcs"]
        return self

    def _receive(self, timeout: float) -> dict[str, Any]:
        assert self.child is not None, "the app's driver was never started"
        answer = self.child.receive(timeout)
        return {"error": self.child.ended()} if answer is None else answer[0]

    def gone(self) -> str | None:
        """Why the app cannot come back (its driver ended, or its cluster is unreachable), for
        the client to stop retrying at once; None while both live."""
        if self.child is None:
            return None
        if not self.child.alive():
            return f"the Ray Serve app is gone: {self.child.ended()}"
        return unreachable(self.gcs, timeout=0.5) if self.gcs else None

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def replica_pids(self) -> list[int]:
        assert self.child is not None, "the app's driver was never started"
        self.child.send({"pids": True})
        return self._receive(120).get("pids", [])

    def served(self) -> list[dict[str, Any]]:
        """Each replica now: node, process id, and the requests it has answered since it
        started (a replaced replica starts again from 0)."""
        assert self.child is not None, "the app's driver was never started"
        self.child.send({"served": True})
        return self._receive(120).get("served", [])

    def stop(self) -> None:
        """Delete the app and leave Ray; a lost cluster has nothing to tidy (Ray calls would
        hang until Ray's own 60 s exit), so then the driver is only ended."""
        if self.child is None:
            return
        self.child.stop(tidy=self.gone() is None, wait=60)
        self.child = None

    def __enter__(self) -> RayReplicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
