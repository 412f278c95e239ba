"""Fine-tuning claim extractors: teacher data (scripted and on the tiny server, killed and
resumed), training on the tiny Llama (loss, resume after SIGKILL), registration and the checks
before serving, and the whole loop train -> register -> serve -> ICAT's claim stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.pipelines.finetune.examples import TEMPLATE, chat_example
from groundcover.pipelines.finetune.teacher import TEACHER_DATA, TeacherOptions
from groundcover.pipelines.finetune.train import TrainOptions, read_examples, train
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.serving.launch.adapters import AdapterError, register, registered
from groundcover.serving.launch.registry import lora_adapter
from tests.conftest import require_engine
from tests.support.scripted import ScriptedClient, by_text, field_of
from tests.test_runtime import run

ROOT = Path(__file__).resolve().parents[1]


def env() -> dict[str, str]:
    """Read when a test runs: the session fixture has set GROUNDCOVER_HOME by then."""
    return dict(os.environ, PYTHONPATH=str(ROOT))


# ---- teacher data (scripted) -------------------------------------------------------------------

TEACHER = {
    "topics": "- Rivers\n- Music\n",
    "entities": lambda p: by_text(
        {"Rivers": "- Danube\n- Rhine\n", "Music": "- Bach\n- Danube\n"}, field_of(p, "Topic")
    ),
    # The Danube appears under both topics with the same paragraph: one is a duplicate.
    "paragraph": lambda p: f"About {field_of(p, 'Entity')}: it is well known.",
    "claims": lambda p: by_text(
        {
            "About Danube": "- The Danube is well known.\n",
            "About Rhine": "- The Rhine is well known.\n",
            "About Bach": "None",
        },
        p,
    ),  # Bach: no claim -> filtered
}


def test_teacher_data_by_hand_and_resumed_without_calls(tmp_path):
    options = TeacherOptions(n_topics=2, entities=2, validation=0.0)
    client = ScriptedClient(TEACHER)
    outcomes = run(TEACHER_DATA, options, client, tmp_path / "data")
    assert set(outcomes) == {"topics", "examples"}
    card = json.loads((tmp_path / "data" / "data_card.json").read_text())
    # 2 topics x 2 entities = 4 paragraphs: 1 duplicate (Danube), 1 without claims (Bach).
    assert card["counts"] | {} == {
        "generated": 4,
        "duplicates": 1,
        "filtered": 1,
        "train": 2,
        "validation": 0,
        "topics_ok": 2,
        "topics_failed": 0,
    }
    rows = [
        json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()
    ]
    # Each example is exactly the conversation ICAT's claim stage sends, answered by the teacher.
    danube = next(r for r in rows if "Danube" in r["messages"][-1]["content"])
    assert danube["messages"][:-1] == TEMPLATE.messages(response="About Danube: it is well known.")
    assert danube["messages"][-1] == {
        "role": "assistant",
        "content": "- The Danube is well known.\n",
    }
    assert card["files"]["train"]["sha256"] and card["prompts"]["claims"] == TEMPLATE.id
    assert card["teacher"]["model"] == "judge"  # the teacher model, from the run's manifest
    again = ScriptedClient(TEACHER)
    run(TEACHER_DATA, options, again, tmp_path / "data")
    assert again.calls == []  # every topic recorded: nothing is asked twice


def test_validation_split_is_seeded_and_stable(tmp_path):
    options = TeacherOptions(n_topics=2, entities=2, validation=0.5, seed=3)
    run(TEACHER_DATA, options, ScriptedClient(TEACHER), tmp_path / "a")
    run(TEACHER_DATA, options, ScriptedClient(TEACHER), tmp_path / "b")
    for part in ("train", "validation"):
        assert (tmp_path / "a" / f"{part}.jsonl").read_text() == (
            tmp_path / "b" / f"{part}.jsonl"
        ).read_text()


def test_malformed_training_lines_name_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    good = chat_example("A paragraph.", ["A claim."])
    cases = [
        ({"messages": "no"}, "field messages: needs a list"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
            "field messages: must end with an assistant answer",
        ),
        (
            {"messages": [{"role": "user"}, {"role": "assistant", "content": "- c"}]},
            r"field messages\[0\]: needs role and content",
        ),
    ]
    for row, message in cases:
        path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(UserError, match=rf"train.jsonl:2: {message}"):
            read_examples(path)
    path.write_text(json.dumps(good) + "\n{broken\n")
    with pytest.raises(UserError, match="train.jsonl:2: not valid JSON"):
        read_examples(path)


# ---- registration and the checks before serving ------------------------------------------------


def fake_adapter(path: Path, base: str, rank: int = 8) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": base, "r": rank, "peft_type": "LORA"})
    )
    return path


def test_register_and_refusals(tmp_path, tiny_model):
    adapter = fake_adapter(tmp_path / "a", str(tiny_model))
    path = register("my-claims", adapter)
    assert registered("my-claims") == path
    with pytest.raises(AdapterError, match="already registered"):
        register("my-claims", adapter)
    with pytest.raises(AdapterError, match="adapter name"):
        register("../escape", adapter)
    # Served on its base (given as a path): accepted with the rank it was trained with.
    assert lora_adapter("my-claims", str(path), tiny_model.name, str(tiny_model)).rank == 8
    # Another base model: one line naming both.
    with pytest.raises(AdapterError, match="trained on .* not on the served model"):
        lora_adapter("my-claims", str(path), "Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct")
    big = fake_adapter(tmp_path / "big", str(tiny_model), rank=1024)
    with pytest.raises(AdapterError, match="rank 1024, above the server's limit"):
        lora_adapter("big", str(big), tiny_model.name, str(tiny_model))


def test_serve_finds_a_registered_adapter_by_name(tmp_path, tiny_model):
    from groundcover.pipelines.cli.options import parse_loras

    register("by-name", fake_adapter(tmp_path / "n", str(tiny_model)), replace=True)
    assert parse_loras(["by-name"]) == {"by-name": str(registered("by-name"))}
    with pytest.raises(UserError, match="NAME=PATH or a registered adapter name"):
        parse_loras(["nobody"])


def test_serve_refuses_an_adapter_of_another_base_in_one_line(tmp_path, tiny_model):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    register(
        "other-base", fake_adapter(tmp_path / "o", "meta-llama/Llama-3.1-8B-Instruct"), replace=True
    )
    result = CliRunner().invoke(
        app,
        ["serve", str(tiny_model), "--lora", "other-base", "--run-dir", str(tmp_path / "serve")],
    )
    assert result.exit_code == 2
    assert "was trained on 'meta-llama/Llama-3.1-8B-Instruct'" in result.output


# ---- training on the tiny Llama ----------------------------------------------------------------

EXAMPLES = [
    (
        "The river city has a tower. The tower is old.",
        ["The river city has a tower.", "The tower is old."],
    ),
    (
        "Water and energy come from the river.",
        ["Water comes from the river.", "Energy comes from the river."],
    ),
]


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ft") / "train.jsonl"
    path.write_text("".join(json.dumps(chat_example(p, c)) + "\n" for p, c in EXAMPLES))
    return path


def small(train_file: Path, base: Path, out: Path, **over) -> TrainOptions:
    values = {
        "data": train_file,
        "base": str(base),
        "out": out,
        "rank": 16,
        "alpha": 32,
        "learning_rate": 3e-3,
        "batch_size": 2,
        "micro_batch": 2,
        "save_steps": 5,
    }
    return TrainOptions(**(values | over))


def test_training_lowers_the_loss_and_writes_an_adapter_with_its_card(
    train_file, tiny_model, tmp_path
):
    card = train(small(train_file, tiny_model, tmp_path / "a", max_steps=30), progress=False)
    assert card["steps"] == 30 and card["examples"] == 2
    assert card["final_loss"] < 0.6 * card["first_loss"]  # stated margin: at least 40% lower
    assert (tmp_path / "a" / "adapter_config.json").is_file()
    written = json.loads((tmp_path / "a" / "card.json").read_text())
    assert written["hyperparameters"]["rank"] == 16 and written["data_sha256"]


def test_training_killed_midway_resumes_from_its_checkpoint(train_file, tiny_model, tmp_path):
    out = tmp_path / "adapter"
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "finetune",
        "claims",
        "train",
        str(train_file),
        "--base",
        str(tiny_model),
        "--out",
        str(out),
        "--rank",
        "8",
        "--alpha",
        "16",
        "--learning-rate",
        "3e-3",
        "--batch-size",
        "2",
        "--micro-batch",
        "2",
        "--max-steps",
        "400",
        "--save-steps",
        "5",
    ]
    first = subprocess.Popen(
        command, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None:
        if list((out / "checkpoints").glob("checkpoint-10/trainer_state.json")):
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert not (out / "card.json").exists(), "the kill must land before the end"
    resumed = train(
        small(train_file, tiny_model, out, rank=8, alpha=16, max_steps=400 // 20), progress=False
    )
    # The rerun continued from the newest complete checkpoint instead of step 0.
    assert resumed["resumed_from"] is not None
    start = int(resumed["resumed_from"].rsplit("-", 1)[1])
    assert start >= 10 and resumed["steps"] == max(start, 20)


# ---- the whole loop: train -> register -> serve -> ICAT's claim stage ---------------------------


@pytest.mark.engine
def test_trained_adapter_reproduces_its_training_claims_through_the_claims_stage(
    train_file, tiny_model, tmp_path
):
    require_engine()
    out = tmp_path / "extractor"
    card = train(small(train_file, tiny_model, out, max_steps=150), progress=False)
    assert card["final_loss"] < card["first_loss"]
    register("tiny-claims", out, replace=True)
    validation = tmp_path / "validation.jsonl"
    validation.write_text(train_file.read_text())
    # own server: the CLI serves the adapter this test trained (base and adapter on one server)
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "finetune",
        "claims",
        "eval",
        str(validation),
        "--extractor",
        "tiny-claims",
        "--model",
        str(tiny_model),
        "--lora",
        "tiny-claims",
        "--run-dir",
        str(tmp_path / "eval"),
        "--no-cache",
        "--quiet",
    ]
    result = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    combined = json.loads((tmp_path / "eval" / "study.json").read_text())["combined"]
    # the base run and the adapter run took turns on one server (adapters of a base share it)
    assert [p.parent.name for p in (tmp_path / "eval").rglob("serve*.log")] == ["base"]
    # Greedy decoding: the adapter gives the teacher's claims exactly; the random base does not.
    assert combined["adapter"]["micro"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert combined["base"]["micro"]["f1"] in (0.0, None)
    adapter_records = [
        json.loads(line)
        for line in (tmp_path / "eval" / "adapter" / "results.jsonl").read_text().splitlines()
    ]
    by_paragraph = {p: c for p, c in EXAMPLES}
    for record in adapter_records:
        assert record["details"]["predicted"] == record["details"]["teacher"]
        assert record["details"]["teacher"] in by_paragraph.values()


# ---- teacher data on the tiny server, killed and resumed ---------------------------------------


def test_teacher_data_on_the_tiny_server_resumes_after_sigkill(vllm_server, tmp_path):
    topics = tmp_path / "topics.txt"
    topics.write_text("".join(f"topic number {n}\n" for n in range(12)))
    run_dir = tmp_path / "data"
    command = [
        sys.executable,
        "-m",
        "groundcover",
        "finetune",
        "claims",
        "data",
        "--topics",
        str(topics),
        "--entities",
        "2",
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--max-tokens",
        "40",
        "--concurrency",
        "2",
        "--run-dir",
        str(run_dir),
        "--no-cache",
        "--quiet",
    ]
    results = run_dir / "examples" / "results.jsonl"
    first = subprocess.Popen(
        command, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None:
        if results.is_file() and results.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    done = results.read_bytes().count(b"\n")
    assert 2 <= done < 12, "the kill must land mid-run"
    second = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    ids = sorted(json.loads(line)["id"] for line in results.read_text().splitlines())
    assert ids == sorted(str(n) for n in range(1, 13))  # every topic once, none lost
    card = json.loads((run_dir / "data_card.json").read_text())
    assert card["counts"]["topics_ok"] + card["counts"]["topics_failed"] == 12
    written = sum(1 for _ in (run_dir / "train.jsonl").open()) + sum(
        1 for _ in (run_dir / "validation.jsonl").open()
    )
    assert written == card["counts"]["train"] + card["counts"]["validation"]
