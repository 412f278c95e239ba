"""Search an index directory written by index_build: BM25, dense, hybrid (RRF), MMR, reranking.

    index = SearchIndex.load("indexes/wiki")
    hits = index.search(["who built the tower?"], k=10, mode="hybrid", mmr=0.7)

Loading checks the manifest against the files (presence, sizes, counts) and, when asked, against
the caller's expectations (embedding model, chunking), refusing mismatches with a clear message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..index_build.ann import apply_search_params

Mode = Literal["bm25", "dense", "hybrid"]


class IndexError_(RuntimeError):  # noqa: N801 - "IndexError" is a builtin
    pass


@dataclass(frozen=True)
class Hit:
    row: int
    chunk_id: str
    doc_id: str
    score: float
    text: str
    title: str = ""


class SearchIndex:
    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.manifest = manifest
        self.n = manifest["counts"]["chunks"]
        self.offsets = np.load(path / "chunk_offsets.npy", mmap_mode="r")
        # pread on one descriptor: random access that is safe from several threads at once
        self._fd = os.open(path / "chunks.jsonl", os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        # optional parts, present when the index has them (faiss and bm25s are untyped)
        self.bm25: Any = None
        self.tokenizer: Any = None
        self.faiss: Any = None
        self.embeddings: Any = None
        self._encoder: Any = None

    # ---- loading ---------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path | str, expect: dict[str, Any] | None = None) -> SearchIndex:
        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise IndexError_(f"{path}: not an index directory (no manifest.json)")
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise IndexError_(f"{manifest_path}: corrupt manifest: {exc.msg}") from exc
        for name, size in manifest.get("files", {}).items():
            file = path / name
            if not file.is_file():
                raise IndexError_(f"{path}: missing index file {name}")
            if file.stat().st_size != size:
                raise IndexError_(
                    f"{file}: size {file.stat().st_size} differs from the manifest ({size}): "
                    "corrupt or from another build"
                )
        check_expectations(manifest, expect or {}, path)
        index = cls(path, manifest)
        index._open_parts()
        return index

    def _open_parts(self) -> None:
        if len(self.offsets) != self.n:
            raise IndexError_(f"{self.path}: {len(self.offsets)} chunk offsets, manifest {self.n}")
        if "bm25" in self.manifest:
            import bm25s

            from ..index_build.build import bm25_tokenizer

            self.bm25 = bm25s.BM25.load(self.path / "bm25", mmap=True, show_progress=False)
            self.tokenizer = bm25_tokenizer()
            self.tokenizer.load_vocab(self.path / "bm25")
        if "dense" in self.manifest:
            import faiss

            self.embeddings = np.load(self.path / "embeddings.npy", mmap_mode="r")
            if self.embeddings.shape != (self.n, self.manifest["dense"]["dim"]):
                raise IndexError_(
                    f"{self.path}: embeddings shape {self.embeddings.shape} "
                    f"!= ({self.n}, {self.manifest['dense']['dim']})"
                )
            # memory-mapped, not read: IVF lists (IO_FLAG_MMAP) or flat storage (_IFC), so a
            # large index costs page cache that several processes share, not private memory
            ivf = self.manifest["faiss"]["kind"].startswith("ivf")
            flag = faiss.IO_FLAG_MMAP if ivf else faiss.IO_FLAG_MMAP_IFC
            try:
                self.faiss = faiss.read_index(str(self.path / "faiss.index"), flag)
            except RuntimeError:
                self.faiss = faiss.read_index(str(self.path / "faiss.index"))
            if self.faiss.ntotal != self.n:
                raise IndexError_(
                    f"{self.path}: faiss holds {self.faiss.ntotal} vectors, manifest {self.n}"
                )
            apply_search_params(self.faiss, self.manifest["faiss"])  # as built, or as tuned

    # ---- chunks ----------------------------------------------------------------------------

    def chunk(self, row: int) -> dict[str, Any]:
        start = int(self.offsets[row])
        stop = int(self.offsets[row + 1]) if row + 1 < self.n else self._size
        return json.loads(os.pread(self._fd, stop - start, start))

    @cached_property
    def doc_rows(self) -> dict[str, range]:
        """Rows of each document's chunks (contiguous: chunks are written document by document);
        one pass over chunks.jsonl, on first use."""
        spans: dict[str, range] = {}
        with open(self.path / "chunks.jsonl", "rb") as handle:
            for row, line in enumerate(handle):
                doc = json.loads(line)["doc_id"]
                first = spans[doc].start if doc in spans else row
                spans[doc] = range(first, row + 1)
        return spans

    def hit(self, row: int, score: float) -> Hit:
        c = self.chunk(row)
        return Hit(row, c["id"], c["doc_id"], score, c["text"], c["title"])

    def _hits(self, rows: np.ndarray, scores: np.ndarray) -> list[Hit]:
        out = []
        for row, score in zip(rows, scores, strict=True):
            if row < 0:  # faiss pads with -1 when fewer than k results exist
                continue
            out.append(self.hit(int(row), float(score)))
        return out

    # ---- first-stage search ----------------------------------------------------------------

    def bm25_search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.bm25 is None:
            raise IndexError_(f"{self.path}: built without BM25")
        ids = self.tokenizer.tokenize(queries, update_vocab=False, show_progress=False)
        k = min(k, self.n)
        rows, scores = self.bm25.retrieve(ids, k=k, show_progress=False, n_threads=1)
        return np.asarray(rows), np.asarray(scores)

    def bm25_within(self, query: str, docs: list[str]) -> list[Hit]:
        """Every chunk of ``docs`` ranked by BM25 against ``query`` (ties in document then chunk
        order); the collection's statistics, not just these documents'."""
        if self.bm25 is None:
            raise IndexError_(f"{self.path}: built without BM25")
        rows = np.asarray([r for d in docs for r in self.doc_rows.get(d, ())], dtype=np.int64)
        if rows.size == 0:
            return []
        ids = self.tokenizer.tokenize(
            [query], update_vocab=False, return_as="ids", show_progress=False
        )[0]
        known = [int(i) for i in ids if int(i) in self._known_ids]
        scores = self.bm25.get_scores(known)[rows] if known else np.zeros(rows.size)
        order = np.argsort(-scores, kind="stable")
        return [self.hit(int(rows[i]), float(scores[i])) for i in order]

    @cached_property
    def _known_ids(self) -> set[int]:
        return set(self.bm25.vocab_dict.values())

    def encode(self, queries: list[str]) -> np.ndarray:
        if self.faiss is None:
            raise IndexError_(f"{self.path}: built without dense embeddings")
        if self._encoder is None:
            from sentence_transformers import SentenceTransformer

            self._encoder = SentenceTransformer(self.manifest["dense"]["model_path"], device="cpu")
        from ..index_build.build import CPU_ENCODE_BATCH

        vectors = self._encoder.encode(
            queries,
            batch_size=CPU_ENCODE_BATCH,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def dense_search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encode(queries)  # raises a clear error first when there is no dense part
        return self.vector_search(vectors, k)

    def vector_search(
        self, vectors: np.ndarray, k: int, refine: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows for normalised query vectors. A compressed index (``refine`` > 0 in its
        manifest, or given) fetches refine*k candidates and re-ranks them by exact inner product
        with the stored vectors."""
        k = min(k, self.n)
        refine = self.manifest["faiss"].get("refine", 0) if refine is None else refine
        if refine <= 1:
            scores, rows = self.faiss.search(vectors, k)
            return rows, scores
        _, candidates = self.faiss.search(vectors, min(self.n, refine * k))
        return exact_rerank(vectors, candidates, self.embeddings, k)

    def search(
        self,
        queries: list[str],
        k: int = 10,
        mode: Mode = "hybrid",
        *,
        rrf_k: int = 60,
        depth: int | None = None,
        mmr: float | None = None,
        reranker: Any = None,
    ) -> list[list[Hit]]:
        """Top-k per query. ``depth`` candidates (default 4k) feed fusion, MMR and reranking."""
        depth = max(k, depth or 4 * k)
        if mode == "bm25":
            rows, scores = self.bm25_search(queries, depth)
        elif mode == "dense":
            rows, scores = self.dense_search(queries, depth)
        else:
            rows, scores = rrf(
                [self.bm25_search(queries, depth), self.dense_search(queries, depth)], rrf_k, depth
            )
        if mmr is not None and self.embeddings is None:
            raise IndexError_("MMR needs dense embeddings in the index")
        query_vectors = self.encode(queries) if mmr is not None else None  # once per batch
        results = []
        for qi, query in enumerate(queries):
            r, s = rows[qi], scores[qi]
            keep = r >= 0
            r, s = r[keep], s[keep]
            if query_vectors is not None and mmr is not None:
                stored = np.asarray(self.embeddings[r], dtype=np.float32)
                r, s = mmr_select(query_vectors[qi], stored, r, s, k=len(r), lam=mmr)
            hits = self._hits(r, s)
            if reranker is not None:
                hits = reranker.rerank(query, hits)
            results.append(hits[:k])
        return results

    def close(self) -> None:
        os.close(self._fd)


def check_expectations(manifest: dict, expect: dict, path: Path) -> None:
    """expect keys: dense_model, chunking (dict), corpus_sha256, faiss kind."""
    dense = manifest.get("dense", {})
    checks = {
        "dense_model": dense.get("model"),
        "chunking": manifest.get("chunking"),
        "corpus_sha256": manifest["corpus"]["sha256"],
        "faiss": manifest.get("faiss", {}).get("kind"),
        "dim": dense.get("dim"),
    }
    for key, wanted in expect.items():
        if key not in checks:
            raise ValueError(f"unknown expectation {key!r}")
        if checks[key] != wanted:
            raise IndexError_(
                f"{path}: index was built with {key}={checks[key]!r}, expected {wanted!r}; "
                "rebuild the index or change the configuration"
            )


def exact_rerank(
    queries: np.ndarray, candidates: np.ndarray, stored: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the k best candidates per query by exact inner product; ``stored`` is
    read only at the candidates' rows (a memory map stays on disk)."""
    rows = np.full((len(queries), k), -1, dtype=np.int64)
    scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    for q, found in enumerate(candidates):
        found = found[found >= 0]
        order = np.argsort(found)  # ascending rows: sequential reads from the memory map
        exact = np.asarray(stored[found[order]], dtype=np.float32) @ queries[q]
        best = np.argsort(-exact, kind="stable")[:k]
        rows[q, : len(best)] = found[order][best]
        scores[q, : len(best)] = exact[best]
    return rows, scores


def rrf(
    runs: list[tuple[np.ndarray, np.ndarray]], k_rrf: int, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion: score(d) = sum over runs of 1 / (k_rrf + rank), rank from 1."""
    n_queries = len(runs[0][0])
    rows = np.full((n_queries, depth), -1, dtype=np.int64)
    scores = np.zeros((n_queries, depth), dtype=np.float64)
    for q in range(n_queries):
        fused: dict[int, float] = {}
        for run_rows, _ in runs:
            for rank, row in enumerate(run_rows[q], 1):
                if row >= 0:
                    fused[int(row)] = fused.get(int(row), 0.0) + 1.0 / (k_rrf + rank)
        ranked = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
        for i, (row, score) in enumerate(ranked):
            rows[q, i], scores[q, i] = row, score
    return rows, scores


def mmr_select(
    query: np.ndarray,
    vectors: np.ndarray,
    rows: np.ndarray,
    scores: np.ndarray,
    k: int,
    lam: float = 0.7,
) -> tuple[np.ndarray, np.ndarray]:
    """Maximal marginal relevance over candidates: lam * sim(q, d) - (1 - lam) * max sim(d, s)."""
    relevance = vectors @ query
    chosen: list[int] = []
    candidates = list(range(len(rows)))
    while candidates and len(chosen) < k:
        if chosen:
            redundancy = (vectors[candidates] @ vectors[chosen].T).max(axis=1)
        else:
            redundancy = np.zeros(len(candidates))
        gains = lam * relevance[candidates] - (1 - lam) * redundancy
        best = candidates[int(np.argmax(gains))]
        chosen.append(best)
        candidates.remove(best)
    return rows[chosen], scores[chosen]


class CrossEncoderReranker:
    """Re-score hits with a cross-encoder checkpoint (name or path) from the configuration."""

    def __init__(self, model: str, device: str = "cpu", batch_size: int = 32):
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(model, device=device)
        self.batch_size = batch_size

    def rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        if not hits:
            return hits
        scores = self.model.predict(
            [(query, h.text) for h in hits], batch_size=self.batch_size, show_progress_bar=False
        )
        scores = np.asarray(scores, dtype=float).reshape(len(hits), -1)[:, -1]
        order = np.argsort(-scores, kind="stable")
        return [
            Hit(
                hits[i].row,
                hits[i].chunk_id,
                hits[i].doc_id,
                float(scores[i]),
                hits[i].text,
                hits[i].title,
            )
            for i in order
        ]
