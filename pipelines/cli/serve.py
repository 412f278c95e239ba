"""`groundcover serve`: a vLLM server here, replicas on Ray Serve, or a named NLI app; and the API
key check `serve` and `view` share."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import clean_errors, parse_loras

if TYPE_CHECKING:
    from ...serving.launch.server import ServerSpec

console = terminal(stderr=True)
NLI_APP = "groundcover-nli"


@clean_errors
def serve(
    model: Annotated[
        str | None, typer.Argument(help="preset name (see `models`), directory or hub id")
    ] = None,
    lora: Annotated[list[str] | None, typer.Option(help="NAME=PATH of a LoRA adapter")] = None,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    run_dir: Annotated[Path, typer.Option(help="where serve.log goes")] = Path("runs/serve"),
    max_model_len: Annotated[int | None, typer.Option()] = None,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="an extra vLLM flag, one token each (--engine-arg=--max-num-seqs "
            "--engine-arg=8); with --replicas, engine flags only"
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for health")] = 900.0,
    api_key_env: Annotated[
        str | None, typer.Option(help="variable holding the API key (needed off loopback)")
    ] = None,
    replicas: Annotated[int, typer.Option(help="replicas behind one URL (Ray Serve LLM)")] = 1,
    tensor_parallel_size: Annotated[
        int | None,
        typer.Option(help="GPUs per replica (vLLM's tensor parallelism); default: the preset's"),
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster for the replicas (default: local)")
    ] = None,
    nli: Annotated[
        str | None, typer.Option(help="deploy an NLI app of this cross-encoder instead")
    ] = None,
    nli_app: Annotated[str, typer.Option(help="the NLI app's name")] = NLI_APP,
    nli_replicas: Annotated[int, typer.Option(help="NLI replicas")] = 1,
    nli_device: Annotated[str, typer.Option(help="cpu | cuda (one GPU per replica)")] = "cpu",
    nli_batch: Annotated[int, typer.Option(help="pairs per forward pass")] = 32,
    nli_resources: Annotated[
        str | None, typer.Option(help='Ray resources per NLI replica, JSON: {"CPU": 4, "nli": 1}')
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="delete the NLI app --nli-app")] = False,
    gpu_share: Annotated[
        float,
        typer.Option(
            help="with --replicas: of each GPU a replica uses (less than 1 leaves the rest to an "
            "NLI replica on the same GPU; lower --gpu-memory-utilization to match)"
        ),
    ] = 1.0,
    ready_file: Annotated[
        Path | None,
        typer.Option(
            help="written once the model answers (every replica healthy): what a launcher "
            "waits for (a model list answers before the replicas do)"
        ),
    ] = None,
) -> None:
    """Start the vLLM OpenAI-compatible server for MODEL (plus adapters) and wait. It binds
    127.0.0.1 unless --host says otherwise; another address needs an API key, which clients
    send as a Bearer token (evaluator option api_key_env, OPENAI_API_KEY by default).

    With --nli CHECKPOINT: deploy a named NLI app on the Ray cluster at --ray-address and
    return; it stays warm for every run that says --nli-app NAME (--stop deletes it)."""
    if nli or stop:
        serve_nli(
            nli,
            nli_app,
            stop,
            ray_address,
            timeout,
            nli_replicas=nli_replicas,
            nli_device=nli_device,
            nli_batch=nli_batch,
            nli_resources=nli_resources,
        )
        return
    if model is None:
        raise UserError("serve: give MODEL (or --nli CHECKPOINT for an NLI app)")
    from ...serving.launch.registry import lora_adapter, resolve
    from ...serving.launch.server import ServerSpec, ServerStartError, VLLMServer
    from ..runtime.execution.execute import sigterm_as_interrupt

    preset = resolve(model)
    adapters = parse_loras(lora)
    for name, path in adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise UserError(f"--lora {name}: no adapter_config.json in {path}")
    try:
        loras = [lora_adapter(n, p, preset.name, model) for n, p in adapters.items()]
    except ValueError as exc:  # wrong base model, rank above the limit, unreadable config
        raise UserError(str(exc)) from exc
    spec = ServerSpec(
        model=model,
        loras=loras,
        host=host,
        port=port,
        max_model_len=max_model_len,
        extra_args=list(engine_arg or []),
        api_key=api_key_from(api_key_env),
        tensor_parallel_size=tensor_parallel_size,
        gpu_share=gpu_share,
    )
    try:
        spec.check_exposure()
    except ServerStartError as exc:
        raise UserError(str(exc)) from exc
    if replicas > 1 or ray_address:
        serve_replicas(spec, replicas, ray_address, timeout, ready_file)
        return
    server = VLLMServer(spec, run_dir / "serve.log")
    sigterm_as_interrupt()
    console.print(f"starting {preset.name} ({server.device}); log: {server.log_path}")
    try:
        server.start(timeout)
        said_ready(ready_file, server.base_url)
        names = ", ".join([preset.name, *adapters])
        console.print(f"serving {names} at {server.base_url}  (Ctrl-C stops)")
        while server.process is not None and server.process.poll() is None:
            time.sleep(1.0)
        raise ServerStartError(f"vLLM exited unexpectedly; see {server.log_path}")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        server.stop()


def serve_nli(
    model: str | None, name: str, stop: bool, address: str | None, timeout: float, **placement: Any
) -> None:
    """``serve --nli``: a named NLI app that outlives this command, on a running cluster."""
    from ...retrieval import nli_serve
    from ..runtime.execution import nli_placement

    if not address:
        raise UserError(
            "serve --nli: an app that stays needs a running cluster (`ray start "
            "--head`); give --ray-address (auto, or HOST:PORT)"
        )
    if stop:
        found = nli_serve.stop_named(name, address)
        console.print(f"deleted the NLI app {name}" if found else f"no NLI app {name} to delete")
        return
    assert model is not None
    try:
        resources = nli_placement.parse_resources(placement["nli_resources"])
        settings = nli_serve.app_settings(
            model,
            replicas=placement["nli_replicas"],
            device=placement["nli_device"],
            batch_size=placement["nli_batch"],
            resources=resources,
        )
    except ValueError as exc:
        raise UserError(f"serve --nli: {exc}") from exc
    console.print(f"deploying {settings['replicas']} replicas of {model} as {name}")
    try:
        replicas = nli_serve.start_named(name, settings, address, timeout)
    except nli_serve.NliAppError as exc:
        raise UserError(str(exc)) from exc
    for replica in replicas:
        console.print(f"  replica pid {replica['pid']} on node {replica['node'][:12]}")
    console.print(
        f"NLI app {name} is running; runs use it with --nli-app {name} --ray-address "
        f"{address}; `groundcover serve --nli-app {name} --stop --ray-address "
        f"{address}` deletes it"
    )


def said_ready(path: Path | None, base_url: str) -> None:
    """``--ready-file``: the URL, written whole (a reader never sees half of it)."""
    if path is None:
        return
    from ...serving.files import write_atomic

    write_atomic(path, base_url + "\n")


def serve_replicas(
    spec: ServerSpec,
    replicas: int,
    address: str | None,
    timeout: float,
    ready_file: Path | None = None,
) -> None:
    from ...serving.cluster.serve_app import RayReplicas
    from ...serving.launch.server import ServerStartError
    from ..runtime.execution.execute import sigterm_as_interrupt

    if replicas < 1:
        raise UserError("--replicas must be at least 1")
    try:
        app = RayReplicas(spec, replicas, address=address, port=spec.port or None)
    except ServerStartError as exc:
        raise UserError(str(exc)) from exc
    sigterm_as_interrupt()
    console.print(f"starting {replicas} replicas of {spec.preset.name} on Ray Serve")
    try:
        app.start(timeout)
        said_ready(ready_file, app.base_url)
        names = ", ".join([app.served_name, *(app.adapter_prefix + a.name for a in spec.loras)])
        console.print(f"serving {names} at {app.base_url}  (Ctrl-C stops)")
        if spec.loras:
            console.print(
                f"evaluations reach the adapters with --endpoint {app.base_url} "
                f"--adapter-prefix {app.adapter_prefix}"
            )
        while app.alive():
            time.sleep(1.0)
        raise ServerStartError(f"the Ray Serve app ended: {app.gone()}")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        app.stop()


def authorised(header: str | None, key: str) -> bool:
    """``Bearer KEY``, or HTTP Basic with KEY as the password (what a browser sends)."""
    import base64
    import binascii
    import hmac

    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), key.encode())


def api_key_from(variable: str | None) -> str | None:
    if variable is None:
        return None
    key = os.environ.get(variable, "")
    if not key:
        raise UserError(f"--api-key-env {variable}: the variable is not set or empty")
    from ...serving.redact import remember

    remember(key)  # never printed or stored from here on
    return key
