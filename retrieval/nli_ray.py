"""NLI over a Ray Data actor pool: the same batches as ``NliScorer``, scored by N actors that each
hold one copy of the model (one GPU each on GPU nodes).

The driver deduplicates the pairs and plans the batches exactly as the local scorer does
(``plan_batches``: length-sorted, same size), so every batch has the same padding and the actors
compute what the local path computes; results are joined back by batch number into the caller's
order. Each ``probabilities`` call is one Ray Data execution (actors start, load the model, score
every batch, stop): call it with many pairs at once -- ``NliBatcher`` pools the pairs of all
items in flight.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from retrieval.nli import CANONICAL, NliScorer, plan_batches


class _BatchScorer:
    """A Ray Data actor: loads the model once, scores one planned batch per row."""

    def __init__(self, model: str, device: str, max_length: int, dynamic_padding: bool):
        self.scorer = NliScorer(model, device=device, max_length=max_length,
                                dynamic_padding=dynamic_padding)  # fmt: skip

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        probs = []
        for premises, hypotheses in zip(batch["premises"], batch["hypotheses"], strict=True):
            pairs = list(zip(list(premises), list(hypotheses), strict=True))
            probs.append(self.scorer.score_batch(pairs).astype(np.float32).tobytes())
        return {"batch": batch["batch"], "probs": np.array(probs, dtype=object),
                "worker": np.full(len(probs), os.getpid())}  # fmt: skip


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``auto``), or start a local Ray once."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "ignore_reinit_error": True}  # fmt: skip
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, **kwargs)


class RayNliScorer:
    """``probabilities(pairs)`` like ``NliScorer``, computed by ``actors`` Ray Data actors."""

    def __init__(self, model: str, *, actors: int = 2, device: str = "cpu", batch_size: int = 32,
                 max_length: int = 512, dynamic_padding: bool = True, gpus_per_actor: float = 0,
                 address: str | None = None):  # fmt: skip
        from transformers import AutoTokenizer

        connect(address, num_cpus=None if address else max(2, actors + 1))
        self.model, self.actors, self.device = model, actors, device
        self.batch_size, self.max_length = batch_size, max_length
        # one GPU per actor when the model runs on CUDA (--nli-device cuda), unless told
        self.dynamic_padding = dynamic_padding
        self.gpus_per_actor = gpus_per_actor or (1 if device.startswith("cuda") else 0)
        self.tokenizer = AutoTokenizer.from_pretrained(model)  # to plan; the model stays remote
        self.executions = 0

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        out = np.zeros((len(pairs), len(CANONICAL)), dtype=np.float32)
        unique = list(dict.fromkeys(pairs))
        if not unique:
            return out
        batches = plan_batches(self.tokenizer, unique, self.batch_size, self.max_length,
                               self.dynamic_padding)  # fmt: skip
        scored = self._run(unique, batches)
        rows = np.zeros((len(unique), len(CANONICAL)), dtype=np.float32)
        for number, members in enumerate(batches):
            rows[members] = scored[number]
        index = {pair: k for k, pair in enumerate(unique)}
        out[:] = rows[[index[p] for p in pairs]]
        return out

    def _run(self, unique: list[tuple[str, str]], batches: list[np.ndarray]) -> list[np.ndarray]:
        import ray.data

        items = [{"batch": n, "premises": [unique[i][0] for i in members],
                  "hypotheses": [unique[i][1] for i in members]}
                 for n, members in enumerate(batches)]  # fmt: skip
        dataset = ray.data.from_items(items, override_num_blocks=min(len(items), 4 * self.actors))
        results = dataset.map_batches(
            _BatchScorer, batch_size=1, concurrency=self.actors, num_cpus=1,
            num_gpus=self.gpus_per_actor, batch_format="numpy",
            fn_constructor_kwargs={"model": self.model, "device": self.device,
                                   "max_length": self.max_length,
                                   "dynamic_padding": self.dynamic_padding},
        ).take_all()  # fmt: skip
        self.executions += 1
        self.workers = {int(row["worker"]) for row in results}  # which actors did the work
        scored: list[np.ndarray | None] = [None] * len(batches)
        for row in results:
            n = int(row["batch"])
            scored[n] = np.frombuffer(row["probs"], dtype=np.float32).reshape(-1, len(CANONICAL))
        missing = [n for n, s in enumerate(scored) if s is None]
        if missing:  # Ray retries failed tasks itself; a batch that never came back is an error
            raise RuntimeError(f"Ray Data returned no result for {len(missing)} NLI batches")
        return scored  # type: ignore[return-value]
