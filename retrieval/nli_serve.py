"""NLI as a warm Ray Serve deployment: N replicas that each hold the cross-encoder, called from a
run through a ``DeploymentHandle``.

A Serve app loads the model once per replica and stays: a call costs the scoring and a few
milliseconds, and one app serves every driver of a run (and, named, later runs). The plain Ray
actors of ``retrieval.nli_ray`` (``--nli-bulk``) are one driver's own, without Serve.

Requests are lists of pairs; ``@serve.batch`` merges concurrent requests on a replica into one
batch of up to ``max_pairs`` pairs, which the replica scores as ``NliScorer.probabilities`` does
(deduplicated, length-sorted, ``batch_size`` pairs per forward pass). The client cuts a call into
length-sorted chunks of ``batch_size`` (``plan_batches``), so a replica that merges consecutive
chunks runs the local scorer's batches.

An app is named. ``groundcover serve --nli MODEL`` deploys one on a cluster and leaves it there;
``--nli-app NAME`` uses it from any run on that cluster, warm. A run given ``--nli-replicas N``
without a name deploys its own app and deletes it when it ends. The handle lives in a driver
child (``serving.cluster.join.DriverChild``) so that Ray ending its driver on a lost cluster ends
the child, not the run.

A request that fails because its replica died is sent again (Serve routes it to a live replica,
and restarts the dead one where resources allow); when no replica answers for ``retry_for``
seconds the run stops with one ``error:`` line, resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ray import serve

from ..serving.client import EndpointError
from ..serving.cluster.join import (
    Channel,
    ClusterGone,
    DriverChild,
    connect,
    error_line,
)
from ..serving.launch import startlog
from .nli import CANONICAL, NliDecisions, NliScorer, plan_batches

DEPLOYMENT = "NliReplica"


class NliAppError(EndpointError):
    """The NLI app is missing, failed to deploy, or has had no live replica for too long."""


def _pairs_in(requests: list[list[list[str]]]) -> int:
    return sum(len(r) for r in requests)


class NliReplica:
    """One Serve replica: the model loaded once, concurrent requests scored together."""

    def __init__(
        self,
        model: str,
        device: str,
        batch_size: int,
        max_length: int,
        dynamic_padding: bool,
        max_pairs: int,
    ):
        import ray

        self.scorer = NliScorer(
            model,
            device=device,
            batch_size=batch_size,
            max_length=max_length,
            dynamic_padding=dynamic_padding,
        )
        self.score.set_max_batch_size(max_pairs)
        context = ray.get_runtime_context()
        self.where = {
            "pid": os.getpid(),
            "node": context.get_node_id(),
            "actor": context.get_actor_id(),
            "model": model,
        }
        self.requests = self.pairs = self.batches = 0

    @serve.batch(max_batch_size=256, batch_wait_timeout_s=0.002, batch_size_fn=_pairs_in)
    async def score(self, requests: list[list[list[str]]]) -> list[dict[str, Any]]:
        """Each request: [[premise, hypothesis], ...]; each answer: its rows as float32 bytes."""
        flat = [(p, h) for request in requests for p, h in request]
        probs = await asyncio.to_thread(self.scorer.probabilities, flat)
        self.requests, self.pairs = self.requests + len(requests), self.pairs + len(flat)
        self.batches += 1
        ends = np.cumsum([len(r) for r in requests])[:-1]
        return [
            {"probs": part.astype(np.float32).tobytes()} | self.where
            for part in np.split(probs, ends)
        ]

    def info(self) -> dict[str, Any]:
        return self.where | {
            "requests": self.requests,
            "pairs": self.pairs,
            "batches": self.batches,
        }


def nli_app(
    model: str,
    *,
    replicas: int,
    device: str,
    batch_size: int,
    max_length: int,
    dynamic_padding: bool,
    max_pairs: int,
    resources: dict[str, float] | None,
) -> Any:
    """The Serve application: ``replicas`` copies of ``NliReplica``, one CPU each, one GPU each on
    CUDA, unless ``resources`` says ``CPU``/``GPU``; custom resources pin replicas to the nodes
    that have them."""
    custom = dict(resources or {})
    # CPU and GPU are Ray's own keys (a replica's torch runs on as many threads as its CPUs)
    actor: dict[str, Any] = {
        "num_cpus": custom.pop("CPU", 1),
        "num_gpus": custom.pop("GPU", 1 if device.startswith("cuda") else 0),
    }
    if custom:
        actor["resources"] = custom
    deployment: Any = serve.deployment(
        NliReplica,
        name=DEPLOYMENT,
        num_replicas=replicas,
        ray_actor_options=actor,
        max_ongoing_requests=64,
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
    )
    return deployment.bind(model, device, batch_size, max_length, dynamic_padding, max_pairs)


def app_settings(
    model: str,
    *,
    replicas: int = 1,
    device: str = "cpu",
    batch_size: int = 32,
    max_length: int = 512,
    dynamic_padding: bool = True,
    max_pairs: int = 256,
    resources: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``nli_app``'s arguments, checked and with the defaults the local scorer has."""
    if replicas < 1 or max_pairs < batch_size:
        raise ValueError(
            f"NLI app: replicas {replicas} >= 1 and max_pairs {max_pairs} >= "
            f"batch_size {batch_size} wanted"
        )
    return {
        "model": model,
        "replicas": replicas,
        "device": device,
        "batch_size": batch_size,
        "max_length": max_length,
        "dynamic_padding": dynamic_padding,
        "max_pairs": max_pairs,
        "resources": resources,
    }


def app_running(name: str) -> bool:
    app = serve.status().applications.get(name)
    return app is not None and str(app.status) in ("RUNNING", "ApplicationStatus.RUNNING")


def deploy(
    name: str,
    settings: dict[str, Any],
    timeout: float,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Deploy (or update) the named app on the cluster this process joined; wait until RUNNING
    (or until ``stopped()`` says the wait is no longer wanted)."""
    began = time.monotonic()
    serve.start(proxy_location="Disabled")  # handles only: no HTTP proxy to start or guard
    serve.run(nli_app(**settings), name=name, route_prefix=None, blocking=False)
    deadline = began + timeout
    while not app_running(name):
        if stopped():
            raise NliAppError(f"NLI app {name}: its start was called off")
        app = serve.status().applications.get(name)
        if app is not None and "DEPLOY_FAILED" in str(app.status):
            raise NliAppError(f"NLI app {name} failed to deploy: {' '.join(app.message.split())}")
        if time.monotonic() > deadline:
            raise NliAppError(
                f"NLI app {name} not running after {timeout:.0f}s "
                f"({app.status if app else 'not deployed'})"
            )
        time.sleep(0.25)
    startlog.record("serve-nli", f"{name} x{settings.get('replicas')}", time.monotonic() - began)


def replicas_of(handle: Any) -> list[dict[str, Any]]:
    """Where each live replica runs and what it has served."""
    infos = handle.broadcast("info").results()
    return sorted(infos, key=lambda i: (i["node"], i["pid"]))


def start_named(name: str, settings: dict[str, Any], address: str, timeout: float) -> list[dict]:
    """``groundcover serve --nli``: deploy the app on the cluster at ``address`` and leave it
    there (Serve's controller outlives this driver); where its replicas run."""
    import ray

    connect(address)
    try:
        deploy(name, settings, timeout)
        return replicas_of(serve.get_app_handle(name))
    finally:
        ray.shutdown()


def stop_named(name: str, address: str) -> bool:
    """Delete the named app; False when the cluster has none by that name."""
    import ray

    connect(address)
    try:
        if name not in serve.status().applications:
            return False
        serve.delete(name)
        return True
    finally:
        ray.shutdown()


# ---- the driver child -------------------------------------------------------------------------


def _host(
    channel: Channel,
    address: str | None,
    num_cpus: int,
    name: str,
    owned: bool,
    settings: dict[str, Any] | None,
    timeout: float,
    retry_for: float,
) -> None:
    """Joins Ray, deploys the app (``settings``) or finds it, then scores one request per call."""
    try:
        connect(address, num_cpus=num_cpus)
        if settings is not None:
            deploy(name, settings, timeout)
        elif not app_running(name):
            raise NliAppError(
                f"no running NLI app {name} on the Ray cluster at "
                f"{address or 'a local instance'}; start one with `groundcover "
                f"serve --nli MODEL --nli-app {name} --ray-address ADDRESS`"
            )
        handle = serve.get_app_handle(name)
        placed = replicas_of(handle)
    except Exception as exc:
        if owned and settings is not None:
            delete_app(name)
        channel.say({"error": error_line(exc)})
        return
    channel.say({"ready": True, "replicas": placed})

    def answer(request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        if request.get("info"):
            return {"replicas": replicas_of(handle)}, b""
        answers, resent = _score(handle, request["chunks"], retry_for)
        where = [{k: a[k] for k in ("pid", "node")} for a in answers]
        sizes = [len(a["probs"]) for a in answers]
        return {"sizes": sizes, "where": where, "resent": resent}, b"".join(
            a["probs"] for a in answers
        )

    if channel.answer_requests(answer) and owned:  # a gone cluster has no app to delete
        delete_app(name)


def _score(handle: Any, chunks: list[list[list[str]]], retry_for: float) -> tuple[list, int]:
    """Every chunk's answer, sent together; a chunk whose replica died is sent again until a live
    replica answers or none has for ``retry_for`` seconds."""
    answers: list[dict[str, Any] | None] = [None] * len(chunks)
    responses = {k: handle.score.remote(chunk) for k, chunk in enumerate(chunks)}
    failing_since: float | None = None
    resent = 0
    while responses:
        failed, deadline = {}, time.monotonic() + retry_for
        for k, response in responses.items():
            try:
                answers[k] = response.result(timeout_s=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # replica died, or none was live within the timeout
                failed[k] = exc
        if not failed:
            break
        failing_since = failing_since or time.monotonic()
        if time.monotonic() - failing_since > retry_for:
            last = next(iter(failed.values()))
            raise NliAppError(
                f"no live NLI replica answered for {retry_for:.0f}s "
                f"({type(last).__name__}); the run directory is resumable"
            )
        time.sleep(0.5)
        responses = {k: handle.score.remote(chunks[k]) for k in failed}
        resent += len(failed)
    return [a for a in answers if a is not None], resent


def delete_app(name: str) -> None:
    with contextlib.suppress(Exception):
        serve.delete(name)


# ---- the run's side ---------------------------------------------------------------------------


class ServeNliScorer(NliDecisions):
    """``probabilities(pairs)`` like ``NliScorer``, computed by the replicas of a Serve app.

    ``app`` names a running app to use (deployed by ``groundcover serve --nli``); without it this
    scorer deploys ``replicas`` replicas of ``model`` as its own app and deletes it on ``close``.
    ``requests`` counts the requests and pairs each replica answered for this scorer."""

    # a call costs milliseconds: pool what is waiting, and keep every replica busy
    pool_pairs, pool_wait = 1024, 0.005

    def __init__(
        self,
        model: str,
        *,
        replicas: int = 1,
        app: str | None = None,
        device: str = "cpu",
        batch_size: int = 32,
        max_length: int = 512,
        dynamic_padding: bool = True,
        max_pairs: int = 256,
        resources: dict[str, float] | None = None,
        address: str | None = None,
        start_timeout: float = 600.0,
        retry_for: float = 120.0,
    ):
        from transformers import AutoTokenizer

        self.model, self.address, self.batch_size = model, address, batch_size
        self.max_length, self.dynamic_padding = max_length, dynamic_padding
        self.tokenizer = AutoTokenizer.from_pretrained(model)  # to cut calls; the model is remote
        self.owned = app is None
        self.name = app or f"groundcover-nli-{uuid.uuid4().hex[:8]}"
        settings = (
            None
            if app
            else app_settings(
                model,
                replicas=replicas,
                device=device,
                batch_size=batch_size,
                max_length=max_length,
                dynamic_padding=dynamic_padding,
                max_pairs=max_pairs,
                resources=resources,
            )
        )
        self.requests: dict[str, dict[str, Any]] = {}
        self.resent = 0  # requests sent again after their replica died
        args = (
            address,
            max(2, int(replicas * (resources or {}).get("CPU", 1)) + 1),
            self.name,
            self.owned,
            settings,
            start_timeout,
            retry_for,
        )
        self.child = DriverChild(_host, args, "groundcover-nli-serve")
        answer, _ = self._receive(start_timeout + 120)
        if "error" in answer:
            self.child.stop(tidy=False, wait=5)
            raise NliAppError(answer["error"])
        self.placed: list[dict[str, Any]] = answer["replicas"]
        served = sorted({r["model"] for r in self.placed} - {model})
        if served:  # the run records `model`: scoring with another would be a silent swap
            self.close()
            raise NliAppError(
                f"NLI app {self.name} serves {', '.join(served)}, not {model}; "
                "give --nli-model as the app was deployed"
            )

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        out = np.zeros((len(pairs), len(CANONICAL)), dtype=np.float32)
        unique = list(dict.fromkeys(pairs))
        if not unique:
            return out
        chunks = plan_batches(
            self.tokenizer, unique, self.batch_size, self.max_length, self.dynamic_padding
        )
        self.child.send({"chunks": [[list(unique[i]) for i in rows] for rows in chunks]})
        answer, payload = self._receive(None)
        if "gone" in answer:
            raise ClusterGone(answer["gone"])
        if "error" in answer:
            raise NliAppError(f"NLI app {self.name}: {answer['error']}")
        self.resent += answer["resent"]
        flat = np.frombuffer(payload, dtype=np.float32).reshape(-1, len(CANONICAL))
        rows = np.zeros((len(unique), len(CANONICAL)), dtype=np.float32)
        rows[np.concatenate(chunks)] = flat
        for rows_of, where in zip(chunks, answer["where"], strict=True):
            tally = self.requests.setdefault(
                f"{where['node'][:12]}/{where['pid']}",
                {"node": where["node"], "requests": 0, "pairs": 0},
            )
            tally["requests"] += 1
            tally["pairs"] += len(rows_of)
        index = {pair: k for k, pair in enumerate(unique)}
        out[:] = rows[[index[p] for p in pairs]]
        return out

    def replicas(self) -> list[dict[str, Any]]:
        """Each live replica now: node, pid, and what it has served (for anyone)."""
        self.child.send({"info": True})
        answer, _ = self._receive(120)
        if "replicas" not in answer:
            raise NliAppError(f"NLI app {self.name}: {answer.get('error') or answer.get('gone')}")
        return answer["replicas"]

    def placement(self) -> dict[str, Any]:
        """For the run's summary: the app, where its replicas started, who answered what."""
        return {
            "app": self.name,
            "owned": self.owned,
            "replicas_at_start": self.placed,
            "resent": self.resent,
            "answered": self.requests,
        }

    def _receive(self, timeout: float | None) -> tuple[dict[str, Any], bytes]:
        answer = self.child.receive(timeout)
        if answer is not None:
            return answer
        where = self.address or "a local instance"
        if self.child.alive():
            self.close()
            raise NliAppError(
                f"NLI app {self.name} on Ray at {where} did not start within {timeout:.0f}s"
            )
        raise ClusterGone(
            f"the Ray cluster at {where} is gone ({self.child.ended()}); the run "
            "directory is resumable"
        )

    def close(self) -> None:
        """Leave the cluster; an app this scorer deployed is deleted first."""
        self.child.stop(tidy=True, wait=60)
