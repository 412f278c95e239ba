"""Datasets by name: fetched from a loopback imitation of the Hub, pinned, verified, converted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.datasets import CATALOG, get, provenance
from groundcover.pipelines.datasets.convert import (
    check_corpus,
    conflictbank_train,
    wikicontradict_humaneval,
)
from groundcover.pipelines.datasets.fetch import read_lock
from groundcover.pipelines.runtime.contract.config import UserError
from tests.conftest import SHARED
from tests.support.fake_hub import FakeHub
from tests.support.scripted import ScriptedClient
from tests.test_meta import cb_row
from tests.test_runtime import COVERED, UNCOVERED, run

WC = CATALOG["wikicontradict-humaneval"]
WC_REPO, WC_FILE = WC.repo, WC.files[0]
SHARED_WC = SHARED / "data" / "wikicontradict"


def adjudication_record(qid: int, question: str) -> dict:
    """One record in the published adjudication schema (the fields the converter reads)."""
    record = {
        "modelName": "m_annotated",
        "question_ID": qid,
        "question1": question,
        "question1_context1": "Context one says 1999.",
        "question1_context2": "Context two says 2001.",
        "question1_answer1": "1999",
        "question1_answer2": "2001",
    }
    for i in range(5):
        record[f"ModelAnswer_prompt_{i}"] = f"\nAnswer: answer {i} to {question}"
        record[f"ModelAnswer_prompt_{i}_humanEval"] = "Correct" if i % 2 else "Incorrect"
    return record


def adjudication(*questions: str) -> bytes:
    data = {"model-a": [adjudication_record(n, q) for n, q in enumerate(questions, 1)]}
    return json.dumps(data, ensure_ascii=False).encode()


def file_requests(hub: FakeHub) -> list[tuple[str, str, str | None]]:
    return [entry for entry in hub.log if "/resolve/" in entry[1]]


def test_get_converts_locks_and_a_second_get_makes_no_request(home, hub):
    content = adjudication("When was X built?", "Who wrote Y?")
    commit = hub.repo(WC_REPO).commit({WC_FILE: content, "README.md": b"card"})
    found = get("wikicontradict-humaneval")
    assert found.revision == commit
    rows = [json.loads(line) for line in found.path.read_text().splitlines()]
    assert [r["question"] for r in rows] == ["When was X built?", "Who wrote Y?"]
    assert rows[0]["answer0"] == "answer 0 to When was X built?"  # "\nAnswer: " removed
    assert rows[0]["label1"] == "Correct" and rows[0]["model"] == "model-a"
    entry = read_lock()["wikicontradict-humaneval@main"]
    assert entry["revision"] == commit
    assert entry["files"] == {WC_FILE: hashlib.sha256(content).hexdigest()}  # README not fetched
    assert (
        entry["outputs"]["humaneval.jsonl"] == hashlib.sha256(found.path.read_bytes()).hexdigest()
    )
    requests = len(hub.log)
    again = get("wikicontradict-humaneval")
    assert again == found
    assert len(hub.log) == requests  # lock and files agree: nothing asked
    # The manifest side: the converted file is known by name, revision and digest.
    [origin] = provenance([found.path])
    assert origin["dataset"] == "wikicontradict-humaneval" and origin["revision"] == commit
    # A converted file edited in place (new mtime) is hashed again and refused.
    found.path.write_text(found.path.read_text().replace("Who wrote Y?", "Who wrote Z?"))
    with pytest.raises(UserError, match="sha256 differs from .* the cached copy was changed"):
        get("wikicontradict-humaneval")


def test_a_changed_upstream_file_is_refused_and_nothing_is_cached(home, hub):
    repo = hub.repo(WC_REPO)
    commit = repo.commit({WC_FILE: adjudication("When was X built?")})
    first = get("wikicontradict-humaneval")
    lock_before = read_lock()
    # The same commit now serves other bytes (a tampered mirror); the local copies are gone.
    repo.commits[commit][WC_FILE] = adjudication("Something else?")
    for path in (home / "data").rglob("*"):
        if path.is_file() and path.name != "lock.json":
            path.unlink()
    with pytest.raises(UserError, match="sha256 .* differs from the locked"):
        get("wikicontradict-humaneval")
    assert read_lock() == lock_before
    assert not first.path.exists()
    leftovers = [p for p in (home / "data" / "hub").rglob("*") if p.is_file() or p.is_symlink()]
    assert not any(p.name == Path(WC_FILE).name for p in leftovers)
    blobs = [p for p in leftovers if p.parent.name == "blobs"]
    assert blobs == []


def test_a_download_cut_midway_resumes_from_where_it_stopped(home, hub):
    # Larger than huggingface_hub's 10 MiB write chunk, so the bytes before the cut are on disk.
    questions = [f"Question {n}? " + "padding " * 400 for n in range(3200)]
    content = adjudication(*questions)
    assert len(content) > 12_000_000
    hub.repo(WC_REPO).commit({WC_FILE: content})
    cut = 11_000_000
    hub.cut[WC_FILE] = cut
    found = get("wikicontradict-humaneval")
    gets = [r for r in file_requests(hub) if r[0] == "GET"]
    assert gets[0][2] is None and gets[-1][2] is not None
    start = int(gets[-1][2].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= cut  # the rest was asked for, not the whole file again
    assert read_lock()["wikicontradict-humaneval@main"]["files"][WC_FILE] == (
        hashlib.sha256(content).hexdigest()
    )
    assert len(found.path.read_text().splitlines()) == len(questions)


def test_offline_uses_the_cache_and_without_it_fails_in_one_line(home, hub, monkeypatch, tmp_path):
    hub.repo(WC_REPO).commit({WC_FILE: adjudication("When was X built?")})
    found = get("wikicontradict-humaneval")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    requests = len(hub.log)
    assert get("wikicontradict-humaneval") == found
    assert len(hub.log) == requests
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "empty-home"))
    result = CliRunner().invoke(app, ["data", "get", "wikicontradict-humaneval"])
    assert result.exit_code == 2
    message = result.output.strip()
    assert "not cached and HF_HUB_OFFLINE is set" in message and "\n" not in message
    assert len(hub.log) == requests


def test_a_pinned_revision_is_honoured(home, hub):
    repo = hub.repo(WC_REPO)
    old = repo.commit({WC_FILE: adjudication("Old question?")})
    new = repo.commit({WC_FILE: adjudication("New question?")})
    pinned = get(f"wikicontradict-humaneval@{old}")
    latest = get("wikicontradict-humaneval")
    assert (pinned.revision, latest.revision) == (old, new)
    assert "Old question?" in pinned.path.read_text()
    assert "New question?" in latest.path.read_text()
    assert {f"wikicontradict-humaneval@{old}", "wikicontradict-humaneval@main"} <= set(read_lock())
    assert any(f"/resolve/{old}/" in r[1] for r in file_requests(hub))


def test_unknown_names_missing_files_and_licensed_data_fail_in_one_line(home, hub, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["data", "get", "no-such-set"])
    assert result.exit_code == 2 and "unknown dataset 'no-such-set'; known:" in result.output
    hub.repo(WC_REPO).commit({"README.md": b"no data here"})
    result = runner.invoke(app, ["data", "get", "wikicontradict-humaneval"])
    assert result.exit_code == 2 and "has no file matching" in result.output
    result = runner.invoke(app, ["data", "get", "clueweb09-b"])
    assert result.exit_code == 2 and "licensed and not registered" in result.output
    result = runner.invoke(app, ["data", "path", "garage"])
    assert result.exit_code == 2 and "not cached" in result.output
    assert not (home / "data" / "garage").exists()


def test_data_add_checks_the_shape_then_registers_a_local_copy(home, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "d1", "text": "no contents field"}\n')
    runner = CliRunner()
    result = runner.invoke(app, ["data", "add", "clueweb09-b", str(bad)])
    assert result.exit_code == 2 and "field contents: missing" in result.output
    assert "clueweb09-b@local" not in read_lock()
    good = tmp_path / "corpus.jsonl"
    good.write_text('{"id": "d1", "contents": "A page."}\n')
    result = runner.invoke(app, ["data", "add", "clueweb09-b", str(good)])
    assert result.exit_code == 0, result.output
    assert get("clueweb09-b").path == good.resolve()
    result = runner.invoke(app, ["data", "path", "clueweb09-b"])
    assert result.output.strip() == str(good.resolve())
    # A registered corpus is indexed by name.
    index = tmp_path / "index"
    result = runner.invoke(
        app, ["index", "build", "clueweb09-b", str(index), "--dense-model", "none"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((index / "manifest.json").read_text())["counts"]["documents"] == 1


def test_fanoutqa_dev_comes_from_the_package_with_no_download(home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = get("fanoutqa-dev")
    assert found.path.name == "fanout-final-dev.json" and found.path.is_file()
    assert found.sha256 == hashlib.sha256(found.path.read_bytes()).hexdigest()
    questions = json.loads(found.path.read_text())
    assert len(questions) > 100 and "question" in questions[0]


def test_a_command_takes_a_name_for_its_data_and_the_manifest_records_it(home, hub, tmp_path):
    """meta-eval wikicontradict --data NAME: resolved through the cache, recorded by revision."""
    from groundcover.pipelines.cli.options import Shared, load_request

    commit = hub.repo(WC_REPO).commit({WC_FILE: adjudication("When was X built?")})
    request = load_request(COMPREHENSIVENESS, {"dataset": "wikicontradict", "limit": 1}, Shared())
    options = request.options
    assert options.input == get("wikicontradict-humaneval").path  # the default is the name
    covered = f"x\n{COVERED}\n- X was built in 1999 [1]\n{UNCOVERED}\n- X was built in 2001 [2]\n"
    scripts = {"summarise": lambda p: "S.", "coverage": lambda p: covered}
    client = ScriptedClient(scripts, check_constraints=False)
    run(COMPREHENSIVENESS, options.model_copy(update={"method": "e2e"}), client, tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    [origin] = manifest["data"]
    assert origin["dataset"] == "wikicontradict-humaneval" and origin["revision"] == commit
    assert origin["sha256"] == hashlib.sha256(options.input.read_bytes()).hexdigest()


# ---- converters on records in their published schemas -----------------------------------------


@pytest.mark.skipif(not SHARED_WC.exists(), reason="../shared/data/wikicontradict is absent")
def test_wikicontradict_converter_reproduces_the_authors_rows_byte_for_byte(tmp_path):
    wikicontradict_humaneval([SHARED_WC / "humaneval-adjudication-dev.json"], tmp_path)
    expected = (SHARED_WC / "humaneval-dev.jsonl").read_bytes()
    assert (tmp_path / "humaneval.jsonl").read_bytes() == expected


def test_wikicontradict_converter_names_the_record_and_field_of_a_bad_file(tmp_path):
    record = adjudication_record(1, "Q?")
    del record["ModelAnswer_prompt_3_humanEval"]
    source = tmp_path / "adj.json"
    source.write_text(json.dumps({"model-a": [adjudication_record(0, "P?"), record]}))
    with pytest.raises(UserError, match=r"model 'model-a' record 1: field ModelAnswer_prompt_3_"):
        wikicontradict_humaneval([source], tmp_path)
    assert not (tmp_path / "humaneval.jsonl").exists()


def test_conflictbank_converter_keeps_the_published_row_order_from_json_or_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [cb_row(question=f"Q{n}?") for n in range(5)]
    as_json = tmp_path / "json"
    as_json.mkdir()
    (as_json / "CB_qa_train.json").write_text(json.dumps(rows))
    conflictbank_train([as_json / "CB_qa_train.json"], as_json)
    shards = tmp_path / "parquet"
    (shards / "train").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[3:]), shards / "train" / "0001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:3]), shards / "train" / "0000.parquet")
    conflictbank_train(sorted((shards / "train").iterdir(), reverse=True), shards)
    for out in (as_json, shards):
        got = [
            json.loads(line)["question"]
            for line in (out / "train.jsonl").read_text().split("\n")
            if line
        ]
        assert got == [f"Q{n}?" for n in range(5)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1] | {"default_claim": 3}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl: line 2: field default_claim: not a string"):
        conflictbank_train([bad], tmp_path)


def test_check_corpus_reads_the_first_lines_of_a_jsonl_corpus(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": 1, "contents": "text"}\nnot json\n')
    with pytest.raises(UserError, match=r"c.jsonl:2: not valid JSON"):
        check_corpus(corpus)


def test_name_slash_file_picks_one_file_of_a_dataset_with_several(home, hub):
    from groundcover.pipelines.datasets.names import dataset_file

    repo = CATALOG["trec-icat"].repo
    commit = hub.repo(repo).commit({"qrels.jsonl": b'{"q": 1}\n', "queries.jsonl": b'{"q": 2}\n'})
    qrels = dataset_file("trec-icat/qrels.jsonl")
    assert qrels.read_bytes() == b'{"q": 1}\n' and qrels.parent.name == commit
    assert dataset_file(f"trec-icat@{commit}/queries.jsonl").read_bytes() == b'{"q": 2}\n'
    with pytest.raises(
        UserError, match=r"has no file 'corpus.jsonl'; it has: qrels.jsonl, queries"
    ):
        dataset_file("trec-icat/corpus.jsonl")
    [origin] = provenance([qrels])
    assert (
        origin["dataset"] == "trec-icat"
        and origin["sha256"] == hashlib.sha256(b'{"q": 1}\n').hexdigest()
    )


def test_crux_mds_topics_and_sub_questions_become_our_topics_file(home, hub):
    from groundcover.pipelines.crux.data import load_topics
    from groundcover.pipelines.datasets.names import dataset_file

    def jsonl(*rows):
        return "".join(json.dumps(r) + "\n" for r in rows).encode()

    hub.repo(CATALOG["crux-mds"].repo).commit(
        {
            "crux-mds-multi_news/topic/requests.test.jsonl": jsonl(
                {"id": "mn-1", "request": "Write about the flood."},
                {"id": "mn-2", "request": "A topic nobody broke down."},
            ),
            "crux-mds-multi_news/subtopics/subquestions.test.jsonl": jsonl(
                {"id": "mn-1", "subquestions": ["When did it flood?", "Who helped?"]},
            ),
            "crux-mds-multi_news/qrels/div_qrels-tau3.txt": b"mn-1 0 mn-1:0#0 1\n",
            "crux-mds-duc04/topic/requests.test.jsonl": jsonl(
                {"id": "d-1", "request": "Elections."}
            ),
            "crux-mds-duc04/subtopics/subquestions.test.jsonl": jsonl(
                {"id": "d-1", "subquestions": ["Who won?"]}
            ),
            "sources/multi_news/data.arrow": b"not fetched",
            "crux-neuclir/topic/requests.jsonl": jsonl(
                {"id": "n-1", "request": "Not the paper's."}
            ),
        },
        sha=CATALOG["crux-mds"].revision,
    )
    topics = load_topics(dataset_file("crux-mds"))  # main file: the Multi-News topics
    assert list(topics) == ["mn-1"]  # mn-2 has no sub-questions: left out, as the authors do
    assert topics["mn-1"].query == "Write about the flood."
    assert topics["mn-1"].questions == ["When did it flood?", "Who helped?"]
    duc = load_topics(dataset_file("crux-mds/topics-duc04.jsonl"))
    assert duc["d-1"].questions == ["Who won?"]
    qrels = dataset_file("crux-mds/multi_news-qrels-div_qrels-tau3.txt")
    assert qrels.read_bytes() == b"mn-1 0 mn-1:0#0 1\n"
    entry = next(v for k, v in read_lock().items() if k.startswith("crux-mds@"))
    assert "sources/multi_news/data.arrow" not in entry["files"]
    assert not any("neuclir" in f for f in entry["files"])  # only the paper's two subsets
    assert entry["revision"] == CATALOG["crux-mds"].revision  # pinned, not main


def topics_xml(topics: list[dict]) -> bytes:
    """TREC Web Track topics in NIST's XML layout (what the converter reads)."""
    from xml.sax.saxutils import escape, quoteattr

    parts = ['<?xml version="1.0" encoding="UTF-8"?>\n<webtrack>\n']
    for t in topics:
        description = escape(t["description"])
        parts.append(
            f'<topic number="{t["topic_id"]}" type={quoteattr(t["type"])}>\n'
            f"  <query>{escape(t['query'])}</query>\n"
            f"  <description>\n  {description}\n  </description>\n"
        )
        for s in t["subtopics"]:
            parts.append(
                f'  <subtopic number="{s["subtopic_id"]}" type={quoteattr(s["type"])}>\n'
                f"  {escape(s['description'])}\n  </subtopic>\n"
            )
        parts.append("</topic>\n")
    return "".join([*parts, "</webtrack>\n"]).encode()


def test_trec_web_topics_through_ir_datasets_in_icat_formats(home, monkeypatch):
    """NIST's files where ir_datasets keeps them ($IR_DATASETS_HOME/clueweb09/trec-web-20XX/,
    written here by hand in NIST's layouts: nothing is fetched), read by its diversity datasets
    and converted to ICAT's formats."""
    import gzip
    import os

    from groundcover.pipelines.datasets.names import dataset_file
    from groundcover.pipelines.icat.data import load_qrels, load_queries

    shared = SHARED / "data" / "trec-web" / "topics.jsonl"
    made = [
        {
            "topic_id": n,
            "query": f"query {n} & more",
            "type": "faceted",
            "description": f"About {n}.",
            "subtopics": [
                {"subtopic_id": 1, "type": "inf", "description": "First <aspect>."},
                {"subtopic_id": 3, "type": "nav", "description": "Another."},
            ],
        }
        for n in range(1, 201)
    ]
    lines = shared.read_text().splitlines() if shared.exists() else []
    topics = [json.loads(line) for line in lines] or made
    root = Path(os.environ["IR_DATASETS_HOME"]) / "clueweb09"
    by_year = {2009: (1, 50), 2010: (51, 100), 2011: (101, 150), 2012: (151, 200)}
    qrels = {
        2009: b"1 1 clueweb09-en0000-00-00001 1\n",
        2010: b"51 2 clueweb09-en0000-00-00002 0\n",
        2011: b"101 1 clueweb09-en0000-00-00003 2\n",
        2012: b"151 4 clueweb09-en0000-00-00004 1\n",
    }
    for year, (low, high) in by_year.items():
        folder = root / f"trec-web-{year}"
        folder.mkdir(parents=True, exist_ok=True)
        xml = topics_xml([t for t in topics if low <= t["topic_id"] <= high])
        (folder / "queries.xml").write_bytes(xml)
        if year == 2009:  # NIST publishes the 2009 qrels gzipped
            (folder / "qrels.all.gz").write_bytes(gzip.compress(qrels[year]))
        else:
            (folder / "qrels.all").write_bytes(qrels[year])
    found = get("trec-web-topics")
    got = [json.loads(line) for line in found.path.read_text().splitlines()]
    assert got == sorted(topics, key=lambda t: t["topic_id"])  # the JSON the XML was made from
    queries = load_queries(found.path)
    assert len(queries) == len(topics)
    qrels_path = dataset_file("trec-web-topics/qrels.jsonl")
    rows = [json.loads(line) for line in qrels_path.read_text().splitlines()]
    assert [(r["query_id"], r["subtopic_id"], r["relevance"]) for r in rows] == [
        ("1", "1", 1),
        ("51", "2", 0),
        ("101", "1", 2),
        ("151", "4", 1),
    ]
    judged, _ = load_qrels(qrels_path, {"1", "101", "151"})
    # grade 2 is kept in the converted qrels; the ICAT authors mark a subtopic at grade 1 only
    assert judged["101"]["clueweb09-en0000-00-00003"] == set()
    assert judged["151"]["clueweb09-en0000-00-00004"] == {"4"}
    entry = read_lock()["trec-web-topics@ir_datasets"]
    assert entry["revision"].startswith("ir_datasets-")
    assert set(entry["files"]) == {
        f"trec-web-{y}/diversity/{k}" for y in by_year for k in ("queries", "qrels")
    }
    assert get("trec-web-topics") == found  # locked: read once per ir_datasets version


def test_an_unreachable_hub_is_one_line_and_caches_nothing(home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    result = CliRunner().invoke(app, ["data", "get", "garage"])
    assert result.exit_code == 2
    assert "dataset garage@main (hf:AmazonScience/GaRAGe):" in result.output
    assert "check the network, HF_ENDPOINT and HF_TOKEN" in result.output
    assert read_lock() == {} and not (home / "data" / "garage").exists()


def test_fanoutqa_wiki_pages_come_from_the_package_cache(home, monkeypatch, tmp_path):
    from fanoutqa import wiki

    from groundcover.pipelines.fanoutqa.framework import check_articles

    data = Path(wiki.__file__).parent / "data"
    pages: set[int] = set()

    def walk_dev(subs):
        for sub in subs:
            if sub.get("evidence"):
                pages.add(sub["evidence"]["pageid"])
            walk_dev(sub.get("decomposition") or [])

    for question in json.loads((data / "fanout-final-dev.json").read_text()):
        walk_dev(question["decomposition"])
    for question in json.loads((data / "fanout-final-test.json").read_text()):
        pages.update(e["pageid"] for e in question["necessary_evidence"])
    cache = tmp_path / "wikicache"
    cache.mkdir()
    monkeypatch.setattr(wiki, "WIKI_CACHE_DIR", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be fetched
    first, *rest = sorted(pages)
    for pageid in rest:
        (cache / f"{pageid}-dated.md").write_text(f"Page {pageid} as of the epoch.")
    with pytest.raises(UserError, match=rf"1 of {len(pages)} pages \(first: {first}\)"):
        get("fanoutqa-wiki")
    assert not any(k.startswith("fanoutqa-wiki@") for k in read_lock())
    (cache / f"{first}-dated.md").write_text(f"Page {first} as of the epoch.")
    found = get("fanoutqa-wiki")
    rows = [json.loads(line) for line in found.path.read_text().splitlines()]
    assert [r["pageid"] for r in rows] == sorted(pages)
    assert rows[0]["text"] == f"Page {first} as of the epoch." and rows[0]["title"]
    check_articles(found.path)  # what eval fanoutqa --articles reads
    assert get("fanoutqa-wiki") == found  # locked by the package version: converted once


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_json_array_streams_the_items_of_a_big_list(tmp_path, chunk):
    from groundcover.pipelines.datasets.convert import json_array

    items = [
        {"q": "a ] tricky, string", "n": 12345, "nested": [1, {"x": "é"}]},
        678901,
        "plain",
        [],
        {"last": None},
    ]
    path = tmp_path / "list.json"
    path.write_text(" \n" + json.dumps(items, ensure_ascii=False, indent=1) + "\n")
    assert list(json_array(path, chunk)) == items
    path.write_text(json.dumps(items)[:-5])  # cut short
    with pytest.raises(UserError, match="list.json: not valid JSON"):
        list(json_array(path, chunk))
    path.write_text('{"train": []}')
    with pytest.raises(UserError, match="expected a JSON list"):
        list(json_array(path, chunk))


def test_a_hub_ref_revision_keeps_its_slashes(home, hub):
    """conflictbank@refs/convert/parquet: the Hub's Parquet conversion, shards in name order."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from groundcover.pipelines.datasets.names import dataset_file

    def parquet(rows):
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        return sink.getvalue()

    rows = [cb_row(question=f"Q{n}?") for n in range(4)]
    repo = hub.repo(CATALOG["conflictbank"].repo)
    repo.commit({"CB_qa.json": json.dumps(rows[:1]).encode()})  # main: another file
    converted = repo.commit(
        {
            "default/train/0001.parquet": parquet(rows[2:]),
            "default/train/0000.parquet": parquet(rows[:2]),
        },
        ref="refs/convert/parquet",
    )
    found = get("conflictbank@refs/convert/parquet")
    assert found.revision == converted and found.requested == "refs/convert/parquet"
    questions = [json.loads(line)["question"] for line in found.path.read_text().splitlines()]
    assert questions == ["Q0?", "Q1?", "Q2?", "Q3?"]
    assert "conflictbank@refs/convert/parquet" in read_lock()
    assert dataset_file("conflictbank@refs/convert/parquet/train.jsonl") == found.path
