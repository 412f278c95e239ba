"""NLI over a Ray Data actor pool: the same batches as ``NliScorer``, scored by N actors that each
hold one copy of the model (one GPU each on GPU nodes).

The caller deduplicates the pairs and plans the batches exactly as the local scorer does
(``plan_batches``: length-sorted, same size), so every batch has the same padding and the actors
compute what the local path computes; results are joined back by batch number into the caller's
order. Each ``probabilities`` call is one Ray Data execution (actors start, load the model, score
every batch, stop): call it with many pairs at once -- ``NliBatcher`` pools the pairs of all
items in flight. Ray Data restarts an actor that dies and retries its batch.

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
)
from .nli import CANONICAL, NliDecisions, NliScorer, plan_batches

__all__ = ["RayNliScorer", "connect"]


class _BatchScorer:
    """A Ray Data actor: loads the model once, scores one planned batch per row."""

    def __init__(self, model: str, device: str, max_length: int, dynamic_padding: bool):
        self.scorer = NliScorer(
            model, device=device, max_length=max_length, dynamic_padding=dynamic_padding
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        probs = []
        for premises, hypotheses in zip(batch["premises"], batch["hypotheses"], strict=True):
            pairs = list(zip(list(premises), list(hypotheses), strict=True))
            probs.append(self.scorer.score_batch(pairs).astype(np.float32).tobytes())
        return {
            "batch": batch["batch"],
            "probs": np.array(probs, dtype=object),
            "worker": np.full(len(probs), os.getpid()),
        }


def _execute(batches: list[dict[str, Any]], settings: dict[str, Any]) -> tuple[list, set[int]]:
    """One Ray Data execution over the planned batches: (probabilities per batch, actor pids)."""
    import ray.data

    actors = settings["actors"]
    # Several planned batches per Ray task (each still scored alone, so padding is unchanged):
    # per-task overhead is paid per call, about four calls per actor keep the pool balanced.
    per_task = max(1, min(16, len(batches) // (4 * actors)))
    dataset = ray.data.from_items(batches, override_num_blocks=min(len(batches), 4 * actors))
    results = dataset.map_batches(
        _BatchScorer,
        batch_size=per_task,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
        num_gpus=settings["gpus_per_actor"],
        batch_format="numpy",
        fn_constructor_kwargs=settings["model"],
    ).take_all()
    scored: list[bytes | None] = [None] * len(batches)
    for row in results:
        scored[int(row["batch"])] = bytes(row["probs"])
    missing = sum(s is None for s in scored)
    if missing:  # Ray retries failed tasks itself; a batch that never came back is an error
        raise RuntimeError(f"Ray Data returned no result for {missing} NLI batches")
    return scored, {int(row["worker"]) for row in results}


def _driver(channel: Channel, address: str | None, num_cpus: int, settings: dict) -> None:
    """The child process: joins Ray, then answers one request per pooled call until told to stop."""
    try:
        connect(address, num_cpus=num_cpus)
    except Exception as exc:
        channel.say({"error": f"cannot join Ray at {address or 'a local instance'}: {exc}"})
        return
    channel.say({"ready": True})

    def score(request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        scored, workers = _execute(request["batches"], settings)
        return {"sizes": [len(s) for s in scored], "workers": sorted(workers)}, b"".join(scored)

    channel.answer_requests(score)


class RayNliScorer(NliDecisions):
    """``probabilities(pairs)`` like ``NliScorer``, computed by ``actors`` Ray Data actors."""

    # Each call starts its actors (seconds: scripts/benchmarks/bench_scale.py measures it), so an
    # ``NliBatcher`` takes every pair waiting when a call ends, up to this many, into the next.
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
        self.executions, self.workers = 0, set[str]()
        settings = {
            "actors": actors,
            "gpus_per_actor": self.gpus_per_actor,
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
        answer, _ = self._receive(start_timeout)
        if "error" in answer:
            raise ClusterGone(answer["error"])

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
