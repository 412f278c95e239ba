"""Index building and search on a real small corpus: TREC Web subtopics, WikiContradict texts."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from groundcover.index_build.build import BuildError, IndexSpec, build_faiss, build_index
from groundcover.index_build.chunking import ChunkSpec, char_spans, word_spans
from groundcover.index_build.corpus import CorpusError, Document, read_corpus
from groundcover.retrieval.index import (
    CrossEncoderReranker,
    Hit,
    IndexError_,
    SearchIndex,
    mmr_select,
    rrf,
)
from tests.conftest import SHARED

TOPICS = SHARED / "data" / "trec-web" / "topics.jsonl"
WC = SHARED / "data" / "wikicontradict" / "humaneval-dev.jsonl"
pytestmark = pytest.mark.skipif(
    not (TOPICS.is_file() and WC.is_file()), reason=f"shared data not found under {SHARED}"
)


def queries() -> list[str]:
    return [json.loads(line)["query"] for line in TOPICS.read_text().splitlines()]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    rows = []
    for line in TOPICS.read_text().splitlines():
        topic = json.loads(line)
        rows.append(
            {"id": f"t{topic['topic_id']}", "title": topic["query"], "text": topic["description"]}
        )
        for sub in topic["subtopics"]:
            rows.append(
                {"id": f"t{topic['topic_id']}.{sub['subtopic_id']}", "contents": sub["description"]}
            )
    for n, line in enumerate(WC.read_text().splitlines()):
        row = json.loads(line)
        rows.append({"id": f"wc{n}", "contents": row["context1_self_contained"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def index_dir(corpus_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("indexes") / "flat"
    build_index(corpus_file, out, IndexSpec(chunk_size=64, chunk_overlap=16))
    return out


@pytest.fixture(scope="session")
def searcher(index_dir):
    return SearchIndex.load(index_dir)


# ---- corpora and chunking --------------------------------------------------------------------


def test_corpus_formats(tmp_path):
    (tmp_path / "a.tsv").write_text("d1\tfirst text\nd2\tTitle\tsecond text\n")
    (tmp_path / "b.trec").write_text(
        "<DOC>\n<DOCNO> X-1 </DOCNO>\n<TITLE>T</TITLE>\n<TEXT>\nHello <b>world</b>\n</TEXT>\n"
        "</DOC>\n"
        "<DOC><DOCNO>X-2</DOCNO><TEXT>two</TEXT></DOC>"
    )
    assert list(read_corpus(tmp_path / "a.tsv")) == [
        Document("d1", "first text"),
        Document("d2", "second text", "Title"),
    ]
    assert list(read_corpus(tmp_path / "b.trec")) == [
        Document("X-1", "Hello world", "T"),
        Document("X-2", "two"),
    ]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("x.jsonl", '{"id": 1}\n', "x.jsonl:1: record .1.: field contents: missing"),
        ("x.jsonl", "{oops\n", "x.jsonl:1: not valid JSON"),
        ("x.tsv", "a\tb\tc\td\n", "x.tsv:1: expected 2 or 3"),
        ("x.trec", "<DOC><TEXT>no docno</TEXT></DOC>", "without <DOCNO>"),
        ("x.parquet", "", "unknown corpus format"),
    ],
)
def test_corpus_errors(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(CorpusError, match=message):
        list(read_corpus(tmp_path / name))


def test_word_chunks_overlap_and_trace_back():
    text = " ".join(f"w{i}" for i in range(300))
    spans = word_spans(text, 128, 32)
    pieces = [text[s:e].split() for s, e in spans]
    assert [len(p) for p in pieces] == [128, 128, 108]
    assert pieces[0][-32:] == pieces[1][:32]  # 32-word overlap
    assert pieces[-1][-1] == "w299"


def test_icat_windows_every_96_words_keep_the_trailing_ones():
    text = " ".join(f"w{i}" for i in range(200))
    word = text.split()
    # windows start at words 0, 96, 192: the third (8 words) is kept only with trailing
    assert [text[a:b].split() for a, b in word_spans(text, 128, 32, trailing=True)] == [
        word[0:128],
        word[96:200],
        word[192:200],
    ]
    assert len(word_spans(text, 128, 32)) == 2
    assert ChunkSpec("words", 128, 32, trailing=True).describe()["trailing"] is True
    assert "trailing" not in ChunkSpec("words", 128, 32).describe()  # older manifests still match


def test_char_chunks_prefer_paragraphs_then_sentences():
    text = ("A short sentence here. " * 10).strip() + "\n\n" + "Second paragraph. " * 80
    spans = char_spans(text, 300)
    assert all(e - s <= 300 for s, e in spans)
    assert text[spans[0][0] : spans[0][1]].endswith("here.")  # cut at the paragraph break
    assert all(text[s:e].endswith(".") for s, e in spans[:-1])  # later: sentence ends
    assert "".join(text[s:e] for s, e in spans).replace(" ", "") == text.replace(" ", "").replace(
        "\n", ""
    )


def test_chunk_ids_point_into_documents(index_dir, corpus_file):
    docs = {d.id: d.text for d in read_corpus(corpus_file)}
    for line in (index_dir / "chunks.jsonl").read_text().splitlines()[:200]:
        chunk = json.loads(line)
        assert chunk["id"] == f"{chunk['doc_id']}@{chunk['start']}"
        assert docs[chunk["doc_id"]][chunk["start"] : chunk["end"]] == chunk["text"]


# ---- parity with the reference implementations -----------------------------------------------


def test_bm25_equals_bm25s_queried_directly(searcher, index_dir):
    import bm25s
    import Stemmer

    texts = []
    for line in (index_dir / "chunks.jsonl").read_text().splitlines():
        c = json.loads(line)
        texts.append(f"{c['title']}\n{c['text']}" if c["title"] else c["text"])
    stemmer = Stemmer.Stemmer("english")
    reference = bm25s.BM25(k1=1.5, b=0.75)
    reference.index(
        bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    qs = queries()
    ref_rows, ref_scores = reference.retrieve(
        bm25s.tokenize(qs, stopwords="en", stemmer=stemmer, show_progress=False),
        k=10,
        show_progress=False,
    )
    rows, scores = searcher.bm25_search(qs, 10)
    assert np.allclose(scores, ref_scores, atol=1e-5)
    # Same documents wherever the score is not (nearly) tied; the last rank may tie with rank 11.
    checked = 0
    for q in range(len(qs)):
        for i in range(9):
            gaps = np.abs(ref_scores[q] - ref_scores[q, i])
            if np.sum(gaps < 1e-4) == 1:
                assert rows[q, i] == ref_rows[q, i]
                checked += 1
    assert checked > 500


def test_dense_flat_equals_brute_force_cosine(searcher):
    qs = queries()[:50]
    vectors = np.asarray(searcher.embeddings)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    q = searcher.encode(qs)
    brute = q @ vectors.T
    expected = np.argsort(-brute, axis=1, kind="stable")[:, :10]
    rows, scores = searcher.dense_search(qs, 10)
    assert np.allclose(scores, np.take_along_axis(brute, expected, axis=1), atol=1e-5)
    assert (rows[:, 0] == expected[:, 0]).mean() == 1.0


def recall_at_10(approx_rows, exact_rows) -> float:
    return float(
        np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx_rows, exact_rows, strict=True)])
    )


def test_hnsw_and_ivf_recall_against_flat(searcher):
    vectors = np.ascontiguousarray(np.asarray(searcher.embeddings))
    q = searcher.encode(queries())
    flat, _ = build_faiss(vectors, IndexSpec(faiss="flat"))
    exact_scores, exact = flat.search(q, 10)
    hnsw, _ = build_faiss(vectors, IndexSpec(faiss="hnsw"))
    _, approx = hnsw.search(q, 10)
    assert recall_at_10(approx, exact) >= 0.95  # stated bound for HNSW32, efSearch 128
    ivf, params = build_faiss(vectors, IndexSpec(faiss="ivf-hnsw", ivf_nlist=16, ivf_nprobe=16))
    full_scores, _ = ivf.search(q, 10)
    assert np.allclose(
        full_scores, exact_scores, atol=1e-5
    )  # every list probed: exact (ties aside)
    ivf.nprobe = 4
    _, partial = ivf.search(q, 10)
    assert 0.6 <= recall_at_10(partial, exact) <= 1.0  # stated bound for nprobe 4 of 16
    assert params["quantizer"] == "HNSW32" and params["nlist"] == 16


# ---- fusion, diversity, reranking ------------------------------------------------------------


def test_rrf_by_hand():
    bm25 = (np.array([[3, 1, 2]]), np.array([[9.0, 5.0, 1.0]]))
    dense = (np.array([[1, 4, 3]]), np.array([[0.9, 0.8, 0.1]]))
    rows, scores = rrf([bm25, dense], 60, 4)
    # 1: 1/62 + 1/61; 3: 1/61 + 1/63; 4: 1/62; 2: 1/63
    assert rows[0].tolist() == [1, 3, 4, 2]
    assert scores[0, 0] == pytest.approx(1 / 62 + 1 / 61)


def test_mmr_skips_near_duplicates():
    q = np.array([1.0, 0.0])
    vectors = np.array([[0.99, 0.14], [0.99, 0.141], [0.6, 0.8]])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # relevance: 10 (0.990) > 11 (0.990-) > 12 (0.6); 11 is a near copy of 10 (cos ~1).
    rows, _ = mmr_select(q, vectors, np.array([10, 11, 12]), np.zeros(3), k=2, lam=0.3)
    assert rows.tolist() == [10, 12]  # 0.3*0.6 - 0.7*0.71 beats 0.3*0.99 - 0.7*1.0
    rows, _ = mmr_select(q, vectors, np.array([10, 11, 12]), np.zeros(3), k=2, lam=1.0)
    assert rows.tolist() == [10, 11]  # lambda 1: pure relevance


def test_hybrid_and_mmr_search(searcher):
    query = ["obama family tree"]
    hybrid = searcher.search(query, k=5, mode="hybrid")[0]
    assert len(hybrid) == 5 and hybrid[0].doc_id.startswith("t1")
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    diverse = searcher.search(query, k=5, mode="hybrid", mmr=0.3, depth=20)[0]
    pool = searcher.search(query, k=20, mode="hybrid", depth=20)[0]
    assert {h.row for h in diverse} <= {h.row for h in pool}  # MMR re-ranks the same pool

    def redundancy(hits):
        v = np.asarray(searcher.embeddings[[h.row for h in hits]])
        sims = v @ v.T
        return (sims.sum() - np.trace(sims)) / (len(hits) * (len(hits) - 1))

    assert redundancy(diverse) < redundancy(pool[:5])


def test_cross_encoder_reranker(tmp_path, searcher):
    from tests.support.tiny import build_tiny_classifier

    model = build_tiny_classifier(tmp_path / "ce", "bert", labels=("relevance",))
    reranker = CrossEncoderReranker(str(model))
    hits = searcher.search(["obama family tree"], k=8, mode="bm25")[0]
    reranked = reranker.rerank("obama family tree", hits)
    assert {h.row for h in reranked} == {h.row for h in hits}
    assert [h.score for h in reranked] == sorted((h.score for h in reranked), reverse=True)
    direct = reranker.model.predict([("obama family tree", h.text) for h in hits])
    assert max(direct) == pytest.approx(reranked[0].score, abs=1e-5)
    assert isinstance(reranked[0], Hit)


# ---- manifests and damaged indexes -----------------------------------------------------------


def test_manifest_records_the_build(index_dir, corpus_file):
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["chunking"] == {"by": "words", "size": 64, "overlap": 16}
    assert manifest["dense"]["dim"] == 384
    assert manifest["counts"]["chunks"] == len(
        (index_dir / "chunks.jsonl").read_text().splitlines()
    )
    assert manifest["faiss"]["kind"] == "flat"
    assert {"bm25s", "faiss-cpu"} <= set(manifest["versions"])


def test_damaged_indexes_are_refused(index_dir, tmp_path):
    broken = tmp_path / "copy"
    shutil.copytree(index_dir, broken)
    with pytest.raises(IndexError_, match="built with dense_model='default', expected 'other'"):
        SearchIndex.load(broken, expect={"dense_model": "other"})
    with pytest.raises(IndexError_, match="chunking"):
        SearchIndex.load(broken, expect={"chunking": {"by": "chars", "size": 1024, "overlap": 0}})
    with open(broken / "faiss.index", "ab") as handle:
        handle.write(b"junk")
    with pytest.raises(IndexError_, match="faiss.index: size"):
        SearchIndex.load(broken)
    (broken / "faiss.index").unlink()
    with pytest.raises(IndexError_, match="missing index file faiss.index"):
        SearchIndex.load(broken)
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(IndexError_, match="corrupt manifest"):
        SearchIndex.load(broken)
    with pytest.raises(IndexError_, match="no manifest.json"):
        SearchIndex.load(tmp_path)


def test_failed_build_leaves_nothing(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "contents": "x y"}\n{"id": "a", "contents": "dup"}\n')
    with pytest.raises(BuildError, match="c.jsonl:2: record .a.: duplicate id"):
        build_index(corpus, tmp_path / "idx", IndexSpec(dense_model=None))
    assert not (tmp_path / "idx").exists() and not (tmp_path / "idx.partial").exists()


def test_sharded_ray_build_equals_single_process(corpus_file, index_dir, tmp_path):
    import ray

    spec = IndexSpec(
        chunk_size=64,
        chunk_overlap=16,
        shards=3,
        ray=True,
        faiss="ivf-hnsw",
        ivf_nlist=8,
        ivf_nprobe=8,
    )
    sharded = tmp_path / "sharded"
    try:
        manifest = build_index(corpus_file, sharded, spec)  # starts a local Ray in this process
    finally:  # whose idle daemons and encoder-holding workers would outlive the test
        ray.shutdown()
    assert manifest["dense"]["shards"] == 3 and manifest["dense"]["ray"] is True
    assert (manifest["faiss"]["shards"], manifest["faiss"]["ray"]) == (3, True)  # IVF lists too
    assert (sharded / "chunks.jsonl").read_bytes() == (index_dir / "chunks.jsonl").read_bytes()
    a, b = np.load(index_dir / "embeddings.npy"), np.load(sharded / "embeddings.npy")
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-5)
    qs = queries()[:20]
    one, other = SearchIndex.load(index_dir), SearchIndex.load(sharded)
    assert np.array_equal(one.bm25_search(qs, 10)[0], other.bm25_search(qs, 10)[0])
    # every list probed: the merged IVF lists answer as Flat does
    assert np.array_equal(one.dense_search(qs, 5)[0], other.dense_search(qs, 5)[0])


def test_cli_build_and_search(corpus_file, tmp_path):
    from groundcover.pipelines.cli import app

    runner = CliRunner()
    out = tmp_path / "idx"
    args = ["index", "build", str(corpus_file), str(out), "--chunk-by", "chars"]
    built = runner.invoke(app, [*args, "--chunk-size", "1024", "--dense-model", "none"])
    assert built.exit_code == 0, built.output
    found = runner.invoke(
        app,
        ["index", "search", str(out), "obama family tree", "--mode", "bm25", "--k", "3", "--json"],
    )
    assert found.exit_code == 0, found.output
    lines = [json.loads(line) for line in found.output.splitlines()]
    assert len(lines) == 3 and lines[0]["doc_id"].startswith("t1")
    again = runner.invoke(app, ["index", "build", str(corpus_file), str(out)])
    assert again.exit_code == 2 and "exists" in again.output
    dense = runner.invoke(app, ["index", "search", str(out), "x", "--mode", "dense"])
    assert dense.exit_code == 2 and "without dense embeddings" in dense.output


def test_faiss_auto_is_flat_below_50000_chunks_and_ivf_hnsw_above():
    from groundcover.index_build.build import IndexSpec, build_faiss

    rng = np.random.default_rng(0)
    small = rng.standard_normal((100, 8)).astype(np.float32)
    assert build_faiss(small, IndexSpec(faiss="auto"))[1]["kind"] == "flat"
    large = rng.standard_normal((50_000, 8)).astype(np.float32)
    _, params = build_faiss(large, IndexSpec(faiss="auto"))
    assert (params["kind"], params["quantizer"], params["nprobe"]) == ("ivf-hnsw", "HNSW32", 256)


def test_the_encoder_batch_is_small_on_the_cpu_unless_given():
    """16 on the CPU (scripts/benchmarks/bench_encode_batch.py), 64 on an accelerator, the
    spec's own where it gives one; None stays the spec's value, so a resumed build's plan is
    the same whatever the default becomes."""
    assert IndexSpec().encode_batch == 16 and IndexSpec().batch_size is None
    assert IndexSpec(device="cuda").encode_batch == 64
    assert IndexSpec(batch_size=5, device="cuda").encode_batch == 5
    with pytest.raises(ValueError):
        IndexSpec(batch_size=0)
