"""FAISS indexes over an index directory's stored embeddings.

Kinds (inner product on L2-normalised vectors, i.e. cosine):
    flat      exact search; 4*dim bytes per vector
    hnsw      HNSW graph over full vectors
    ivf-hnsw  IVF lists of full vectors, HNSW coarse quantiser (the ICAT paper's index)
    ivf-pq    IVF lists of product-quantised codes (pq_m bytes at 8 bits), HNSW coarse quantiser,
              optional OPQ rotation; searched with exact re-ranking of refine*k candidates from
              the stored (memory-mapped) vectors

``plan_faiss`` resolves the kind (``auto``: by corpus size and ``memory_budget``) and estimates the
bytes the index needs resident; a build that would exceed the budget is refused before any
embedding is computed. ``build_faiss_file`` trains on a sample and adds the vectors in streamed
batches, sharded and resumable (each shard's inverted lists are a file; a rerun skips the shards
that exist), in this process or as Ray tasks, then merges the lists in row order.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..serving import files

AUTO_FLAT_BELOW = 50_000  # the ICAT paper's rule: Flat below 50,000 chunks, else IVF + HNSW32
AUTO_IVF_NPROBE = 256
GB = 1e9
ADD_BATCH = 65_536


class BudgetError(ValueError):
    pass


@dataclass(frozen=True)
class FaissPlan:
    """One index kind resolved for a corpus of ``n`` vectors of ``dim`` dimensions."""

    kind: str
    n: int
    dim: int
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int = 0
    nprobe: int = 0
    pq_m: int = 0
    pq_bits: int = 8
    opq: bool = False
    refine: int = 0

    @property
    def ivf(self) -> bool:
        return self.kind in ("ivf-hnsw", "ivf-pq")

    def index_bytes(self) -> int:
        """Bytes of the FAISS index when resident (its file size, within a few per cent)."""
        graph = 8 * self.hnsw_m + 20  # level-0 links (2M x int32), levels, offsets, upper levels
        if self.kind == "flat":
            return self.n * 4 * self.dim
        if self.kind == "hnsw":
            return self.n * (4 * self.dim + graph)
        quantiser = self.nlist * (4 * self.dim + graph)
        if self.kind == "ivf-hnsw":
            return self.n * (4 * self.dim + 8) + quantiser
        code = math.ceil(self.pq_m * self.pq_bits / 8)
        tables = 4 * self.dim * 2**self.pq_bits + (4 * self.dim * self.dim if self.opq else 0)
        return self.n * (code + 8) + quantiser + tables

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "metric": "inner_product"}
        if self.kind == "hnsw":
            out |= {
                "M": self.hnsw_m,
                "efConstruction": self.ef_construction,
                "efSearch": self.ef_search,
            }
        if self.ivf:
            out |= {"nlist": self.nlist, "nprobe": self.nprobe, "quantizer": f"HNSW{self.hnsw_m}"}
        if self.kind == "ivf-pq":
            out |= {
                "pq_m": self.pq_m,
                "pq_bits": self.pq_bits,
                "opq": self.opq,
                "refine": self.refine,
            }
        return out | {"bytes_per_vector": round(self.index_bytes() / max(self.n, 1), 1)}


def default_nlist(n: int) -> int:
    return max(1, min(n // 39, int(4 * math.sqrt(n))))


def default_pq_m(dim: int, target: int) -> int:
    """The largest divisor of ``dim`` not above ``target`` (sub-vectors must tile the vector)."""
    return max(m for m in range(1, min(dim, target) + 1) if dim % m == 0)


def plan_faiss(spec: Any, n: int, dim: int) -> FaissPlan:
    """Resolve ``spec.faiss`` (an ``IndexSpec``) for n x dim vectors; refuse what the budget
    cannot hold, in one line."""
    budget = spec.memory_budget * GB if spec.memory_budget else None
    if spec.faiss != "auto":
        plan = _plan(spec, spec.faiss, n, dim)
        if budget is not None and plan.index_bytes() > budget:
            raise BudgetError(
                _too_large(plan, spec.memory_budget, "")
                + (
                    f"; --faiss ivf-pq needs about {_gb(_plan(spec, 'ivf-pq', n, dim))}"
                    if plan.kind != "ivf-pq"
                    else "; lower --pq-m"
                )
            )
        return plan
    paper = _plan(spec, "flat" if n < AUTO_FLAT_BELOW else "ivf-hnsw", n, dim)
    if budget is None or paper.index_bytes() <= budget:
        return paper
    # compressed: the most bytes per code that fit, from dim/4 down to 8 sub-vectors
    for target in (dim // 4, dim // 8, dim // 16, 8):
        plan = _plan(spec.model_copy(update={"pq_m": default_pq_m(dim, target)}), "ivf-pq", n, dim)
        if plan.index_bytes() <= budget:
            return plan
    raise BudgetError(_too_large(plan, spec.memory_budget, " even at its smallest"))


def _plan(spec: Any, kind: str, n: int, dim: int) -> FaissPlan:
    plan = FaissPlan(kind, n, dim, spec.hnsw_m, spec.ef_construction, spec.ef_search)
    if kind not in ("ivf-hnsw", "ivf-pq"):
        return plan
    nlist = min(spec.ivf_nlist or default_nlist(n), n)
    nprobe = spec.ivf_nprobe if spec.faiss != "auto" or kind == "ivf-pq" else AUTO_IVF_NPROBE
    plan = replace(plan, nlist=nlist, nprobe=min(nprobe, nlist))
    if kind == "ivf-hnsw":
        return plan
    pq_m = spec.pq_m or default_pq_m(dim, dim // 8)
    if dim % pq_m:
        raise BudgetError(f"--pq-m {pq_m} must divide the embedding dimension {dim}")
    refine = 4 if spec.refine is None else spec.refine
    return replace(plan, pq_m=pq_m, pq_bits=spec.pq_bits, opq=spec.opq, refine=refine)


def _gb(plan: FaissPlan) -> str:
    return f"{plan.index_bytes() / GB:.3g} GB"


def _too_large(plan: FaissPlan, budget: float, how: str) -> str:
    return (
        f"a {plan.kind} index of {plan.n:,} x {plan.dim} vectors needs {_gb(plan)}{how}, "
        f"more than --memory-budget {budget:g} GB"
    )


# ---- making, training and filling -----------------------------------------------------------


def new_index(plan: FaissPlan) -> Any:
    import faiss

    metric = faiss.METRIC_INNER_PRODUCT
    if plan.kind == "flat":
        return faiss.IndexFlatIP(plan.dim)
    if plan.kind == "hnsw":
        graph = faiss.IndexHNSWFlat(plan.dim, plan.hnsw_m, metric)
        graph.hnsw.efConstruction = plan.ef_construction
        return graph
    quantiser = faiss.IndexHNSWFlat(plan.dim, plan.hnsw_m, metric)
    index: Any  # faiss's index classes share no typed base with these attributes
    if plan.kind == "ivf-hnsw":
        index = faiss.IndexIVFFlat(quantiser, plan.dim, plan.nlist, metric)
    else:
        index = faiss.IndexIVFPQ(quantiser, plan.dim, plan.nlist, plan.pq_m, plan.pq_bits, metric)
    if plan.opq:
        rotation: Any = faiss.OPQMatrix(plan.dim, plan.pq_m)
        # the rotation is learnt for the codebooks it serves: faiss's OPQ trains with 8-bit
        # codebooks unless handed a quantiser, a worse fit (and 16x the k-means) at 4 bits
        trainer = faiss.ProductQuantizer(plan.dim, plan.pq_m, plan.pq_bits)
        rotation.pq = trainer
        rotation.referenced_objects = [trainer]  # faiss holds it by a raw pointer
        index = faiss.IndexPreTransform(rotation, index)  # keeps rotation and index alive
    return index


def apply_search_params(index: Any, params: dict[str, Any]) -> None:
    """nprobe / efSearch from a manifest's faiss section onto a loaded index."""
    import faiss

    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    if "efSearch" in params:
        graph: Any = faiss.downcast_index(index)
        graph.hnsw.efSearch = params["efSearch"]


def training_rows(n: int, size: int, seed: int = 0) -> np.ndarray:
    """A uniform sample of rows, in row order (reads from a memory map stay sequential)."""
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def train_size(plan: FaissPlan, spec_size: int | None) -> int:
    if spec_size:
        return spec_size
    need = 64 * plan.nlist  # k-means on the coarse centroids: faiss warns below 39 per centroid
    if plan.kind == "ivf-pq":
        need = max(need, 64 * 2**plan.pq_bits)
    return min(plan.n, max(need, 100_000))


def as_float32(block: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(block, dtype=np.float32)


def add_rows(
    index: Any, vectors: np.ndarray, start: int, stop: int, *, ivf: bool, tick=None
) -> None:
    """Add vectors[start:stop], ADD_BATCH rows at a time; IVF lists get the row numbers as ids
    (a shard's rows keep their place when the lists are merged)."""
    for a in range(start, stop, ADD_BATCH):
        b = min(stop, a + ADD_BATCH)
        block = as_float32(vectors[a:b])
        if ivf:
            index.add_with_ids(block, np.arange(a, b, dtype=np.int64))
        else:
            index.add(block)
        if tick is not None:
            tick(b - a)


def build_in_memory(vectors: np.ndarray, plan: FaissPlan, train_sample: int | None = None) -> Any:
    """The whole index from an array in memory (small corpora, tests, benchmarks)."""
    index = new_index(plan)
    if plan.ivf:
        index.train(as_float32(vectors[training_rows(plan.n, train_size(plan, train_sample))]))
    add_rows(index, vectors, 0, plan.n, ivf=plan.ivf)
    apply_search_params(index, plan.describe())
    return index


# ---- the streamed, sharded, resumable build --------------------------------------------------


class Progress:
    """One stderr line per stage every ``every`` seconds: done/total, rate, ETA."""

    def __init__(self, stage: str, total: int, done: int = 0, every: float = 10.0):
        self.stage, self.total, self.done, self.every = stage, total, done, every
        self.started = self.last = time.monotonic()
        self.base = done

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            rate = (self.done - self.base) / max(now - self.started, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            print(
                f"[index] {self.stage}: {self.done:,}/{self.total:,} "
                f"({100 * self.done / max(self.total, 1):.1f}%), {rate:,.0f}/s, "
                f"ETA {_duration(eta)}",
                file=sys.stderr,
                flush=True,
            )


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def shard_ranges(n: int, shards: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, n, shards + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def write_index(index: Any, path: Path) -> None:
    import faiss

    with files.atomic_file(path, "wb", within=path.parent) as handle:  # streamed, never whole
        writer = faiss.PyCallbackIOWriter(handle.write)  # type: ignore[attr-defined]
        faiss.write_index(index, writer)


def fill_shard(trained: str, vectors_path: str, start: int, stop: int, target: str) -> str:
    """Add rows [start, stop) to a copy of the trained (empty) index; write it to ``target``.
    A Ray task or a plain call: everything it needs is a path."""
    import faiss

    index = faiss.read_index(trained)
    add_rows(index, np.load(vectors_path, mmap_mode="r"), start, stop, ivf=True)
    write_index(index, Path(target))
    return target


def build_faiss_file(
    folder: Path,
    plan: FaissPlan,
    *,
    shards: int,
    ray: bool = False,
    train_sample: int | None = None,
) -> dict[str, Any]:
    """folder/embeddings.npy -> folder/faiss.index. Work in progress lives in folder/parts and is
    reused by a rerun. Returns the manifest's faiss section."""
    import faiss

    vectors_path = folder / "embeddings.npy"
    vectors = np.load(vectors_path, mmap_mode="r")
    parts = folder / "parts"
    parts.mkdir(exist_ok=True)
    started = time.monotonic()
    timing: dict[str, Any] = {}
    if not plan.ivf:  # one graph or one array: filled in streamed batches, not sharded
        index = new_index(plan)
        add_rows(index, vectors, 0, plan.n, ivf=False, tick=Progress(f"faiss {plan.kind}", plan.n))
    else:
        trained = parts / "trained.index"
        if not trained.exists():
            index = new_index(plan)
            rows = training_rows(plan.n, train_size(plan, train_sample))
            print(
                f"[index] training {plan.kind} on {len(rows):,} of {plan.n:,} vectors",
                file=sys.stderr,
                flush=True,
            )
            index.train(as_float32(vectors[rows]))
            write_index(index, trained)
            timing = {
                "train_rows": len(rows),
                "train_seconds": round(time.monotonic() - started, 3),
            }
        targets = [parts / f"faiss-{i:05d}.index" for i in range(len(shard_ranges(plan.n, shards)))]
        todo = [
            (str(trained), str(vectors_path), a, b, str(t))
            for (a, b), t in zip(shard_ranges(plan.n, shards), targets, strict=True)
            if not t.exists()
        ]
        if len(todo) < len(targets):
            print(
                f"[index] resuming: {len(targets) - len(todo)} of {len(targets)} FAISS shards "
                "already built",
                file=sys.stderr,
                flush=True,
            )
        progress = Progress("faiss shards", len(targets), len(targets) - len(todo), every=0)
        if ray and todo:
            import ray as ray_

            task = ray_.remote(fill_shard)
            pending = [task.remote(*args) for args in todo]
            while pending:
                done, pending = ray_.wait(pending)
                progress(len(done))
            ray_.get(done)
        else:
            for args in todo:
                fill_shard(*args)
                progress(1)
        index = faiss.read_index(str(trained))
        ivf = faiss.extract_index_ivf(index)
        for target in targets:  # shard order = row order: the lists equal a one-pass add
            shard = faiss.read_index(str(target))  # held: the IVF view below points into it
            ivf.merge_from(faiss.extract_index_ivf(shard), 0)
        index.ntotal = ivf.ntotal  # an OPQ wrapper counts what its inner index holds
    apply_search_params(index, plan.describe())
    write_index(index, folder / "faiss.index")
    params = plan.describe() | {"shards": shards if plan.ivf else 1, "ray": ray and plan.ivf}
    params |= timing | {"build_seconds": round(time.monotonic() - started, 3)}
    return params
