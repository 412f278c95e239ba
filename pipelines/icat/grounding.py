"""CG(C; K): top-k snippets per claim (a corpus index or given web snippets), then NLI with the
snippet as premise and the claim as hypothesis; grounded iff some P(entailment) > 0.5.

NLI runs batched across every item in flight: concurrent items hand their pairs to one
``NliBatcher``, which scores them together (length-sorted, de-duplicated) in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...retrieval.nli import NliBatcher
from .data import Snippet
from .scoring import THRESHOLD, first_entailing


class EntailmentModel(Protocol):
    """What NLI grounding needs: (n, 3) probabilities, entailment first (``retrieval.nli``)."""

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...


@dataclass
class ClaimGrounding:
    claim: str
    snippets: list[dict[str, Any]]  # rank order: id, doc_id, text, p_entailment
    first: int | None  # rank of the first entailing snippet

    @property
    def grounded(self) -> bool:
        return self.first is not None

    @property
    def supporting_doc(self) -> str | None:
        return None if self.first is None else self.snippets[self.first]["doc_id"]

    def record(self) -> dict[str, Any]:
        support = None if self.first is None else self.snippets[self.first]
        return {
            "claim": self.claim,
            "grounded": self.grounded,
            "support": support,
            "snippets": [
                {k: s[k] for k in ("id", "doc_id", "p_entailment")} for s in self.snippets
            ],
        }


@dataclass
class Grounder:
    """Snippets from a ``retrieval.index.SearchIndex`` (mode bm25 / dense / hybrid) or from a
    claim -> snippets map; NLI through the shared batcher."""

    batcher: NliBatcher
    k: int = 10
    index: Any = None
    mode: str = "dense"
    web: dict[str, list[Snippet]] | None = None
    threshold: float = THRESHOLD
    search_worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
    )

    async def snippets(self, claims: list[str]) -> list[list[dict[str, Any]]]:
        if self.web is not None:
            return [
                [
                    {"id": s.id, "doc_id": s.doc_id, "text": s.text}
                    for s in self.web.get(" ".join(c.split()), [])[: self.k]
                ]
                for c in claims
            ]
        loop = asyncio.get_running_loop()
        hits = await loop.run_in_executor(
            self.search_worker, lambda: self.index.search(claims, self.k, self.mode)
        )
        return [
            [{"id": h.chunk_id, "doc_id": h.doc_id, "text": h.text} for h in found]
            for found in hits
        ]

    async def ground(self, claims: list[str]) -> list[ClaimGrounding]:
        ranked = await self.snippets(claims)
        pairs = [
            (s["text"], claim) for claim, found in zip(claims, ranked, strict=True) for s in found
        ]
        probs = iter(await self.batcher.entailment(pairs))
        out = []
        for claim, found in zip(claims, ranked, strict=True):
            raw = [next(probs) for _ in found]
            for snippet, p in zip(found, raw, strict=True):
                snippet["p_entailment"] = round(p, 6)  # recorded; the rule reads the raw value
            out.append(ClaimGrounding(claim, found, first_entailing(raw, self.threshold)))
        return out

    def close(self) -> None:
        self.batcher.close()
        self.search_worker.shutdown(wait=False)
        if self.index is not None:
            self.index.close()
