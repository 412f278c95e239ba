"""ICAT end to end on real parts: the tiny vLLM server (claims from its LoRA adapter), a tiny
DeBERTa-v2 NLI cross-encoder, a real BM25 + FAISS index over TREC Web Track subtopic texts; all
three variants, SIGKILLed mid-run and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADAPTER, SHARED

TOPICS = SHARED / "data" / "trec-web" / "topics.jsonl"
pytestmark = pytest.mark.skipif(not TOPICS.is_file(), reason=f"shared data not found: {TOPICS}")
N_TOPICS, SYSTEMS = 4, ("sys1", "sys2", "sys3", "sys4")


@pytest.fixture(scope="module")
def icat_inputs(tmp_path_factory):
    from groundcover.index_build.build import IndexSpec, build_index
    from tests.support.tiny import build_tiny_classifier

    root = tmp_path_factory.mktemp("icat")
    topics = [json.loads(line) for line in TOPICS.read_text().splitlines()]
    corpus, qrels = [], []
    for topic in topics[:20]:  # every subtopic text is a document, relevant to that subtopic
        for sub in topic["subtopics"]:
            doc = f"t{topic['topic_id']}.{sub['subtopic_id']}"
            corpus.append({"id": doc, "contents": sub["description"]})
            qrels.append(
                {
                    "query_id": topic["topic_id"],
                    "doc_id": doc,
                    "relevance": 1,
                    "subtopic_id": sub["subtopic_id"],
                }
            )
    responses = [
        {
            "system": system,
            "query_id": topic["topic_id"],
            "response": f"{topic['description']} ({system})",
        }
        for topic in topics[:N_TOPICS]
        for system in SYSTEMS
    ]
    paths = {}
    for name, rows in (("corpus", corpus), ("qrels", qrels), ("responses", responses)):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["index"] = root / "index"
    build_index(paths["corpus"], paths["index"], IndexSpec(chunk_trailing=True, faiss="auto"))
    paths["nli"] = build_tiny_classifier(root / "nli")
    return paths


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def test_icat_all_variants_on_real_parts_resume_after_sigkill(vllm_server, icat_inputs, tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "icat.yaml"  # short lists and lines: the random model finishes them
    config.write_text("icat:\n  line_max_chars: 30\n  list_max_items: 4\n  max_aspects: 3\n")
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "eval",
        "icat",
        str(icat_inputs["responses"]),
        "--queries",
        str(TOPICS),
        "--qrels",
        str(icat_inputs["qrels"]),
        "--index",
        str(icat_inputs["index"]),
        "--retrieval",
        "hybrid",
        "--k",
        "3",
        "--nli-model",
        str(icat_inputs["nli"]),
        "--variant",
        "m,s,a",
        "--beta",
        "1,2",
        "--extractor",
        ADAPTER,
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--max-tokens",
        "200",
        "--concurrency",
        "2",
        "--config",
        str(config),
        "--run-dir",
        str(run_dir),
        "--no-cache",
        "--quiet",
    ]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    results = run_dir / "results.jsonl"
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while count_lines(results) < 3 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done_before = count_lines(results)
    assert 3 <= done_before < N_TOPICS * len(SYSTEMS), "the kill must land mid-run"

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    ids = sorted(f"{s}:{t}" for t in ("1", "2", "3", "4") for s in SYSTEMS)
    assert sorted(r["id"] for r in records) == ids  # each exactly once, none lost
    for record in records:
        assert record["status"] in {"ok", "undefined", "unparseable"}, record
        if record["status"] == "unparseable":
            assert record["failure"]["stage"] in {"claims", "aspects", "align_s", "align_a"}
            continue
        assert record["usage"]["claims"]["calls"] >= 1
        if record["status"] == "ok":
            details = record["details"]
            assert set(details["variants"]) == {"m", "s", "a"}
            for grounding in details["grounding"]:
                assert len(grounding["snippets"]) == 3
                assert all(0 <= s["p_entailment"] <= 1 for s in grounding["snippets"])
            for found in details["variants"].values():
                assert set(found["icat"]) == {"1.0", "2.0"}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # Two roles on one server: claims from the adapter, aspects and alignment from the base.
    assert manifest["roles"]["extract"]["adapter"] == ADAPTER
    assert manifest["roles"]["judge"]["adapter"] is None
    assert manifest["roles"]["extract"]["stages"] == ["claims"]
    statuses = [r["status"] for r in records]
    assert "ok" in statuses, sorted((r["status"], r.get("failure")) for r in records)
    table = json.loads((run_dir / "icat.json").read_text())
    assert set(table["systems"]) == set(SYSTEMS)
    assert set(table["systems"]["sys1"]) >= {"s_fact", "ICAT-M", "ICAT-S", "ICAT-A"}
