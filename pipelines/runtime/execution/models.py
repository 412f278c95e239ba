"""Connect a run's roles to their models: a given endpoint, or a vLLM server started for the run.

The model address (preset / directory / hub id, endpoint, adapter) is resolved once, in
``EvaluatorConfig.ref()``; here it becomes a client whose every request goes to the adapter when
one is asked for, after checking that the server really has it. Roles that need a local model
share ``Servers``: one vLLM server (or Ray Serve app) per distinct base model, serving every
adapter any role asks of that base, started when its first client opens and stopped when its
last one closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....serving.batch import Batcher, LocalRunBatch, OpenAIBatches
from ....serving.cache import ResponseCache
from ....serving.client import EvalClient
from ....serving.launch.registry import lora_adapter, model_source, resolve
from ....serving.launch.server import (
    PortTaken,
    ServerSpec,
    VLLMServer,
    engine_device,
    engine_environment,
    run_batch_command,
)
from ....serving.reasoning import Reasoning
from ..contract.config import EvaluatorConfig, UserError
from ..store.run_dir import fingerprint
from .model_content import keyed_before, location, revisions


def model_record(cfg: EvaluatorConfig) -> dict:
    """The model of a role as the manifest and reports show it; a reasoning model with how it
    reasons (its preset's default unless set)."""
    record = cfg.ref().describe() | {"adapters": cfg.adapters}
    if cfg.revision is not None:
        record["declared_revision"] = cfg.revision
    if cfg.content is not None:  # what the model and its adapters are, by content
        record["content"] = cfg.content
    if cfg.sample is not None:  # a self-consistency panel's member: its sample's index
        record["sample"] = cfg.sample
    if cfg.transport == "batch":  # bought as batch jobs: priced at the batch price
        record["transport"] = "batch"
    reasoning = reasoning_of(cfg)
    if reasoning is not None:
        record |= {"reasoning": reasoning.setting, "reasoning_tokens": reasoning.budget}
    return record


def sampling_defaults(cfg: EvaluatorConfig) -> dict:
    defaults: dict[str, Any] = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
    if cfg.seed is not None:  # a repeat's seed: part of each request, so of its cache key
        defaults["seed"] = cfg.seed
    return defaults


def reasoning_of(cfg: EvaluatorConfig) -> Reasoning | None:
    """How the model reasons: its preset's way, at ``cfg.reasoning`` (default: the preset's);
    a model that is no preset reasons only when ``--reasoning`` says so (or when its first
    reply shows it: the client then finds out)."""
    preset = cfg.ref().preset
    style = preset.reasoning if preset is not None else None
    setting = cfg.reasoning or (preset.reasoning_default if preset is not None else None)
    if style is None:
        if cfg.reasoning in (None, "off"):
            return None
        style = "always"
    try:
        return Reasoning.make(style, setting or "medium", cfg.reasoning_tokens)
    except ValueError as exc:
        raise UserError(f"{cfg.model}: {exc}") from None


async def start_server(spec: ServerSpec, cfg: EvaluatorConfig, log: Path) -> Any:
    """One vLLM server, or ``cfg.replicas`` of them behind one Ray Serve LLM app. The waits run
    in threads, so the servers of a run's roles start side by side; an interrupted start
    leaves nothing serving."""
    if cfg.replicas > 1 or cfg.ray_address:
        from ....serving.cluster.serve_app import RayReplicas

        replicas = RayReplicas(spec, cfg.replicas, address=cfg.ray_address)
        return await _AbandonableStart(replicas).run()
    await asyncio.to_thread(model_source, spec.preset)  # converts the embedded model, once
    server = VLLMServer(spec, log)
    while True:
        server.launch()  # from the loop's thread (the main one): it dies with us, even by SIGKILL
        try:
            await asyncio.to_thread(server.wait_ready)
            return server
        except PortTaken:
            if not server.move_port():  # taken before vLLM bound it: launched on another
                raise
        except BaseException:
            server.stop()  # cancelled: the wait's thread sees the process gone and ends
            raise


class _AbandonableStart:
    """A blocking ``start()`` (a Ray Serve app's, whose driver talks over one pipe) in a
    worker thread, which an interrupted run cannot stop: once abandoned, a server that comes
    up anyway is stopped by whichever side sees it second."""

    def __init__(self, server: Any):
        self.server, self.lock, self.abandoned, self.up = server, threading.Lock(), False, False

    async def run(self) -> Any:
        try:
            await asyncio.to_thread(self._start)
        except asyncio.CancelledError:
            with self.lock:
                self.abandoned, up = True, self.up
            if up:
                self.server.stop()
            raise
        return self.server

    def _start(self) -> None:
        self.server.start()
        with self.lock:
            self.up = not self.abandoned
        if not self.up:
            self.server.stop()


def server_key(cfg: EvaluatorConfig) -> tuple[Any, ...]:
    """Evaluators with the same key are served by one server (adapters of one base share it)."""
    return resolve(cfg.model).name, cfg.model, cfg.replicas, cfg.ray_address, cfg.max_model_len


@dataclass
class Served:
    base_url: str
    adapter_prefix: str
    gone: Any
    replicas: Any = None  # () -> each replica's node, pid and requests answered (Ray Serve)


class Servers:
    """The local servers of one invocation, one per distinct base model.

    A server starts in a thread, so the servers of a run's roles start side by side (each
    start is mostly imports and weight loading); roles on one base wait for the same start.

    ``linger``: a server whose last user is done stays up for the next run of the invocation on
    the same base (a study's runs take turns: the base and adapter runs of ``finetune claims
    eval``, a grid's cells), and is stopped when another base must start -- one base's weights
    at a time, as without it -- or at ``close``. Without it a server stops with its last user.
    """

    def __init__(self, evaluators: list[EvaluatorConfig], linger: bool = False):
        self.linger = linger
        self.adapters: dict[tuple, dict[str, str]] = {}
        for ev in evaluators:
            if ev.endpoint is not None:
                continue
            into = self.adapters.setdefault(server_key(ev), {})
            for name, path in ev.adapters.items():
                if into.setdefault(name, path) != path:
                    raise UserError(f"adapter {name!r} is given two paths: {into[name]}, {path}")
        self.running: dict[tuple, Any] = {}  # key -> server
        self.users: dict[tuple, int] = {}  # key -> clients using it or waiting for its start
        self.starting: dict[tuple, asyncio.Task] = {}

    @contextlib.asynccontextmanager
    async def use(self, cfg: EvaluatorConfig, run_dir: Path) -> AsyncIterator[Served]:
        key = server_key(cfg)
        self.users[key] = self.users.get(key, 0) + 1  # before any wait: never stopped as idle
        try:
            if key not in self.running:
                if key not in self.starting:
                    self._stop_idle()
                    self.starting[key] = asyncio.ensure_future(self._launch(key, cfg, run_dir))
                await asyncio.shield(self.starting[key])
            server = self.running[key]
            yield Served(
                server.base_url, server.adapter_prefix, server.gone, getattr(server, "served", None)
            )
        finally:
            self.users[key] -= 1
            if not self.users[key] and not self.linger and key in self.running:
                self.running.pop(key).stop()

    async def _launch(self, key: tuple, cfg: EvaluatorConfig, run_dir: Path) -> None:
        adapters = self.adapters.get(key) or dict(cfg.adapters)
        base = resolve(cfg.model).name
        loras = [lora_adapter(n, p, base, cfg.model) for n, p in adapters.items()]
        spec = ServerSpec(
            model=cfg.model, loras=loras, max_model_len=cfg.max_model_len, revision=pinned(cfg)
        )
        log = "serve.log" if len(self.adapters) <= 1 else f"serve-{_safe(base)}.log"
        try:
            server = await start_server(spec, cfg, run_dir / log)
        finally:
            del self.starting[key]
        if not self.users.get(key) and not self.linger:
            # every run that waited for it was interrupted meanwhile (the start is shielded
            # from their cancellation): nobody would stop it
            server.stop()
            return
        self.running[key] = server

    def _stop_idle(self) -> None:
        for key in [k for k in self.running if not self.users.get(k)]:
            self.running.pop(key).stop()

    def close(self) -> None:
        """Stop every server still up (lingering ones; none is in use once a study is done)."""
        for key in list(self.running):
            self.running.pop(key).stop()


def pinned(cfg: EvaluatorConfig) -> str | None:
    """The hub commit a server we start must load: the one the run's identity records."""
    base = (cfg.content or {}).get("base") or {}
    return base.get("revision") if base.get("source") == "hub" else None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]


def client_options(cfg: EvaluatorConfig) -> dict[str, Any]:
    """What of a client makes its requests (and so their cache keys): the one definition for
    the real client and the dry run's cache replay."""
    ref = cfg.ref()
    return {
        "model": ref.base_name,
        "adapter": ref.adapter,
        "default_params": sampling_defaults(cfg),
        "vllm_extensions": cfg.vllm_extensions,
        "reasoning": reasoning_of(cfg),
        "reasoning_parser": started_with_reasoning_parser(cfg),
        "revisions": revisions(cfg),
        "keyed_before": keyed_before(cfg),
        "sample": cfg.sample,
    }


def started_with_reasoning_parser(cfg: EvaluatorConfig) -> bool | None:
    """True when the project starts the server with the preset's ``--reasoning-parser``; None
    for an endpoint (the client finds out from the first reply that reasons)."""
    preset = cfg.ref().preset
    if cfg.endpoint is None and preset is not None and preset.reasoning_parser:
        return True
    return None


class NotCached(Exception):
    """A dry run's request that the response cache cannot answer."""


class CacheReplay(EvalClient):
    """Answers from the response cache only (a dry run): a request it has not seen raises
    ``NotCached`` instead of reaching a server."""

    def __init__(self, cfg: EvaluatorConfig, cache: ResponseCache):
        super().__init__(
            "http://cache-replay.invalid/v1", **client_options(cfg), cache=cache, max_retries=0
        )

    async def _request(self, model, messages, body, usage, *, stage, template):
        raise NotCached(stage)


@contextlib.asynccontextmanager
async def open_evaluator(
    cfg: EvaluatorConfig,
    run_dir: Path,
    cache_path: Path | None,
    servers: Servers | None = None,
    shared_cache: bool | None = None,
    driver: tuple[int, int] = (0, 1),
) -> AsyncIterator[EvalClient]:
    """A client of ``cfg``'s model. ``shared_cache``: this process is one of several hosts
    sharing the cache directory (each writes its own file; None: when on a network file
    system). ``driver``: which of the run's drivers asks (its own batch ledger)."""
    options = client_options(cfg)  # an unknown model stops here, before anything is opened
    cache = ResponseCache(cache_path, shared=shared_cache) if cache_path else None
    if cache is not None:
        remember_models(cache, cfg)
    try:
        async with contextlib.AsyncExitStack() as stack:
            base_url, adapter_prefix, gone, replicas = cfg.endpoint, cfg.adapter_prefix, None, None
            if cfg.transport == "batch" and cfg.endpoint is None:  # converted once, off the loop
                await asyncio.to_thread(model_source, resolve(cfg.model))
            batcher = batcher_of(cfg, run_dir, driver)
            if batcher is not None and base_url is None:  # vllm run-batch: no server
                client = EvalClient(
                    f"vllm-run-batch://{_safe(cfg.model)}",
                    **options,
                    cache=cache,
                    max_retries=cfg.max_retries,
                    batcher=batcher,
                )
                async with client:
                    yield client
                return
            if base_url is None:
                pool = servers or Servers([cfg])
                served = await stack.enter_async_context(pool.use(cfg, run_dir))
                base_url, adapter_prefix, gone = served.base_url, served.adapter_prefix, served.gone
                replicas = served.replicas
            client = EvalClient(
                base_url,
                **options,
                adapter_prefix=adapter_prefix,
                api_key=cfg.api_key(),
                concurrency=cfg.concurrency,
                concurrency_ceiling=cfg.concurrency_max,
                timeout=cfg.timeout,
                max_retries=cfg.max_retries,
                cache=cache,
                gone=gone,
                batcher=batcher,
            )
            client.replicas = replicas
            async with client:
                await check_served(client, cfg, base_url, adapter_prefix)
                yield client
    finally:
        if cache is not None:
            cache.close()


def batcher_of(
    cfg: EvaluatorConfig, run_dir: Path, driver: tuple[int, int] = (0, 1)
) -> Batcher | None:
    """The batch rounds of a batch transport (None: online), in ``run_dir/batches/`` (a folder
    per client, and per driver ``(k, N)`` of a run spread over N: its ledger is what a resumed
    run reads back). At an endpoint: its Batch API; a model served here: ``vllm run-batch``,
    the model loaded once per round."""
    if cfg.transport != "batch":
        return None
    base = run_dir / "batches" / f"{_safe(cfg.model)}-{batch_folder_key(cfg)}"
    folder, adopt, siblings = batch_folders(base, *driver)
    siblings += earlier_folders(base)
    executor: OpenAIBatches | LocalRunBatch
    if cfg.endpoint is not None:
        executor = OpenAIBatches(
            cfg.endpoint, cfg.api_key(), timeout=cfg.timeout, find_window=cfg.batch_find
        )
    else:
        name = resolve(cfg.model).name
        loras = [lora_adapter(n, p, name, cfg.model) for n, p in cfg.adapters.items()]
        spec = ServerSpec(
            model=cfg.model, loras=loras, max_model_len=cfg.max_model_len, revision=pinned(cfg)
        )
        device = engine_device()
        executor = LocalRunBatch(
            lambda source, output: run_batch_command(spec, device, source, output),
            engine_environment(spec, device),
            device,
        )
    return Batcher(
        executor,
        folder,
        settle=cfg.batch_settle,
        max_lines=cfg.batch_size,
        retry_online=cfg.batch_retry == "online",
        adopt=adopt,
        siblings=siblings,
        poll=cfg.batch_poll,
        retry_base=cfg.batch_poll,  # a failed line's next round: after a poll, then doubling
        max_attempts=max(1, min(cfg.max_retries, 3)),
        within=run_dir if run_dir.is_dir() else None,  # no link below the run written through
    )


def batch_folders(base: Path, shard: int, drivers: int) -> tuple[Path, list[Path], list[Path]]:
    """Driver ``shard`` of ``drivers``' own folder (``base`` for one driver, ``base-dK`` for
    several), the folders it adopts (their drivers are gone: an earlier invocation had more,
    or fewer; their pending batches are waited for here, never bought again) and its live
    siblings' (their finished outputs answer an item that moved between drivers)."""
    own = base if drivers == 1 else base.with_name(f"{base.name}-d{shard}")
    found = [base] if base.is_dir() else []
    if base.parent.is_dir():
        numbered = base.parent.glob(f"{base.name}-d*")
        found += sorted(f for f in numbered if f.name.rsplit("-d", 1)[1].isdigit())
    adopt: list[Path] = []
    siblings: list[Path] = []
    for folder in found:
        if folder == own:
            continue
        index = 0 if folder == base else int(folder.name.rsplit("-d", 1)[1])
        live = (folder == base) if drivers == 1 else (folder != base and index < drivers)
        gone_and_mine = not live and index % drivers == shard
        (adopt if gone_and_mine else siblings).append(folder)
    return own, adopt, siblings


# What decides a client's answers, and so its batch folder: the model by what it is, how it
# samples, what it serves. Not how it is reached or asked (concurrency, timeouts, retries, the
# key's variable, the URL's spelling, the batch knobs): a resume that changes those polls the
# batches already bought instead of buying their lines again.
ANSWER_FIELDS = (
    "model", "revision", "adapter", "adapter_prefix", "temperature", "seed", "max_tokens",
    "reasoning", "reasoning_tokens", "vllm_extensions", "max_model_len", "sample",
)  # fmt: skip


def batch_folder_key(cfg: EvaluatorConfig) -> str:
    """A short digest of what makes a client's answers (two roles on one model and settings
    share a client, so its ledger; a self-consistency member has its own): ``ANSWER_FIELDS``,
    the model and adapters by content, and (where nothing else knows the model) the
    endpoint as one spelling (``location``)."""
    asked: dict[str, Any] = {name: getattr(cfg, name) for name in ANSWER_FIELDS}
    content = cfg.content or {}
    asked["content"] = content
    known = (content.get("base") or {}).get("revision")
    if cfg.endpoint is not None and not known:
        asked["endpoint"] = location(cfg.endpoint)
    if cfg.endpoint is None:  # a model served here: its adapters by content (in ``content``)
        asked["adapters"] = sorted(cfg.adapters)
    return fingerprint(asked)[:10]


def earlier_folders(base: Path) -> list[Path]:
    """The client's folders written under an earlier key (no ``folder.json``: before folders
    were known by what decides their answers, when transport settings were in the key): read
    like a sibling's, so their finished outputs answer and their pending batches are waited
    for when asked; their lines are keyed by content, so another client's never answers
    here."""
    from ....serving.batch import FOLDER_FILE

    model = base.name.rsplit("-", 1)[0]
    if not base.parent.is_dir():
        return []
    return sorted(
        folder
        for folder in base.parent.glob(f"{model}-*")
        if folder.is_dir()
        and not (folder / FOLDER_FILE).is_file()
        and (folder / "ledger.jsonl").is_file()
        and not folder.name.startswith(base.name)
    )


def remember_models(cache: ResponseCache, cfg: EvaluatorConfig) -> None:
    """What each revision the client keys its answers by is (``groundcover cache``)."""
    content = cfg.content or {}
    base = content.get("base") or {}
    if base.get("revision"):
        where = base.get("path") or base.get("hub_id") or cfg.endpoint
        cache.remember_model(base["revision"], cfg.ref().base_name, where)
    for name, record in (content.get("adapters") or {}).items():
        if record.get("revision"):
            cache.remember_model(record["revision"], name, record.get("path") or cfg.endpoint)


async def check_served(
    client: EvalClient, cfg: EvaluatorConfig, base_url: str, adapter_prefix: str
) -> None:
    """At an endpoint: ``NAME:TAG`` the server lists only as ``TAG`` is an adapter; an asked
    adapter the server does not list stops the run in one line (Serve lists none)."""
    if adapter_prefix:
        return
    if cfg.endpoint and ":" in client.model and not client.adapter:
        served = await client.served_models()
        split = cfg.ref().split_at(served or [])
        if split.adapter:
            client.model, client.adapter = split.model, split.adapter
        return
    if client.adapter:
        served = await client.served_models()
        if served is not None and client.adapter not in served:
            raise UserError(
                f"adapter {client.adapter!r} is not served at {base_url} "
                f"(it serves: {', '.join(served)})"
            )
