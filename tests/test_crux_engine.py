"""CRUX end to end on real parts: `crux build` on two hand-written records with the tiny vLLM
server (SIGKILLed and resumed: every record once, no rating asked twice), then a real BM25 index
over the generated passages, a TREC run from it, and `eval crux` on that run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RECORDS = [
    {
        "id": "solar",
        "summary": "Solar panels turn sunlight into electricity. Costs fell sharply "
        "after 2010, and many countries pay subsidies for home installations.",
        "documents": [
            "Solar panels are made of silicon cells that turn sunlight into power. "
            "Prices dropped by almost 90 percent between 2010 and 2020.",
            "Germany and Spain pay subsidies for panels on houses. " * 3,
        ],
    },
    {
        "id": "rivers",
        "summary": "The Danube flows through ten countries and ends in the Black "
        "Sea. It is an important shipping route for Central Europe.",
        "documents": [
            "The Danube rises in the Black Forest and reaches the Black Sea. " * 2,
            "Barges carry grain and steel along the Danube through Vienna.",
        ],
    },
]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))


def test_crux_build_killed_and_resumed_then_eval_on_a_bm25_run(vllm_server, tmp_path):
    from groundcover.index_build.build import IndexSpec, build_index
    from groundcover.retrieval.index import SearchIndex

    source = tmp_path / "summaries.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    data = tmp_path / "data"
    shared = [
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--max-tokens",
        "32",
        "--quiet",
    ]
    # one record at a time, so the kill after the first record lands before the second ends
    build = [
        sys.executable,
        "-m",
        "groundcover",
        "crux",
        "build",
        str(source),
        "--questions",
        "3",
        "--run-dir",
        str(data),
        "--concurrency",
        "1",
        *shared,
    ]
    results = data / "records" / "results.jsonl"
    first = subprocess.Popen(build, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None:
        if results.is_file() and results.read_bytes().count(b"\n") >= 1:
            break
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done_before = {json.loads(x)["id"] for x in results.read_text().splitlines()}
    assert 1 <= len(done_before) < 2, "the kill must land mid-build"
    second = subprocess.run(build, env=env(), capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["rivers", "solar"]  # each once, none lost
    summary = json.loads((data / "records" / "summary.json").read_text())
    pairs_left = sum(
        len(r["details"]["passages"]) * len(r["details"]["questions"])
        for r in records
        if r["id"] not in done_before
    )
    # The rerun rated only the record the kill interrupted (and, through the response cache,
    # not even the pairs of it already rated): the finished record's matrix is never re-asked.
    # A rating without a digit is re-asked (twice at most): three requests per pair at most.
    requests = summary["usage_this_invocation"].get("rate", {}).get("requests", 0)
    assert requests <= 3 * pairs_left
    rows = [json.loads(x) for x in (data / "ratings.jsonl").read_text().splitlines()]
    keys = [(r["topic"], r["passage_id"], r["question"]) for r in rows]
    assert len(keys) == len(set(keys))  # no pair twice in the exchange file
    # The random model writes no digit, so its ratings leave nothing answerable and the
    # exchange topics are empty -- as the rules say. To evaluate a run over the generated passages
    # anyway, every record's sub-questions become a topic, one hand-given rating (its first
    # passage answers sub-question 0) makes P** exist, and eval rates all other pairs on the fly.
    assert all(r["status"] in {"ok", "undefined"} for r in records)
    topics = [
        {
            "topic": r["id"],
            "query": r["details"]["query"] or "query",
            "questions": r["details"]["questions"],
        }
        for r in records
    ]
    (data / "topics-all.jsonl").write_text("".join(json.dumps(t) + "\n" for t in topics))
    seed = [
        {
            "topic": r["id"],
            "passage_id": next(iter(r["details"]["passages"])),
            "question": 0,
            "rating": 5,
        }
        for r in records
    ]
    (data / "ratings-seed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in seed))
    passages = [
        {"id": pid, "topic": r["id"], "text": text or "empty"}
        for r in records
        for pid, text in r["details"]["passages"].items()
    ]
    (data / "passages-all.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p["id"], "contents": p["text"]}) + "\n" for p in passages)
    )
    build_index(
        corpus, tmp_path / "index", IndexSpec(dense_model=None, chunk_size=10_000, chunk_overlap=0)
    )
    index = SearchIndex.load(tmp_path / "index")
    run_file = tmp_path / "bm25.trec"
    lines = []
    for topic in topics:
        hits = index.search([topic["query"]], k=5, mode="bm25")[0]
        lines += [
            f"{topic['topic']} Q0 {h.doc_id} {rank} {h.score:.4f} bm25"
            for rank, h in enumerate(hits, 1)
        ]
    run_file.write_text("\n".join(lines) + "\n")
    evaluation = subprocess.run(
        [
            sys.executable,
            "-m",
            "groundcover",
            "eval",
            "crux",
            str(run_file),
            "--topics",
            str(data / "topics-all.jsonl"),
            "--passages",
            str(data / "passages-all.jsonl"),
            "--ratings",
            str(data / "ratings-seed.jsonl"),
            "--k",
            "3",
            "--run-dir",
            str(tmp_path / "eval"),
            *shared,
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert evaluation.returncode == 0, evaluation.stdout[-2000:] + evaluation.stderr[-2000:]
    table = json.loads((tmp_path / "eval" / "crux.json").read_text())
    assert table["topics"] == len({line.split()[0] for line in lines})
    assert table["undefined_topics"] == 0 and 0 <= table["cov"] <= 1
    assert table["rated_now"] > 0  # the judge rated the run's unrated pairs through the server
    assert 0 <= table["alpha_ndcg"] <= 1
