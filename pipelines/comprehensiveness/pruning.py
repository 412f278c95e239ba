"""Opt-in candidate pruning for the pairwise NLI stage (never in the paper protocol).

The NLI method judges 2·|A_R|·|A_C| + |A_C|(|A_C|−1) ordered pairs per item. Pairs whose two texts
are far apart in embedding space rarely entail; with ``--prune-below T`` a pair whose cosine
similarity (all-MiniLM-L6-v2, shipped offline, or ``--prune-model``) is below T is not sent to
the judge and counts as neutral. Each record says how many pairs were judged and skipped;
``edge_recall`` measures what pruning lost against an exhaustive run of the same judge on the
same items.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from groundcover import ItemContext

Pair = tuple[str, str]  # (premise text, hypothesis text)


class Pruner:
    def __init__(self, threshold: float, model: str = "default"):
        from sentence_transformers import SentenceTransformer

        from ...index_build.build import resolve_model

        self.threshold = threshold
        self.encoder = SentenceTransformer(resolve_model(model), device="cpu")

    def similarities(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Cosine similarity of each pair's two texts."""
        if not pairs:
            return np.zeros(0)
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        vectors = self.encoder.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        row = {t: k for k, t in enumerate(texts)}
        left = vectors[[row[p] for p, _ in pairs]]
        right = vectors[[row[h] for _, h in pairs]]
        return (left * right).sum(axis=1)


class PrunedJudge:
    """An NLI judge that only sees the pairs above the similarity threshold; the others are
    neutral (probability 1) and counted in ``details["pruning"]``."""

    def __init__(self, judge: Any, pruner: Pruner):
        self.inner, self.pruner = judge, pruner
        self.name = f"{judge.name}+pruned"

    async def judge(self, ctx: ItemContext, pairs: list[Pair]) -> list[tuple[str, float]]:
        similarity = await asyncio.to_thread(self.pruner.similarities, pairs)
        keep = [p for p, s in zip(pairs, similarity, strict=True) if s >= self.pruner.threshold]
        judged = dict(zip(keep, await self.inner.judge(ctx, keep), strict=True)) if keep else {}
        ctx.details["pruning"] = {
            "threshold": self.pruner.threshold,
            "judged": len(keep),
            "skipped": len(pairs) - len(keep),
        }
        return [judged.get(p, ("neutral", 1.0)) for p in pairs]

    def placement(self) -> dict[str, Any] | None:
        found = getattr(self.inner, "placement", None)
        return found() if callable(found) else None

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


def entailment_edges(record: dict[str, Any]) -> set[tuple[str, str]]:
    """The ordered (premise text, hypothesis text) entailments an NLI-method record judged."""
    text = {s["id"]: s["text"] for s in record["details"].get("statements", [])}
    return {
        (text[r["premise"]], text[r["hypothesis"]])
        for r in record["details"].get("relations", [])
        if r["label"] == "entailment" and r["premise"] in text and r["hypothesis"] in text
    }


def edge_recall(exhaustive: list[dict], pruned: list[dict]) -> dict[str, Any]:
    """Share of the exhaustive run's entailment edges the pruned run still has (items both runs
    scored), with the pairs each run sent to the judge."""
    by_id = {r["id"]: r for r in pruned}
    found = total = judged = skipped = full = 0
    for record in exhaustive:
        other = by_id.get(record["id"])
        if other is None or "relations" not in record["details"]:
            continue
        edges = entailment_edges(record)
        total += len(edges)
        found += len(edges & entailment_edges(other))
        full += record["details"]["pairs"]["judged"]
        pruning = other["details"].get("pruning", {})
        judged += pruning.get("judged", other["details"].get("pairs", {}).get("judged", 0))
        skipped += pruning.get("skipped", 0)
    return {
        "edges": total,
        "kept": found,
        "recall": found / total if total else None,
        "pairs_exhaustive": full,
        "pairs_judged": judged,
        "pairs_skipped": skipped,
    }
