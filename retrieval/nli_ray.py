"""NLI on a pool of Ray actors: the same batches as ``NliScorer``, scored by N actors that each
hold one copy of the model (one GPU each on GPU nodes) for the scorer's whole life.

The caller deduplicates the pairs and plans the batches exactly as the local scorer does
(``plan_batches``: length-sorted, same size), so every batch has the same padding and the actors
compute what the local path computes; results are joined back by batch number into the caller's
order. The actors start and load the model once, when the scorer is made (a model that will not
load, or actors that cannot be placed, fail there); each ``probabilities`` call then hands its
batches, a few per actor call, to whichever actor is free (``ray.util.ActorPool``). Ray restarts
an actor whose process dies and runs its unfinished calls again (``max_restarts``,
``max_task_retries``), so a lost actor costs time, never a pair.

The Ray driver is a child process, not the run's: Ray ends a driver process without an exception
when its node's raylet dies (at once) or the cluster's GCS stays gone (after 60 s). Here that
ends only the child; the run raises ``ClusterGone`` -- one error line, a resumable run directory.
Requests and answers cross the pipe (``DriverChild``) as JSON and raw float32 bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..serving.cluster.join import (
    Channel,
    ClusterGone,
    DriverChild,
    connect,
    error_line,
)
from .nli import CANONICAL, NliDecisions, NliScorer, plan_batches

__all__ = ["RayNliScorer", "connect"]


class _BatchScorer:
    """A Ray actor: loads the model once, then scores planned batches for as long as it lives."""

    def __init__(self, model: str, device: str, max_length: int, dynamic_padding: bool):
        self.scorer = NliScorer(
            model, device=device, max_length=max_length, dynamic_padding=dynamic_padding
        )

    def ready(self) -> int:
        return os.getpid()

    def score(self, batches: list[dict[str, Any]]) -> tuple[list[tuple[int, bytes]], int]:
        """(batch number, float32 probabilities) for each batch, and this actor's process id."""
        scored = []
        for batch in batches:
            pairs = list(zip(batch["premises"], batch["hypotheses"], strict=True))
            probs = self.scorer.score_batch(pairs).astype(np.float32).tobytes()
            scored.append((batch["batch"], probs))
        return scored, os.getpid()


def _start_actors(settings: dict[str, Any]) -> tuple[list[Any], list[int]]:
    """The scorer's actors, each with its model loaded (spread over the cluster's nodes), and
    their process ids."""
    import ray

    make = ray.remote(_BatchScorer).options(
        num_cpus=1,
        num_gpus=settings["gpus_per_actor"],
        max_restarts=-1,  # a dead actor's process is started again ...
        max_task_retries=-1,  # ... and its unfinished calls run there
        scheduling_strategy="SPREAD",
    )
    actors: list[Any] = [make.remote(**settings["model"]) for _ in range(settings["actors"])]
    waiting = [actor.ready.remote() for actor in actors]
    loaded, _ = ray.wait(waiting, num_returns=len(waiting), timeout=settings["start_timeout"])
    if len(loaded) < len(actors):
        raise TimeoutError(
            f"{len(actors) - len(loaded)} of {len(actors)} NLI actors (1 CPU and "
            f"{settings['gpus_per_actor']} GPU each) not placed and loaded within "
            f"{settings['start_timeout']:.0f} s: the cluster lacks the resources?"
        )
    return actors, [int(pid) for pid in ray.get(waiting)]  # a failed load raises here


def _execute(actors: list[Any], batches: list[dict[str, Any]]) -> tuple[list, set[int]]:
    """The planned batches scored by the free actors: (probabilities per batch, actor pids)."""
    from ray.util import ActorPool

    # Several planned batches per actor call (each still scored alone, so padding is unchanged):
    # about four calls per actor keep the pool balanced at a few milliseconds per call.
    per_call = max(1, min(16, len(batches) // (4 * len(actors))))
    pool = ActorPool(actors)
    for first in range(0, len(batches), per_call):
        group = batches[first : first + per_call]
        pool.submit(lambda actor, part: actor.score.remote(part), group)
    scored: list[bytes | None] = [None] * len(batches)
    workers: set[int] = set()
    while pool.has_next():
        results, pid = pool.get_next_unordered()
        workers.add(int(pid))
        for number, probs in results:
            scored[int(number)] = probs
    missing = sum(s is None for s in scored)
    if missing:  # a call that was retried answers in full; a batch never answered is an error
        raise RuntimeError(f"the NLI actors returned no result for {missing} batches")
    return scored, workers


def _driver(channel: Channel, address: str | None, num_cpus: int, settings: dict) -> None:
    """The child process: joins Ray, starts the actors, then answers one request per pooled call
    until told to stop."""
    try:
        connect(address, num_cpus=num_cpus)
    except Exception as exc:
        channel.say({"error": f"cannot join Ray at {address or 'a local instance'}: {exc}"})
        return
    try:
        actors, pids = _start_actors(settings)
    except Exception as exc:
        channel.say({"error": f"NLI actors on Ray: {error_line(exc)}"})
        return
    channel.say({"ready": True, "actors": pids})

    def score(request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        scored, workers = _execute(actors, request["batches"])
        return {"sizes": [len(s) for s in scored], "workers": sorted(workers)}, b"".join(scored)

    channel.answer_requests(score)


class RayNliScorer(NliDecisions):
    """``probabilities(pairs)`` like ``NliScorer``, computed by ``actors`` Ray actors that load
    the model once, when the scorer is made."""

    # An ``NliBatcher`` takes every pair waiting when a call ends, up to this many, into the next.
    pool_pairs, pool_wait = 1 << 16, 0.05

    def __init__(
        self,
        model: str,
        *,
        actors: int = 2,
        device: str = "cpu",
        batch_size: int = 32,
        max_length: int = 512,
        dynamic_padding: bool = True,
        gpus_per_actor: float = 0,
        address: str | None = None,
        start_timeout: float = 300.0,
    ):
        from transformers import AutoTokenizer

        self.model, self.actors, self.device, self.address = model, actors, device, address
        self.batch_size, self.max_length = batch_size, max_length
        self.dynamic_padding = dynamic_padding
        # one GPU per actor when the model runs on CUDA (--nli-device cuda), unless told
        self.gpus_per_actor = gpus_per_actor or (1 if device.startswith("cuda") else 0)
        self.tokenizer = AutoTokenizer.from_pretrained(model)  # to plan; the model stays remote
        self.executions, self.workers = 0, set[int]()
        settings = {
            "actors": actors,
            "gpus_per_actor": self.gpus_per_actor,
            "start_timeout": start_timeout,
            "model": {
                "model": model,
                "device": device,
                "max_length": max_length,
                "dynamic_padding": dynamic_padding,
            },
        }
        self.child = DriverChild(
            _driver, (address, max(2, actors + 1), settings), "groundcover-ray-nli"
        )
        answer, _ = self._receive(start_timeout + 30)  # the child's own limit comes first
        if "error" in answer:
            raise ClusterGone(answer["error"])
        self.started: set[int] = set(answer["actors"])  # the actors' processes, models loaded

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        out = np.zeros((len(pairs), len(CANONICAL)), dtype=np.float32)
        unique = list(dict.fromkeys(pairs))
        if not unique:
            return out
        batches = plan_batches(
            self.tokenizer, unique, self.batch_size, self.max_length, self.dynamic_padding
        )
        scored = self._run(unique, batches)
        rows = np.zeros((len(unique), len(CANONICAL)), dtype=np.float32)
        for number, members in enumerate(batches):
            rows[members] = scored[number]
        index = {pair: k for k, pair in enumerate(unique)}
        out[:] = rows[[index[p] for p in pairs]]
        return out

    def _run(self, unique: list[tuple[str, str]], batches: list[np.ndarray]) -> list[np.ndarray]:
        items = [
            {
                "batch": n,
                "premises": [unique[i][0] for i in members],
                "hypotheses": [unique[i][1] for i in members],
            }
            for n, members in enumerate(batches)
        ]
        self.child.send({"batches": items})
        answer, payload = self._receive(None)
        if "gone" in answer:
            raise ClusterGone(answer["gone"])
        if "error" in answer:
            raise RuntimeError(f"NLI on Ray: {answer['error']}")
        self.executions += 1
        self.workers = set(answer["workers"])  # which actors did the work
        flat = np.frombuffer(payload, dtype=np.float32).reshape(-1, len(CANONICAL))
        return np.split(
            flat, np.cumsum([size // (4 * len(CANONICAL)) for size in answer["sizes"]])[:-1]
        )

    def _receive(self, timeout: float | None) -> tuple[dict[str, Any], bytes]:
        """The child's next answer; ``ClusterGone`` when it died without one (Ray ended it)."""
        answer = self.child.receive(timeout)
        where = self.address or "a local instance"
        if answer is not None:
            return answer
        if self.child.alive():
            self.close()
            raise ClusterGone(f"Ray at {where} did not start within {timeout:.0f}s")
        raise ClusterGone(
            f"the Ray cluster at {where} is gone ({self.child.ended()}); the run "
            "directory is resumable"
        )

    def close(self) -> None:
        self.child.stop(tidy=True, wait=30)
