"""Tune an approximate index's search settings to a recall target against exact search.

    groundcover index tune DIR --queries held-out.txt --recall 0.95

Queries are encoded with the index's own model; the exact top-k comes from a blocked brute-force
pass over the stored vectors. The search space is the kind's knob -- efSearch (HNSW), nprobe
(IVF) and, for IVF-PQ, the refine depth -- walked from cheap to dear; the fastest setting that
reaches the target is written into the manifest's faiss section (SearchIndex uses it by default)
with the measured recall and speed under ``tuning``.
"""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ..index_build.ann import apply_search_params
from ..serving.files import write_atomic
from .index import SearchIndex

EF_GRID = (16, 32, 64, 128, 256, 512, 1024, 2048)
REFINE_GRID = (1, 2, 4, 8, 16, 32, 64)


class TuneError(ValueError):
    pass


def read_queries(path: Path, sample: int, seed: int = 0) -> list[str]:
    """Plain text (one query per line) or JSONL with ``query``, ``text`` or ``contents``."""
    queries = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            if path.suffix in (".jsonl", ".json"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TuneError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
                text = next((row[f] for f in ("query", "text", "contents") if f in row), None)
                if not isinstance(text, str) or not text.strip():
                    raise TuneError(f"{path}:{lineno}: field query: missing or empty")
                line = text
            queries.append(line)
    if not queries:
        raise TuneError(f"{path}: no queries")
    if len(queries) > sample:
        queries = random.Random(seed).sample(queries, sample)
    return queries


def exact_top_k(stored: np.ndarray, queries: np.ndarray, k: int, block: int = 65_536):
    """Row ids of the exact top-k by inner product, streaming the stored vectors in blocks."""
    best_rows = np.zeros((len(queries), 0), dtype=np.int64)
    best_scores = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(stored), block):
        scores = queries @ np.asarray(stored[start : start + block], dtype=np.float32).T
        rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
        scores = np.concatenate([best_scores, scores], axis=1)
        rows = np.concatenate([best_rows, rows], axis=1)
        keep = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_rows = np.take_along_axis(rows, keep, axis=1)
    return best_rows


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(f[:k]) & set(e)) / k for f, e in zip(found, exact, strict=True)]))


def settings_grid(params: dict[str, Any]) -> list[list[dict[str, int]]]:
    """Runs of settings, each from cheap to dear (a run stops at its first hit)."""
    kind = params["kind"]
    if kind == "hnsw":
        return [[{"efSearch": ef} for ef in EF_GRID]]
    if kind in ("ivf-hnsw", "ivf-pq"):
        nlist = params["nlist"]
        probes = sorted({min(2**i, nlist) for i in range(nlist.bit_length() + 1)})
        if kind == "ivf-hnsw":
            return [[{"nprobe": p} for p in probes]]
        return [[{"nprobe": p, "refine": r} for p in probes] for r in REFINE_GRID]
    return []


def tune(
    path: Path | str, queries: list[str], target: float = 0.95, k: int = 10, repeat: int = 3
) -> dict[str, Any]:
    index = SearchIndex.load(path)
    if index.faiss is None:
        raise TuneError(f"{path}: built without dense embeddings: nothing to tune")
    params = index.manifest["faiss"]
    vectors = index.encode(queries)
    started = time.perf_counter()
    exact = exact_top_k(index.embeddings, vectors, k)
    exact_qps = len(queries) / (time.perf_counter() - started)
    tried = []
    for run in settings_grid(params):
        for setting in run:
            apply_search_params(index.faiss, params | setting)
            found, _ = index.vector_search(vectors, k, setting.get("refine"))
            seconds = min(_timed(index, vectors, k, setting) for _ in range(repeat))
            tried.append(setting | {"recall": recall(found, exact), "qps": len(queries) / seconds})
            if tried[-1]["recall"] >= target:
                break
    hits = [t for t in tried if t["recall"] >= target]
    if params["kind"] != "flat" and not hits:
        best = max(tried, key=lambda t: t["recall"])
        raise TuneError(
            f"{path}: recall@{k} {best['recall']:.3f} at best ({_knobs(best)}), below the "
            f"target {target}; rebuild with more lists, a larger --pq-m or a deeper --refine"
        )
    chosen = max(hits, key=lambda t: t["qps"]) if hits else {"recall": 1.0, "qps": exact_qps}
    knobs = {key: chosen[key] for key in ("efSearch", "nprobe", "refine") if key in chosen}
    record = {
        "target_recall": target,
        "k": k,
        "queries": len(queries),
        "chosen": knobs,
        "recall": round(chosen["recall"], 4),
        "qps": round(chosen["qps"], 1),
        "exact_qps": round(exact_qps, 1),
        "speedup_vs_exact": round(chosen["qps"] / exact_qps, 2),
        "built": {key: params[key] for key in knobs if key in params},
        "tried": [{**t, "recall": round(t["recall"], 4), "qps": round(t["qps"], 1)} for t in tried],
        "tuned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    manifest = index.manifest | {"faiss": params | knobs, "tuning": record}
    index.close()
    write_manifest(Path(path), manifest)
    return record


def _timed(index: SearchIndex, vectors: np.ndarray, k: int, setting: dict[str, int]) -> float:
    started = time.perf_counter()
    index.vector_search(vectors, k, setting.get("refine"))
    return time.perf_counter() - started


def _knobs(setting: dict[str, Any]) -> str:
    return ", ".join(
        f"{key} {setting[key]}" for key in ("efSearch", "nprobe", "refine") if key in setting
    )


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    write_atomic(path / "manifest.json", json.dumps(manifest, indent=2), within=path)
