"""Compressed and approximate FAISS indexes on real text and real embeddings: the Python standard
library's docstrings (on every machine that runs the tests) embedded by the shipped MiniLM, with
held-out docstrings as queries. Recall is measured against exact search, as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from groundcover.index_build.ann import BudgetError, FaissPlan, build_faiss_file, plan_faiss
from groundcover.index_build.build import IndexSpec, build_index, derive_index
from groundcover.retrieval.index import SearchIndex
from groundcover.retrieval.tune import TuneError, exact_top_k, recall, tune

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from offline_corpus import docstrings  # noqa: E402

# short windows: as many chunks as a real corpus of this size gives, at half the words to embed
SPEC = {"chunk_size": 32, "chunk_overlap": 8}


@pytest.fixture(scope="session")
def prose(tmp_path_factory) -> tuple[Path, list[str]]:
    """700 docstring documents to index (~2,000 chunks), then 200 held-out ones whose first
    sentence is a query (not text of the index)."""
    folder = tmp_path_factory.mktemp("prose")
    rows, held_out = [], []
    for doc_id, title, text in docstrings(Path(sysconfig.get_paths()["stdlib"])):
        text = " ".join(text.split())
        if len(text.split()) < 20:
            continue
        if len(rows) < 700:
            rows.append({"id": doc_id, "title": title, "text": text})
        elif len(held_out) < 200:
            held_out.append(text.split(". ")[0][:300])
        else:
            break
    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "queries.txt").write_text("\n".join(held_out) + "\n")
    return corpus, held_out


@pytest.fixture(scope="session")
def flat_dir(prose, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ann") / "flat"
    build_index(prose[0], out, IndexSpec(**SPEC, bm25=False))
    return out


@pytest.fixture(scope="session")
def exact(flat_dir, prose):
    index = SearchIndex.load(flat_dir)
    vectors = index.encode(prose[1])
    return vectors, exact_top_k(index.embeddings, vectors, 10)


def derived(flat_dir: Path, tmp_path: Path, **spec) -> SearchIndex:
    out = tmp_path / spec["faiss"]
    derive_index(flat_dir, out, IndexSpec(**SPEC, **spec))
    return SearchIndex.load(out)


def test_corpus_is_a_few_thousand_real_chunks(flat_dir, exact):
    manifest = json.loads((flat_dir / "manifest.json").read_text())
    assert manifest["counts"]["chunks"] >= 1500 and manifest["dense"]["dim"] == 384
    index = SearchIndex.load(flat_dir)
    found, _ = index.vector_search(exact[0], 10)
    assert recall(found, exact[1]) >= 0.999  # Flat is the exact search (float ties aside)


@pytest.mark.parametrize(
    ("spec", "floor"),
    [
        ({"faiss": "hnsw"}, 0.95),  # efSearch 128
        ({"faiss": "ivf-hnsw", "ivf_nlist": 32, "ivf_nprobe": 8}, 0.8),
        ({"faiss": "ivf-pq", "ivf_nlist": 32, "ivf_nprobe": 32, "refine": 8}, 0.95),
        # OPQ's rotation trains a PQ per iteration: 4-bit codes keep that cheap here
        (
            {
                "faiss": "ivf-pq",
                "ivf_nlist": 32,
                "ivf_nprobe": 32,
                "opq": True,
                "pq_bits": 4,
                "refine": 16,
            },
            0.95,
        ),
    ],
    ids=["hnsw", "ivf-hnsw", "ivf-pq+refine", "opq+refine"],
)
def test_each_kind_reaches_its_recall_floor(flat_dir, exact, tmp_path, spec, floor):
    index = derived(flat_dir, tmp_path, **spec)
    vectors, truth = exact
    rows, scores = index.vector_search(vectors, 10)
    assert recall(rows, truth) >= floor
    # every score is the true cosine of the row it names (a wrong metric or unnormalised
    # vectors fail here even where the ranking survives)
    stored = np.asarray(index.embeddings, dtype=np.float32)
    true = np.einsum("qd,qkd->qk", vectors, stored[rows])
    assert np.allclose(scores, true, atol=1e-5)
    plan = plan_faiss(IndexSpec(**spec), index.n, 384)
    size = (index.path / "faiss.index").stat().st_size
    assert abs(plan.index_bytes() - size) / size < 0.1  # the budget's estimate is the real size


def test_pq_codes_alone_are_approximate_and_refine_recovers(flat_dir, exact, tmp_path):
    index = derived(flat_dir, tmp_path, faiss="ivf-pq", ivf_nlist=32, ivf_nprobe=32, refine=0)
    vectors, truth = exact
    coarse = recall(index.vector_search(vectors, 10)[0], truth)
    refined = recall(index.vector_search(vectors, 10, refine=8)[0], truth)
    assert coarse < refined and refined >= 0.95
    assert index.manifest["faiss"]["pq_m"] == 48  # dim / 8: 48-byte codes
    size = (index.path / "faiss.index").stat().st_size
    flat = (flat_dir / "faiss.index").stat().st_size
    fixed = plan_faiss(IndexSpec(faiss="ivf-pq", ivf_nlist=32), 0, 384).index_bytes()
    assert (size - fixed) / index.n < flat / index.n / 8  # per vector: 48 + 8 bytes, not 1,536


def test_float16_vectors_halve_the_copy_and_keep_the_ranking(flat_dir, exact, tmp_path):
    index = derived(
        flat_dir, tmp_path, faiss="ivf-pq", vectors="float16", ivf_nlist=32, ivf_nprobe=32, refine=8
    )
    assert index.embeddings.dtype == np.float16
    assert (
        index.path.joinpath("embeddings.npy").stat().st_size
        < 0.51 * (flat_dir / "embeddings.npy").stat().st_size
    )
    assert recall(index.vector_search(exact[0], 10)[0], exact[1]) >= 0.95
    hits = index.search(["parse an email message header"], k=5, mode="dense", mmr=0.5)
    assert len(hits[0]) == 5


def test_tune_writes_the_cheapest_setting_that_reaches_the_target(flat_dir, exact, tmp_path, prose):
    index = derived(flat_dir, tmp_path, faiss="ivf-pq", ivf_nlist=64, ivf_nprobe=1, refine=1)
    vectors, truth = exact
    before = recall(index.vector_search(vectors, 10)[0], truth)
    assert before < 0.9  # one list of 64 and no refine: the target is out of reach
    record = tune(index.path, prose[1], target=0.95)
    manifest = json.loads((index.path / "manifest.json").read_text())
    assert manifest["tuning"] == record and record["recall"] >= 0.95
    assert manifest["faiss"]["nprobe"] == record["chosen"]["nprobe"] != 1
    assert manifest["faiss"]["refine"] == record["chosen"]["refine"]
    assert record["built"] == {"nprobe": 1, "refine": 1}
    for tried in record["tried"]:  # each run stops at its first hit: nothing dearer was tried
        smaller = [
            t
            for t in record["tried"]
            if t["refine"] == tried["refine"] and t["nprobe"] < tried["nprobe"]
        ]
        assert all(t["recall"] < 0.95 for t in smaller)
    reloaded = SearchIndex.load(index.path)  # the tuned settings are the defaults now
    assert faiss.extract_index_ivf(reloaded.faiss).nprobe == record["chosen"]["nprobe"]
    assert recall(reloaded.vector_search(vectors, 10)[0], truth) == pytest.approx(record["recall"])
    with pytest.raises(TuneError, match=r"recall@10 .* below the target 1.01"):
        tune(index.path, prose[1], target=1.01)


def test_tune_cli(flat_dir, tmp_path, prose):
    from groundcover.pipelines.cli import app

    index = derived(flat_dir, tmp_path, faiss="hnsw", ef_search=16)
    queries = prose[0].parent / "queries.txt"
    result = CliRunner().invoke(
        app, ["index", "tune", str(index.path), "--queries", str(queries), "--recall", "0.97"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((index.path / "manifest.json").read_text())
    assert "efSearch" in manifest["tuning"]["chosen"] and manifest["tuning"]["recall"] >= 0.97
    assert f"recall@10 {manifest['tuning']['recall']:.3f}" in result.output
    missing = CliRunner().invoke(app, ["index", "tune", str(index.path), "--queries", "nope.txt"])
    assert missing.exit_code == 2 and "nope.txt: no such file" in missing.output


def test_memory_budget_is_checked_before_embedding(prose, tmp_path):
    from groundcover.pipelines.cli import app

    out = tmp_path / "idx"
    result = CliRunner().invoke(
        app,
        [
            "index",
            "build",
            str(prose[0]),
            str(out),
            "--no-bm25",
            "--faiss",
            "hnsw",
            "--memory-budget",
            "0.0001",
        ],
    )
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if "error" in line]
    assert "a hnsw index of" in line and "more than --memory-budget 0.0001 GB" in line
    assert "[index] embedding" not in result.output  # refused before any embedding
    assert not out.exists() and not out.with_name("idx.partial").exists()


def test_auto_picks_by_size_and_budget():
    def kind(n: int, budget: float | None) -> FaissPlan:
        return plan_faiss(IndexSpec(faiss="auto", memory_budget=budget), n, 384)

    assert kind(10_000, None).kind == "flat"
    assert (kind(10_000_000, None).kind, kind(10_000_000, None).nprobe) == ("ivf-hnsw", 256)
    # 10M vectors: ivf-hnsw needs 15.5 GB; 96-byte codes + 8-byte ids = 1.04 GB fit 2 GB,
    # 0.5 GB needs 24-byte codes (48 + 8 bytes is 0.56 GB)
    assert kind(10_000_000, 16).kind == "ivf-hnsw"
    assert (kind(10_000_000, 2).kind, kind(10_000_000, 2).pq_m) == ("ivf-pq", 96)
    assert kind(10_000_000, 0.5).pq_m == 24
    with pytest.raises(BudgetError, match=r"even at its smallest, more than --memory-budget 0.1"):
        kind(10_000_000, 0.1)
    with pytest.raises(BudgetError, match="must divide the embedding dimension 384"):
        plan_faiss(IndexSpec(faiss="ivf-pq", pq_m=50), 100_000, 384)


def test_sharded_ivf_build_resumes_the_missing_shards(flat_dir, exact, tmp_path, capfd):
    work = tmp_path / "work"
    work.mkdir()
    os.link(flat_dir / "embeddings.npy", work / "embeddings.npy")
    n = len(np.load(work / "embeddings.npy", mmap_mode="r"))
    plan = plan_faiss(IndexSpec(faiss="ivf-pq", ivf_nlist=32, ivf_nprobe=32), n, 384)
    build_faiss_file(work, plan, shards=4)
    whole = faiss.read_index(str(work / "faiss.index"))
    for name in ("faiss.index", "parts/faiss-00001.index", "parts/faiss-00003.index"):
        (work / name).unlink()  # as if killed before these were written
    capfd.readouterr()
    build_faiss_file(work, plan, shards=4)
    assert "resuming: 2 of 4 FAISS shards already built" in capfd.readouterr().err
    again = faiss.read_index(str(work / "faiss.index"))
    lists, other = faiss.extract_index_ivf(whole).invlists, faiss.extract_index_ivf(again).invlists
    for i in range(32):  # the same codes under the same row ids, list by list
        size = lists.list_size(i)
        assert other.list_size(i) == size
        ids = faiss.rev_swig_ptr(lists.get_ids(i), size).copy()
        assert np.array_equal(ids, faiss.rev_swig_ptr(other.get_ids(i), size))
        assert np.all(np.diff(ids) > 0)  # shards merged in row order


def test_a_killed_build_resumes_to_the_same_index(prose, flat_dir, tmp_path):
    # the first 220 documents: enough chunks for six shards and 16 lists; their chunks are the
    # flat index's first rows, so its embeddings are the reference
    subset = tmp_path / "docs.jsonl"
    subset.write_text("".join(prose[0].read_text().splitlines(keepends=True)[:220]))
    out = tmp_path / "idx"
    code = (
        "import sys; from groundcover.index_build.build import IndexSpec, build_index; "
        f"build_index(sys.argv[1], sys.argv[2], IndexSpec(**{SPEC!r}, bm25=False, shards=6, "
        "faiss='ivf-hnsw', ivf_nlist=16, ivf_nprobe=16))"
    )
    parts = out.with_name("idx.partial") / "parts"
    proc = subprocess.Popen([sys.executable, "-c", code, str(subset), str(out)], cwd=ROOT)
    deadline = time.monotonic() + 300
    while not list(parts.glob("emb-*[0-9].npy")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the build ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(parts.glob("emb-*[0-9].npy")))
    assert 1 <= done < 6 and not out.exists()
    resumed = subprocess.run(
        [sys.executable, "-c", code, str(subset), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "resuming the build" in resumed.stderr
    assert f"resuming: {done} of 6 embedding shards already built" in resumed.stderr
    a, b = np.load(flat_dir / "embeddings.npy"), np.load(out / "embeddings.npy")
    assert len(b) >= 500 and np.allclose(a[: len(b)], b, atol=1e-5)
    assert not (out / "parts").exists() and not (out / "build.json").exists()
    index = SearchIndex.load(out)  # every list probed: exactly the Flat top-10
    vectors = SearchIndex.load(flat_dir).encode(prose[1][:20])
    expected = exact_top_k(b, vectors, 10)
    assert recall(index.vector_search(vectors, 10)[0], expected) >= 0.99
