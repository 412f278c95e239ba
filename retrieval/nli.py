"""Batched NLI over (premise, hypothesis) pairs with a sequence-classification checkpoint.

Any DeBERTa-v3 / BERT-style NLI model given by name or path works; its label order is read from
the checkpoint's ``id2label``. Pairs are sorted by length and padded per batch (dynamic padding),
then returned in the caller's order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

CANONICAL = ("entailment", "neutral", "contradiction")
_ALIASES = {
    "entail": "entailment",
    "entailed": "entailment",
    "not_entailment": "neutral",
    "contradict": "contradiction",
    "contradictory": "contradiction",
}


class NliModelError(ValueError):
    pass


def canonical_columns(id2label: dict) -> list[int]:
    """Model output column of each canonical label, from the checkpoint's id2label."""
    found: dict[str, int] = {}
    for index, name in id2label.items():
        key = str(name).strip().lower()
        key = _ALIASES.get(key, key)
        if key in CANONICAL:
            found[key] = int(index)
    missing = [label for label in CANONICAL if label not in found]
    if missing:
        raise NliModelError(
            f"checkpoint labels {sorted(map(str, id2label.values()))} lack {missing}; "
            "an NLI model needs entailment, neutral and contradiction"
        )
    return [found[label] for label in CANONICAL]


def plan_batches(
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    batch_size: int,
    max_length: int,
    dynamic_padding: bool = True,
) -> list[np.ndarray]:
    """The batches (row indices into ``pairs``) a scorer runs: longest pairs first, so each
    batch pads to few tokens. Any executor that scores these batches (``NliScorer`` here, Ray
    actors in ``retrieval.nli_ray``) gets the same numbers."""
    if not pairs:
        return []
    lengths = None
    if dynamic_padding:
        lengths = [len(ids) for ids in encode(tokenizer, pairs, max_length)["input_ids"]]
    return batch_rows(len(pairs), batch_size, lengths)


def encode(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int):
    """Token ids of (premise, hypothesis) pairs, truncated, unpadded."""
    return tokenizer(
        [p for p, _ in pairs], [h for _, h in pairs], truncation=True, max_length=max_length
    )


def batch_rows(n: int, batch_size: int, lengths: Sequence[int] | None) -> list[np.ndarray]:
    """Rows in batches of ``batch_size``: longest first when ``lengths`` are given (a stable sort,
    so equal lengths keep their order), else in input order."""
    order = np.arange(n) if lengths is None else np.argsort(lengths, kind="stable")[::-1]
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


class NliDecisions:
    """Labels and the supported-claim test from ``probabilities`` alone, so the local scorer and
    the Ray one (``retrieval.nli_ray.RayNliScorer``) decide alike."""

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        raise NotImplementedError

    def labels(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
        return [CANONICAL[i] for i in self.probabilities(pairs).argmax(axis=1)]

    def supported(
        self, claim: str, passages: Sequence[str], threshold: float | None = None
    ) -> bool:
        """Is the claim entailed by at least one passage (argmax, or P(entail) >= threshold)?"""
        if not passages:
            return False
        probs = self.probabilities([(p, claim) for p in passages])
        if threshold is None:
            return bool((probs.argmax(axis=1) == 0).any())
        return bool((probs[:, 0] >= threshold).any())


class NliScorer(NliDecisions):
    def __init__(
        self,
        model: str,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        max_length: int = 512,
        dtype: str | None = None,
        dynamic_padding: bool = True,
    ):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
        self.model = AutoModelForSequenceClassification.from_pretrained(model, **kwargs)
        self.model.to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.dynamic_padding = dynamic_padding  # False: input order, padded to max_length (bench)
        self.columns = canonical_columns(self.model.config.id2label)

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """(n, 3) probabilities in CANONICAL order, rows in the order of ``pairs``; a repeated
        pair is scored once. The pairs are tokenised once: the length plan and every batch read
        the same ids (on a GPU the tokeniser, run twice, took a fifth to nine tenths of the time:
        scripts/gpu_check.py)."""
        unique = list(dict.fromkeys(pairs))
        scored = np.zeros((len(unique), len(CANONICAL)), dtype=np.float32)
        if unique:
            encoded = encode(self.tokenizer, unique, self.max_length)
            lengths = [len(ids) for ids in encoded["input_ids"]] if self.dynamic_padding else None
            for rows in batch_rows(len(unique), self.batch_size, lengths):
                scored[rows] = self.score_encoded(encoded, rows)
        index = {pair: k for k, pair in enumerate(unique)}
        return scored[[index[p] for p in pairs]].reshape(len(pairs), len(CANONICAL))

    def plan(self, pairs: Sequence[tuple[str, str]]) -> list[np.ndarray]:
        return plan_batches(
            self.tokenizer, pairs, self.batch_size, self.max_length, self.dynamic_padding
        )

    def score_batch(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """One forward pass: (len(pairs), 3) probabilities in CANONICAL order."""
        encoded = encode(self.tokenizer, pairs, self.max_length)
        return self.score_encoded(encoded, np.arange(len(pairs)))

    def score_encoded(self, encoded, rows: np.ndarray) -> np.ndarray:
        """One forward pass over ``rows`` of already tokenised pairs, padded as the tokenizer
        pads (its side and pad ids) to the longest row, or to ``max_length`` without dynamic
        padding."""
        torch = self.torch
        ids = [encoded["input_ids"][i] for i in rows]
        width = max(map(len, ids)) if self.dynamic_padding else self.max_length
        fill = {
            "input_ids": self.tokenizer.pad_token_id,
            "token_type_ids": self.tokenizer.pad_token_type_id,
        }
        batch = {}
        for key in encoded:
            rows_of_key = [encoded[key][i] for i in rows]
            padded = np.full((len(rows), width), fill.get(key, 0), dtype=np.int64)
            for k, values in enumerate(rows_of_key):
                if self.tokenizer.padding_side == "left":
                    padded[k, width - len(values) :] = values
                else:
                    padded[k, : len(values)] = values
            batch[key] = torch.from_numpy(padded).to(self.device)
        with torch.inference_mode():
            logits = self.model(**batch).logits.float()
        return torch.softmax(logits, dim=-1)[:, self.columns].cpu().numpy()


class PairScorer(Protocol):
    """``NliScorer``, ``retrieval.nli_ray.RayNliScorer`` or any (n, 3) CANONICAL scorer."""

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...


class NliBatcher:
    """Collects (premise, hypothesis) pairs from concurrent callers (the items in flight) and
    scores them together in batches of up to ``max_pairs`` in one worker thread; identical pairs
    are scored once; an error reaches every waiting caller."""

    def __init__(self, model: PairScorer, max_pairs: int | None = None, wait: float | None = None):
        # a scorer with a fixed cost per call (Ray actors start per call) asks for bigger pools
        self.model = model
        self.max_pairs: int = max_pairs or int(getattr(model, "pool_pairs", 512))
        self.wait = getattr(model, "pool_wait", 0.005) if wait is None else wait
        self.pending: list[tuple[list[tuple[str, str]], asyncio.Future]] = []
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nli")
        self.flushing: asyncio.Task | None = None
        self.batches = 0

    async def rows(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """(len(pairs), 3) probabilities in CANONICAL order."""
        if not pairs:
            return np.zeros((0, len(CANONICAL)), dtype=np.float32)
        future = asyncio.get_running_loop().create_future()
        self.pending.append((pairs, future))
        if self.flushing is None or self.flushing.done():
            self.flushing = asyncio.create_task(self._flush())
        return await future

    async def entailment(self, pairs: list[tuple[str, str]]) -> list[float]:
        return [float(row[0]) for row in await self.rows(pairs)]

    async def _flush(self) -> None:
        await asyncio.sleep(self.wait)  # let the other items in flight add their pairs
        loop = asyncio.get_running_loop()
        while self.pending:
            taken: list[tuple[list[Any], asyncio.Future]] = []
            size = 0
            while self.pending and (not taken or size + len(self.pending[0][0]) <= self.max_pairs):
                pairs, future = self.pending.pop(0)
                taken.append((pairs, future))
                size += len(pairs)
            unique = list(dict.fromkeys(p for pairs, _ in taken for p in pairs))
            try:
                probs = await loop.run_in_executor(self.worker, self.model.probabilities, unique)
            except Exception as exc:  # every waiting item gets the error, none hangs
                for _, future in taken:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            row = {pair: k for k, pair in enumerate(unique)}
            for pairs, future in taken:
                if not future.done():
                    future.set_result(np.asarray(probs)[[row[p] for p in pairs]])

    def close(self) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)
