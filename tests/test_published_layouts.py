"""Datasets in the exact layouts their authors publish (hand-written fixtures under
``tests/fixtures/published/``), served by the loopback Hub: ``data get`` -> converter -> the
framework's loader -> a dry run or a run that needs no model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.datasets import CATALOG, get
from groundcover.pipelines.datasets.fetch import read_lock
from groundcover.pipelines.runtime.contract.config import UserError
from tests.support.fake_hub import FakeHub

PUBLISHED = Path(__file__).parent / "fixtures" / "published"
NO_SERVER = ["--endpoint", "http://127.0.0.1:9/v1", "--model", "judge"]  # nothing listens


def publish(hub: FakeHub, name: str, folder: str, sha: str | None = None) -> str:
    """Every file under the fixture folder at its repository path, in one commit."""
    root = PUBLISHED / folder
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return hub.repo(CATALOG[name].repo).commit(files | {"README.md": b"card"}, sha=sha)


def fingerprinted_as_fixture(monkeypatch, name: str, rel: str, folder: str) -> None:
    """The catalogue entry with the fixture's own size and digest as the published ones."""
    data = (PUBLISHED / folder / rel).read_bytes()
    entry = dataclasses.replace(
        CATALOG[name], fingerprints={rel: (len(data), hashlib.sha256(data).hexdigest())}
    )
    monkeypatch.setitem(CATALOG, name, entry)


# ---- GaRAGe ------------------------------------------------------------------------------------


def test_garage_download_that_differs_from_the_published_digest_is_refused(home, hub):
    publish(hub, "garage", "garage")  # our hand-written rows: not the authors' bytes
    with pytest.raises(UserError) as caught:
        get("garage")
    line = str(caught.value)
    fixture = (PUBLISHED / "garage" / "data" / "GaRAGe_benchmark.jsonl").read_bytes()
    assert hashlib.sha256(fixture).hexdigest() in line  # both digests named
    assert "419e3941f6e8eb4082a74ca2140c1f9337f8b467ff76656a6b8b0290ca3f3a72" in line
    assert "28,426,483 bytes" in line and "nothing was cached" in line
    assert read_lock() == {} and not (home / "data" / "garage").exists()


def test_garage_published_rows_are_read_as_published(home, hub, monkeypatch):
    from groundcover.pipelines.garage.data import counts, load_records

    fingerprinted_as_fixture(monkeypatch, "garage", "data/GaRAGe_benchmark.jsonl", "garage")
    publish(hub, "garage", "garage")
    found = get("garage")
    records = load_records(found.path)
    by_id = {r.id: r for r in records}
    ferry = by_id["0c6e2b9a-5d41-4f7e-9a3c-2b8d1e4f6a70"]
    assert ferry.grounding[0].text.startswith("The river ferry")  # text from cite_1
    assert ferry.human_citations == {1, 2}  # evidence_cited YES/NO tags
    assert ferry.dimension("time_sensitivity") == "Fast-Changing"
    assert ferry.dimension("source") == "Web" and ferry.dimension("complexity") == "Simple"
    memo = by_id["7f3a9c12-88b0-4d2e-b6a1-c0ffee123456"]
    assert memo.expects_deflection and memo.evidence_relevant == [False, None]  # "" kept
    assert memo.dimension("source") == "Private" and memo.dimension("source_tag") == "devops"
    paper = by_id["b2d4f6a8-1c3e-4a5b-8d7f-9e0a1b2c3d4e"]
    assert paper.dimension("time_sensitivity") == "Static"  # question_type "" and not sensitive
    assert paper.relevant == [True, True, False, False] and paper.unannotated == 1
    assert paper.dimension("source") == "Private" and paper.evidence_correct[2] is None
    assert counts(records) == {
        "questions": 4,
        "passages": 11,
        "deflection_expected": 1,
        "unannotated_relevance_labels": 2,
        "time_sensitivity": {"Fast-Changing": 0.25, "Slow-Changing": 0.25, "Static": 0.5},
        "source": {"Private": 0.5, "Web": 0.5},
    }
    out = CliRunner().invoke(
        app, ["eval", "garage", "garage", *NO_SERVER, "--dry-run", "--run-dir", str(home / "run")]
    )
    assert out.exit_code == 0, out.output
    assert "4 questions, 11 passages, 1 expect a deflection, 2 relevance labels" in out.output
    assert "Fast-Changing 25.0%" in out.output and "Web 50.0%" in out.output


def test_garage_answers_cite_with_cite_n_markers():
    from groundcover.pipelines.garage.data import citations
    from groundcover.pipelines.garage.framework import sentences

    text = "Forty minutes [cite_1]; hourly before [cite_2, cite_3]. Also [4] and 【2】."
    assert citations(text, 4) == {1, 2, 3, 4}
    assert citations("Out of range [cite_9].", 3) == set()
    assert sentences("It opened in 1932 [cite_1]. It spans 503 m [cite_2].") == [
        "It opened in 1932.",
        "It spans 503 m.",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (  # cite_N keys must follow the passages' order: the answers cite them by N
            lambda r: r["grounding"].reverse(),
            "field grounding: Value error, passage 1: key cite_3 out of order (expected cite_1)",
        ),
        (lambda r: r["evidence_relevant"].__setitem__(0, "MAYBE"), "relevance label 'MAYBE'"),
        (lambda r: r["evidence_correct"].__setitem__(0, "WRONG"), "label 'WRONG' is not one of"),
        (lambda r: r["evidence_cited"].__setitem__(1, "SOMETIMES"), "citation tag 'SOMETIMES'"),
        (lambda r: r.__setitem__("question_type", "DAILY"), "field question_type: 'DAILY'"),
        (lambda r: r.__setitem__("question_tag", "intranet"), "field question_tag: 'intranet'"),
        (lambda r: r.__setitem__("question_popularity", "Viral"), "field question_popularity"),
    ],
)
def test_garage_bad_published_rows_are_one_line(tmp_path, change, message):
    from groundcover.pipelines.garage.data import load_records

    lines = (PUBLISHED / "garage" / "data" / "GaRAGe_benchmark.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    change(row)
    path = tmp_path / "GaRAGe_benchmark.jsonl"
    path.write_text(lines[1] + "\n" + json.dumps(row) + "\n")
    with pytest.raises(UserError) as caught:
        load_records(path)
    assert f"{path}:2: record '{row['sample_id']}': " in str(caught.value)
    assert message in str(caught.value) and "\n" not in str(caught.value)


# ---- ConflictBank ------------------------------------------------------------------------------


def test_conflictbank_question_file_is_json_lines_despite_its_extension(home, hub):
    from groundcover.pipelines.comprehensiveness.meta import conflictbank_items

    publish(hub, "conflictbank", "conflictbank")
    found = get("conflictbank")
    rows = [json.loads(line) for line in found.path.read_text().splitlines()]
    published = (PUBLISHED / "conflictbank" / "QA_dataset.json").read_text().splitlines()
    assert rows == [json.loads(line) for line in published]  # every row, in published order
    items = conflictbank_items(found.path)
    assert len(items) == 2 * len(rows)  # the paper protocol: a D and a C item per question
    out = CliRunner().invoke(
        app, ["meta-eval", "conflictbank", *NO_SERVER, "--dry-run", "--run-dir", str(home / "run")]
    )
    assert out.exit_code == 0, out.output


def test_conflictbank_broken_line_in_the_middle_converts_nothing(home, hub):
    lines = (PUBLISHED / "conflictbank" / "QA_dataset.json").read_text().splitlines()
    lines[2] = lines[2][:40]  # cut mid-record
    hub.repo(CATALOG["conflictbank"].repo).commit({"QA_dataset.json": "\n".join(lines).encode()})
    with pytest.raises(UserError, match=r"QA_dataset.json:3: not valid JSON"):
        get("conflictbank")
    assert not any(k.startswith("conflictbank@") for k in read_lock())
    assert not list((home / "data" / "conflictbank").glob("*/train.jsonl"))


# ---- TREC-ICAT ---------------------------------------------------------------------------------


def test_trec_icat_main_file_is_the_queries_and_the_corpus_builds_by_name(home, hub, tmp_path):
    from groundcover.pipelines.datasets.names import dataset_file
    from groundcover.pipelines.icat.data import load_qrels, load_queries

    publish(hub, "trec-icat", "trec-icat")
    queries = load_queries(dataset_file("trec-icat"))
    assert dataset_file("trec-icat").name == "queries.jsonl"
    assert [q.query for q in queries.values()] == [
        "obama family tree",
        "french lick resort and casino",
    ]
    qrels, _ = load_qrels(dataset_file("trec-icat/qrels.jsonl"), set(queries))
    assert qrels["1"] == {"clueweb09-en0000-01-00001": {"1"}, "clueweb09-en0000-01-00002": set()}
    out = tmp_path / "icat-index"
    built = CliRunner().invoke(app, ["index", "build", "trec-icat/corpus.jsonl", str(out)])
    assert built.exit_code == 0, built.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 3


def test_trec_icat_relevance_is_the_authors_grade_one(tmp_path):
    """The ICAT authors mark a subtopic where relevance == 1; another grade marks nothing."""
    from groundcover.pipelines.icat.data import load_qrels

    path = tmp_path / "qrels.jsonl"
    rows = [
        {"query_id": "1", "doc_id": d, "relevance": r, "subtopic_id": "1"}
        for d, r in (("a", 1), ("b", 2), ("c", 0), ("d", -2))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    qrels, _ = load_qrels(path, {"1"})
    assert qrels["1"] == {"a": {"1"}, "b": set(), "c": set(), "d": set()}


# ---- CRUX-MDS ----------------------------------------------------------------------------------


def test_crux_mds_published_ratings_score_with_no_rater_call(home, hub, tmp_path):
    from groundcover.pipelines.crux.data import load_ratings, load_topics
    from groundcover.pipelines.datasets.names import dataset_file

    sha = CATALOG["crux-mds"].revision
    publish(hub, "crux-mds", "crux", sha=sha)
    get("crux-mds")
    entry = read_lock()[f"crux-mds@{sha}"]
    assert entry["revision"] == sha
    assert all(f.startswith(("crux-mds-duc04/", "crux-mds-multi_news/")) for f in entry["files"])
    topics = load_topics(dataset_file("crux-mds/topics-duc04.jsonl"))
    ratings = load_ratings(dataset_file("crux-mds/ratings-duc04.jsonl"), topics)
    assert ratings["d30001t"] == {
        "d30001t:0#0": [5, 1, 0],
        "d30001t:1#0": [0, 4, 3],
        "d30001t:2#1": [2, 0, 1],
    }
    multi = load_topics(dataset_file("crux-mds"))
    assert list(multi) == ["mn-0001"]  # mn-0002 has no sub-questions
    passages = tmp_path / "passages.jsonl"
    passages.write_text(
        "".join(
            json.dumps({"id": f"d30001t:{p}", "topic": "d30001t", "text": text}) + "\n"
            for p, text in (
                ("0#0", "Hurricane Mitch did the most damage."),
                ("1#0", "Honduras and Nicaragua were hit; thousands died."),
                ("2#1", "The season had fourteen named storms."),
            )
        )
    )
    run = tmp_path / "run.trec"  # p2 first: the top |P**| = 2 are p2 and p0
    run.write_text(
        "d30001t Q0 d30001t:2#1 1 3.0 bm25\nd30001t Q0 d30001t:0#0 2 2.0 bm25\n"
        "d30001t Q0 d30001t:1#0 3 1.0 bm25\n"
    )
    done = CliRunner().invoke(
        app,
        [
            "eval",
            "crux",
            str(run),
            "--topics",
            "crux-mds/topics-duc04.jsonl",
            "--passages",
            str(passages),
            "--ratings",
            "crux-mds/ratings-duc04.jsonl",
            "--no-rate",
            *NO_SERVER,
            "--run-dir",
            str(tmp_path / "crux"),
            "--quiet",
        ],
    )
    assert done.exit_code == 0, done.output
    results = (tmp_path / "crux" / "results.jsonl").read_text().splitlines()
    [record] = [json.loads(line) for line in results]
    # all three sub-questions answerable (5, 4, 3 >= 3); P** = {p1 (q1, q2), p0 (q0)}; the run's
    # top 2 (p2, p0) answer q0 only: Cov = 1/3
    assert record["status"] == "ok" and record["score"] == pytest.approx(1 / 3)
    summary = json.loads((tmp_path / "crux" / "summary.json").read_text())
    assert summary["usage_this_invocation"] == {} and record["usage"] == {}  # no model asked
    assert record["details"]["oracle"] == ["d30001t:1#0", "d30001t:0#0"]


def test_crux_judge_line_with_the_wrong_number_of_ratings_is_one_line(home, hub):
    import shutil

    folder = home.parent / "crux-bad"
    shutil.copytree(PUBLISHED / "crux", folder)
    judge = folder / "crux-mds-duc04" / "judge" / "ratings.test.jsonl"
    lines = judge.read_text().splitlines()
    lines[1] = json.dumps(json.loads(lines[1]) | {"rating": [4, 3]})
    judge.write_text("\n".join(lines) + "\n")
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    hub.repo(CATALOG["crux-mds"].repo).commit(files, sha=CATALOG["crux-mds"].revision)
    with pytest.raises(
        UserError,
        match=r"line 2: record 'd30001t:1#0': field rating: 2 ratings "
        r"for 3 sub-questions",
    ):
        get("crux-mds")
    assert not any(k.startswith("crux-mds@") for k in read_lock())


# ---- ClueWeb09 Category B as CMU ships it ------------------------------------------------------


def warc_file(path: Path, pages: list[tuple[str, str, str]]) -> None:
    """A gzipped ClueWeb09 WARC file as the collection writes it: WARC/0.18, header lines ending
    in LF only, a warcinfo record first, then one response record per page (WARC-TREC-ID, the
    HTTP headers and the HTML as the payload), each record followed by a blank line."""
    import gzip

    def record(kind: str, fields: dict[str, str], payload: bytes) -> bytes:
        head = ["WARC/0.18", f"WARC-Type: {kind}", *(f"{k}: {v}" for k, v in fields.items())]
        head.append(f"Content-Length: {len(payload)}")
        return ("\n".join(head) + "\n\n").encode() + payload + b"\n\n"

    data = record("warcinfo", {"WARC-Date": "2009-03-65T08:43:19-0800"}, b"software: Nutch\n")
    for trec_id, url, html in pages:
        http = b"HTTP/1.1 200 OK\nContent-Type: text/html; charset=utf-8\n\n" + html.encode()
        fields = {
            "WARC-Target-URI": url,
            "WARC-Date": "2009-03-65T08:43:19-0800",
            "WARC-Record-ID": f"<urn:uuid:{trec_id}>",
            "WARC-TREC-ID": trec_id,
            "Content-Type": "application/http;msgtype=response",
        }
        data += record("response", fields, http)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as handle:
        handle.write(data)


def clueweb09_copy(root: Path) -> Path:
    segment = root / "ClueWeb09_English_1"
    page = "<html><head><title>{}</title></head><body><p>{}</p></body></html>"
    warc_file(
        segment / "en0000" / "00.warc.gz",
        [
            ("clueweb09-en0000-00-00000", "http://a.example/", page.format("Seine", "The Seine.")),
            ("clueweb09-en0000-00-00001", "http://b.example/", "<html><body></body></html>"),
        ],
    )
    warc_file(
        segment / "en0000" / "01.warc.gz",
        [("clueweb09-en0000-01-00000", "http://c.example/", page.format("Loire", "Castles."))],
    )
    wiki = ("clueweb09-enwp00-00-00000", "http://en.wikipedia.org/wiki/Paris")
    warc_file(segment / "enwp00" / "00.warc.gz", [(*wiki, page.format("Paris", "A city."))])
    return root


def test_clueweb09_b_copy_as_shipped_is_registered_and_indexed_by_name(home, tmp_path):
    copy = clueweb09_copy(tmp_path / "clueweb09")
    runner = CliRunner()
    result = runner.invoke(app, ["data", "add", "clueweb09-b", str(copy)])
    assert result.exit_code == 0, result.output
    index = tmp_path / "index"
    result = runner.invoke(
        app, ["index", "build", "clueweb09-b", str(index), "--dense-model", "none"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 3  # the page with no text is skipped
    assert manifest["corpus"]["format"] == "clueweb09"
    chunks = [json.loads(line) for line in (index / "chunks.jsonl").read_text().splitlines()]
    assert [c["doc_id"] for c in chunks] == [
        "clueweb09-en0000-00-00000",
        "clueweb09-en0000-01-00000",
        "clueweb09-enwp00-00-00000",
    ]  # ClueWeb09's order: directory, then file
    assert "The Seine." in chunks[0]["text"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no segment", "no ClueWeb09_English_1/"),
        ("not gzip", "00.warc.gz: not a ClueWeb09 WARC file"),
        ("no files", "no ClueWeb09_English_1/<dir>/<NN>.warc.gz files"),
    ],
)
def test_a_clueweb09_copy_that_is_not_one_is_refused_in_one_line(home, tmp_path, damage, message):
    copy = tmp_path / "copy"
    copy.mkdir()
    if damage == "not gzip":
        bad = copy / "ClueWeb09_English_1" / "en0000" / "00.warc.gz"
        bad.parent.mkdir(parents=True)
        bad.write_bytes(b"WARC/0.18\nnot compressed\n")
    elif damage == "no files":
        (copy / "ClueWeb09_English_1" / "en0000").mkdir(parents=True)
    result = CliRunner().invoke(app, ["data", "add", "clueweb09-b", str(copy)])
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "clueweb09-b@local" not in read_lock()
