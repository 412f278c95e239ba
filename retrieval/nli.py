"""Batched NLI over (premise, hypothesis) pairs with a sequence-classification checkpoint.

Any DeBERTa-v3 / BERT-style NLI model given by name or path works; its label order is read from
the checkpoint's ``id2label``. Pairs are sorted by length and padded per batch (dynamic padding),
then returned in the caller's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CANONICAL = ("entailment", "neutral", "contradiction")
_ALIASES = {"entail": "entailment", "entailed": "entailment", "not_entailment": "neutral",
            "contradict": "contradiction", "contradictory": "contradiction"}  # fmt: skip


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


class NliScorer:
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
        """(n, 3) probabilities in CANONICAL order, rows in the order of ``pairs``."""
        out = np.zeros((len(pairs), len(CANONICAL)), dtype=np.float32)
        if not pairs:
            return out
        lengths = [
            len(ids) for ids in self.tokenizer(
                [p for p, _ in pairs], [h for _, h in pairs], truncation=True,
                max_length=self.max_length,
            )["input_ids"]
        ]  # fmt: skip
        order = np.argsort(lengths, kind="stable")[::-1]  # longest first: fewest padded tokens
        if not self.dynamic_padding:
            order = np.arange(len(pairs))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [pairs[i][0] for i in rows], [pairs[i][1] for i in rows],
                padding="longest" if self.dynamic_padding else "max_length",
                truncation=True, max_length=self.max_length, return_tensors="pt",
            ).to(self.device)  # fmt: skip
            with self.torch.inference_mode():
                logits = self.model(**batch).logits.float()
            probs = self.torch.softmax(logits, dim=-1)[:, self.columns]
            out[rows] = probs.cpu().numpy()
        return out

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
