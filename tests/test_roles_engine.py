"""Roles on real vLLM servers: two local base models in one invocation (one server each),
SIGKILLed and resumed with both roles kept; answers made elsewhere judged by a LoRA adapter
while no answering model is used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADAPTER, require_engine

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    {
        "id": f"q{n}",
        "question": f"Which river runs through city number {n}?",
        "answer": ["Seine", "Loire"],
        "decomposition": [],
        "categories": [],
    }
    for n in range(1, 7)
]


@pytest.fixture(scope="module")
def tiny_model_b(tmp_path_factory) -> Path:
    """A second tiny Llama with other random weights: another base model."""
    from tests.support.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models-b") / "tiny-llama-b", seed=7)


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "groundcover", *args]


def test_two_local_models_in_one_invocation_survive_a_kill(tiny_model, tiny_model_b, tmp_path):
    require_engine()
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(QUESTIONS))
    config = tmp_path / "c.yaml"  # one judge attempt per item: the random judge rarely parses
    config.write_text("fanoutqa:\n  max_reasks: 0\n")
    run_dir = tmp_path / "run"
    # own server: one server per local base model, started by the run itself, is the subject
    command = cli(
        [
            "eval",
            "fanoutqa",
            "--data",
            str(data),
            "--judge",
            "--model",
            str(tiny_model),
            "--role",
            f"judge={tiny_model_b}",
            "--max-tokens",
            "24",
            "--concurrency",
            "1",
            "--config",
            str(config),
            "--run-dir",
            str(run_dir),
            "--no-cache",
            "--quiet",
        ]
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    results = run_dir / "closed-book" / "results.jsonl"
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 600
    while count_lines(results) < 1 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.01)
    ended = first.poll()  # not None: the run ended by itself before any record (say why)
    first.send_signal(signal.SIGKILL)
    output = first.communicate(timeout=30)[0].decode(errors="replace")
    done_before = count_lines(results)
    assert 1 <= done_before < len(QUESTIONS), (
        f"the kill must land mid-run (exit {ended}):\n" + (output[-3000:])
    )

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(q["id"] for q in QUESTIONS)
    for record in records:
        assert record["status"] in {"ok", "abstained"}, record
        if record["status"] == "ok":
            assert set(record["usage"]) <= {"answer-closed-book", "judge"}
            assert "judge" in record["details"]
    manifest = json.loads((run_dir / "closed-book" / "manifest.json").read_text())
    roles = manifest["roles"]
    assert roles["answer"]["model"] == str(tiny_model)
    assert roles["judge"]["model"] == str(tiny_model_b)
    assert manifest["config"]["roles"]["judge"]["model"] == str(tiny_model_b)
    assert manifest["self_judging"] == [] and len(manifest["resumed_at"]) == 1
    # one server per base model, each with its own log
    logs = sorted(p.name for p in (run_dir / "closed-book").glob("serve-*.log"))
    assert logs == ["serve-tiny-llama-b.log", "serve-tiny-llama.log"]
    summary = json.loads((run_dir / "closed-book" / "summary.json").read_text())
    by_role = summary["usage_by_role_this_invocation"]
    assert by_role["answer"]["requests"] >= 1 and by_role["judge"]["requests"] >= 1
    assert by_role["judge"]["model"] == tiny_model_b.name  # the served name of a directory


def test_answers_made_elsewhere_judged_by_an_adapter(vllm_server, tmp_path):
    """FanOutQA and GaRAGe score given answers: only the judge (the LoRA adapter) is asked."""
    base = [
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--role",
        f"judge=:{ADAPTER}",
        "--max-tokens",
        "16",
        "--no-cache",
        "--quiet",
    ]
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(QUESTIONS[:3]))
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps(
            [
                {"id": "q1", "answer": "The Seine."},
                {"id": "q2", "answer": "The Seine and the Loire."},
            ]
        )
    )
    config = tmp_path / "c.yaml"
    config.write_text("fanoutqa:\n  max_reasks: 0\n")
    run_dir = tmp_path / "fanout"
    done = subprocess.run(
        cli(
            [
                "eval",
                "fanoutqa",
                "--data",
                str(data),
                "--answers",
                str(answers),
                "--judge",
                "--config",
                str(config),
                "--run-dir",
                str(run_dir),
                *base,
            ]
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = {
        json.loads(line)["id"]: json.loads(line)
        for line in (run_dir / "answers" / "results.jsonl").read_text().splitlines()
    }
    assert records["q1"]["score"] == 0.5 and records["q2"]["score"] == 1.0
    assert records["q3"]["status"] == "abstained" and records["q3"]["score"] == 0.0
    assert set(records["q1"]["usage"]) == {"judge"}
    manifest = json.loads((run_dir / "answers" / "manifest.json").read_text())
    assert list(manifest["roles"]) == ["judge"]
    assert manifest["roles"]["judge"]["adapter"] == ADAPTER

    garage = ROOT / "examples" / "garage.jsonl"
    g1, g2 = (json.loads(line)["sample_id"] for line in garage.read_text().splitlines())
    given = tmp_path / "garage-answers.jsonl"
    given.write_text(
        json.dumps({"sample_id": g1, "answer": "It is 330 m tall [1]."})
        + "\n"
        + json.dumps({"sample_id": g2, "answer": "Not enough grounding."})
        + "\n"
    )
    run_dir = tmp_path / "garage"
    done = subprocess.run(
        cli(
            [
                "eval",
                "garage",
                str(garage),
                "--answers",
                str(given),
                "--run-dir",
                str(run_dir),
                *base,
            ]
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted([g1, g2])
    for record in records:
        assert "answer" not in record["usage"]  # nobody answered here
        assert record["status"] in {"ok", "unparseable"}
        assert record["details"]["answer"] in {"It is 330 m tall [1].", "Not enough grounding."}
    judged = next(r for r in records if r["id"] == g1)
    assert judged["details"]["attribution"]["precision"] == 1.0  # [1] is a human citation
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert list(manifest["roles"]) == ["judge"]
    assert manifest["roles"]["judge"]["request_model"] == ADAPTER


def test_a_panel_of_the_base_model_and_its_adapter_judges_given_answers(vllm_server, tmp_path):
    """FanOutQA answers from a file judged by a panel on one real vLLM server: the tiny base
    model and its LoRA adapter. Each member is asked and accounted apart, the panel's answer
    is its rule applied to theirs, and `agreement` reads the run (with human labels)."""
    from groundcover.pipelines.fanoutqa.framework import FANOUTQA

    data = tmp_path / "dev.json"
    data.write_text(json.dumps(QUESTIONS[:3]))
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps([{"id": "q1", "answer": "The Seine."}, {"id": "q2", "answer": "Loire."}])
    )
    run_dir = tmp_path / "panel"
    done = subprocess.run(
        cli(
            [
                "eval",
                "fanoutqa",
                "--data",
                str(data),
                "--answers",
                str(answers),
                "--judge",
                "--run-dir",
                str(run_dir),
                "--endpoint",
                vllm_server.base_url,
                "--model",
                vllm_server.served_name,
                "--role",
                f"judge=:{ADAPTER}",
                "--role",
                f"judge={vllm_server.served_name}@{vllm_server.base_url}",
                "--no-cache",
                "--quiet",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = run_dir / "answers"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    judged = {r["id"]: r for r in records if r["id"] in ("q1", "q2")}
    rule = FANOUTQA.panel_rule("judge")
    assert rule is not None
    for record in judged.values():
        [entry] = record["details"]["panel"]
        assert len(entry["members"]) == 2
        given = [m for m in entry["members"] if m is not None]
        assert all(m in "ABCDEF" for m in given)
        if given:
            assert entry["value"] == rule.combine(entry["members"])[0]
        assert {"judge", "judge#2"} <= set(record["usage"])
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["roles"]["judge"]["adapter"] == ADAPTER
    assert manifest["roles"]["judge#2"]["adapter"] is None
    human = tmp_path / "human.jsonl"
    human.write_text(
        json.dumps({"id": "q1", "stage": "judge", "label": "C"})
        + "\n"
        + json.dumps({"id": "q1", "stage": "score", "label": 1.0})
        + "\n"
    )
    shown = subprocess.run(
        cli(["agreement", str(run), "--human", str(human), "--json"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    found = json.loads(shown.stdout)["runs"][0]
    assert found["stages"]["judge"]["units"] == 2 and found["score"]["labelled"] == 1
    assert "ppi" in found["score"]  # q2 and q3 are the unlabelled items


def test_an_adapter_retrained_in_place_is_asked_again(tiny_model, tmp_path):
    """The claim-extractor loop: train, evaluate, retrain in the same directory, evaluate. The
    retrained adapter is another model: the first run directory refuses to be resumed with it
    (naming the adapter, before any server starts), and the response cache, which answers every
    question of the old adapter, answers none of the new one's: a new run asks them all again.
    (What a cache miss then sends is the client's own path, ``test_cache``; one server start
    here, the old adapter's.)"""
    require_engine()
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study
    from groundcover.pipelines.runtime.execution.execute import execute
    from groundcover.serving.content import digest_path
    from tests.support.tiny import build_tiny_lora

    adapter = build_tiny_lora(tiny_model, tmp_path / "claims", seed=1)
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": q["id"], "question": q["question"]}) + "\n" for q in QUESTIONS)
    )
    cache = tmp_path / "responses.sqlite"  # this test's own, kept across the runs
    flags = {
        "evaluator.model": str(tiny_model),
        "evaluator.adapters": {ADAPTER: str(adapter)},
        "evaluator.max_tokens": 12,
        "roles.answer": f":{ADAPTER}",
        "run.cache": str(cache),
        "generate.input": str(questions),
    }

    def still_to_ask(run_dir: Path) -> tuple[int, int]:
        """(items missing, items the cache answers wholly), from a dry run (no server)."""
        request = request_from(study("generate"), None, flags | {"run.run_dir": str(run_dir)})
        (outcome,) = execute(study("generate"), request, dry_run=True, quiet=True).values()
        assert outcome.estimate is not None
        return outcome.estimate["missing"], outcome.estimate["cached_items"]

    config = tmp_path / "c.yaml"
    config.write_text(f"run:\n  cache: {cache}\n")
    command = cli(
        [
            "generate",
            str(questions),
            "--model",
            str(tiny_model),
            "--lora",
            f"{ADAPTER}={adapter}",
            "--role",
            f"answer=:{ADAPTER}",
            "--max-tokens",
            "12",
            "--run-dir",
            str(tmp_path / "a"),
            "--config",
            str(config),
            "--quiet",
        ]
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # own server: the run serves the adapter from its directory
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert still_to_ask(tmp_path / "b") == (len(QUESTIONS), len(QUESTIONS))  # all cached

    before = digest_path(adapter).sha256
    build_tiny_lora(tiny_model, adapter, seed=2)  # retrained in place
    after = digest_path(adapter).sha256
    assert after != before
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 2
    said = " ".join(resumed.stderr.split())
    assert f"model answer adapter:{before[:12]}" in said and after[:12] in said
    assert len(list((tmp_path / "a").glob("serve*.log"))) == 1  # no server started for it
    assert still_to_ask(tmp_path / "b") == (len(QUESTIONS), 0)  # none from the old weights
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["config"]["content"]["models"]["answer"]["adapter"] == f"sha256:{before}"
