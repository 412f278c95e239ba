"""Answers made by other harnesses scored without conversion by hand: an inspect_ai eval log (made
by inspect_ai's own `eval()`) and an lm-evaluation-harness samples file (its exact layout) given to
`--answers` score exactly as the same answers in the framework's own layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.answers import AnswerFile, read_answers
from groundcover.pipelines.runtime.contract.config import UserError
from tests.support.scripted import ScriptedClient, field_of
from tests.test_report_html import ITEMS, OUTPUTS
from tests.test_runtime import FANOUT, run

HARNESS = Path(__file__).parent / "fixtures" / "harness"
LM_EVAL = HARNESS / "lm-eval" / "fanoutqa-gen" / "ans__model"
SAMPLES = LM_EVAL / "samples_fanoutqa_gen_2026-11-27T05-40-00.123456.jsonl"
MULTIPLE_CHOICE = LM_EVAL / "samples_fanoutqa_mc_2026-11-27T05-40-00.123456.jsonl"
FANOUT_ANSWERS = {"f1": "Paris and Marseille.", "f2": "It opened in 1889.", "f3": ""}
# the comprehensiveness items' responses (tests/test_report_html.py), made elsewhere
ITEM_ANSWERS = {item["id"]: item["response"] for item in ITEMS}


@pytest.fixture(scope="module")
def inspect_log(tmp_path_factory) -> Path:
    """One inspect_ai log answering both frameworks' items (an answer for no item is ignored),
    each sample also carrying its id as ``sample_id`` metadata (how a GaRAGe task would)."""
    pytest.importorskip("inspect_ai", reason="inspect_ai not installed: groundcover[inspect]")
    root = tmp_path_factory.mktemp("inspect")
    given = {
        key: {"input": f"question {key}", "answer": answer, "sample_id": f"g-{key}"}
        for key, answer in (FANOUT_ANSWERS | ITEM_ANSWERS).items()
    }
    (root / "answers.json").write_text(json.dumps(given))
    script = Path(__file__).parent / "support" / "inspect_task.py"
    done = subprocess.run(
        [sys.executable, str(script), str(root / "logs"), str(root / "answers.json"), "sample_id"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1].removeprefix("file://"))


def fanout_records(tmp_path: Path, answers: Path, name: str) -> dict[str, tuple]:
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    options = FanoutOptions(input=data, answers=answers)
    outcome = run(FANOUTQA, options, ScriptedClient({}), tmp_path / name)["answers"]
    return {r.id: (r.status, r.score, r.details["metrics"]) for r in outcome.results}


def test_fanoutqa_scores_an_inspect_log_and_lm_eval_samples_as_its_own_layout(
    inspect_log, tmp_path
):
    official = tmp_path / "submission.json"  # FanOutQA's submission layout: a JSON list
    official.write_text(json.dumps([{"id": k, "answer": v} for k, v in FANOUT_ANSWERS.items()]))
    expected = fanout_records(tmp_path, official, "official")
    # loose by hand: f1 finds Paris of [Paris, Lyon], f2 finds 1889, f3 gave no answer
    assert {k: v[1] for k, v in expected.items()} == {"f1": 0.5, "f2": 1.0, "f3": 0.0}
    assert fanout_records(tmp_path, inspect_log, "inspect") == expected
    assert fanout_records(tmp_path, SAMPLES, "lm-eval") == expected


def test_comprehensiveness_scores_responses_made_elsewhere(inspect_log, tmp_path):
    def scores(items: list[dict], answers: Path | None, name: str) -> dict:
        data = tmp_path / f"items-{name}.jsonl"
        data.write_text("".join(json.dumps(i) + "\n" for i in items))
        options = ComprehensivenessOptions(
            input=data, answers=answers, method="e2e", summarise=False, export_graphs=False
        )
        client = ScriptedClient(
            {"coverage": lambda p: OUTPUTS[field_of(p, "Answer")]}, check_constraints=False
        )
        outcome = run(COMPREHENSIVENESS, options, client, tmp_path / name)[""]
        return {r.id: (r.status, r.score) for r in outcome.results}

    own = scores(ITEMS, None, "own")
    assert own == {"a": ("ok", 0.5), "b": ("ok", 1.0)}  # 1 of 2, 1 of 1 covered
    bare = [{k: v for k, v in item.items() if k != "response"} for item in ITEMS]
    as_lines = tmp_path / "responses.jsonl"
    as_lines.write_text(
        "".join(json.dumps({"id": k, "response": v}) + "\n" for k, v in ITEM_ANSWERS.items())
    )
    assert scores(bare, as_lines, "lines") == own
    assert scores(bare, inspect_log, "inspect") == own
    only_a = tmp_path / "only-a.jsonl"  # an item the answers leave out: not scored, counted
    only_a.write_text(json.dumps({"id": "a", "response": ITEM_ANSWERS["a"]}) + "\n")
    assert scores(bare, only_a, "partial") == {"a": ("ok", 0.5), "b": ("abstained", None)}


def test_ids_map_through_metadata_and_the_document_and_the_first_filter_is_read(inspect_log):
    garage = AnswerFile(id_field="sample_id")
    assert read_answers(inspect_log, garage)["g-f1"] == "Paris and Marseille."
    assert read_answers(inspect_log, AnswerFile())["f2"] == "It opened in 1889."
    # lm-eval: doc["sample_id"] absent, doc["id"] names the item; the "none" filter comes first
    # (the second filter's line for f1 says "Paris" and is not read)
    assert read_answers(SAMPLES, garage) == FANOUT_ANSWERS


def test_what_is_not_an_answer_is_one_line(tmp_path):
    with pytest.raises(UserError) as found:
        read_answers(MULTIPLE_CHOICE, AnswerFile())
    assert str(found.value) == (
        f"{MULTIPLE_CHOICE}:1: record 0: field filtered_resps: not a generation (a "
        "multiple-choice task's log-likelihoods); score a generate_until task"
    )
    pytest.importorskip("inspect_ai", reason="inspect_ai not installed")
    broken = tmp_path / "run.eval"
    broken.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(UserError, match=rf"^{broken}: not a readable inspect_ai log: "):
        read_answers(broken, AnswerFile())


def test_the_command_takes_an_lm_eval_samples_file(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    done = CliRunner().invoke(
        app,
        [
            "eval",
            "fanoutqa",
            "--data",
            str(data),
            "--answers",
            str(SAMPLES),
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
        ],
    )
    assert done.exit_code == 0, done.output
    results = (tmp_path / "run" / "answers" / "results.jsonl").read_text().splitlines()
    assert sorted((r["id"], r["score"]) for r in map(json.loads, results)) == [
        ("f1", 0.5),
        ("f2", 1.0),
        ("f3", 0.0),
    ]


# In a fresh interpreter: answers read from an inspect log inside a running event loop (as a run
# reads them) and in a thread an anyio app handed them to, then a later asyncio.run that leaves a
# task behind, as an interrupted run does.
INSIDE_A_LOOP = """
import asyncio, json, sys
from pathlib import Path
from groundcover.pipelines.runtime.store.harness_answers import inspect_rows

async def read():
    return [[key, answer] for _, key, answer in inspect_rows(Path(sys.argv[1]), "id")]

rows, left = asyncio.run(read()), []

async def read_in_a_thread():  # sniffio's context, copied into the thread, says "asyncio"
    return await asyncio.to_thread(lambda: list(inspect_rows(Path(sys.argv[1]), "id")))

import anyio
anyio.run(read_in_a_thread)

async def leave_one():
    async def forgotten():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            left.append("cancelled")
            raise
    asyncio.ensure_future(forgotten())
    await asyncio.sleep(0)

asyncio.run(leave_one())
print(json.dumps({"rows": rows, "left": left, "run": asyncio.run.__module__}))
"""


def test_an_inspect_log_read_inside_a_run_leaves_asyncio_as_it_was(inspect_log):
    """inspect_ai's reader, called where an event loop runs, patched asyncio for the whole
    process (nest_asyncio2): every later ``asyncio.run`` left its unfinished tasks running and
    its threads unwaited (a later run's interrupted server start kept serving). Read in a thread
    of its own, it patches nothing."""
    done = subprocess.run(
        [sys.executable, "-c", INSIDE_A_LOOP, str(inspect_log)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert dict(said["rows"]) == FANOUT_ANSWERS | ITEM_ANSWERS
    assert said["run"] == "asyncio.runners"  # the standard library's, not nest_asyncio2's
    assert said["left"] == ["cancelled"]  # the later run cancelled what it left
