"""Judge calls bought as batch jobs: a run with ``transport: batch`` completes in rounds against
a loopback Batch API (file upload, batch create / retrieve, output and error files, a few
``in_progress`` polls, an ``expired`` batch, failed lines), equal to the online run on the same
server; a run killed while its batch is pending resumes it without submitting anything twice;
``vllm run-batch`` on the tiny model gives the served model's answers at temperature 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from tests.support.loopback import serve_app

ROOT = Path(__file__).resolve().parents[1]

# A framework of two stages, the second reading the first's answer: its calls come in two
# rounds (a stage's requests exist only once the previous stage has answered).
FRAMEWORK = '''
from pydantic import BaseModel, Field

from groundcover import Framework, FrameworkOptions, InputFile, ItemContext, ItemResult
from groundcover import PromptTemplate
from groundcover.inputs import RecordId, read_jsonl

DRAFT = PromptTemplate(name="draft", version=1, user="Summarise: {{ text }}")
RATE = PromptTemplate(
    name="rate", version=1, user="Text: {{ text }}\\nSummary: {{ summary }}\\nRate 1-5."
)


class Item(BaseModel):
    id: RecordId
    text: str


class Options(FrameworkOptions):
    input: InputFile = Field(description="items JSONL: id, text")


class TwoStages(Framework[Options, Item]):
    """A summary, then its rating."""

    name = "two-stages"
    Options = Options
    prompts = {"draft": DRAFT, "rate": RATE}

    def load(self, options: Options) -> list[Item]:
        return list(read_jsonl(options.input, Item))

    async def solve(self, item: Item, ctx: ItemContext) -> ItemResult:
        values = {"text": item.text}
        summary = (await ctx.ask(DRAFT, "draft", str.strip, "a summary", values)).value
        rating = await ctx.choose(RATE, list("12345"), "rate", values | {"summary": summary})
        ctx.details["summary"] = summary
        return ctx.result("ok", int(rating) / 5, f"rated {rating}")


TWO_STAGES = TwoStages()
'''

TEXTS = [f"Item {k} says that {' '.join(['word'] * (k + 1))} happened." for k in range(6)]


def answer_of(prompt: str) -> str:
    """The stub model: a summary of the text's first three words, a rating from its length."""
    if prompt.startswith("Summarise: "):
        return "S: " + " ".join(prompt.removeprefix("Summarise: ").split()[:3])
    summary = prompt.split("Summary: ")[1].split("\n")[0]
    return str(len(summary) % 5 + 1)


def completion(body: dict[str, Any], answer: Any = answer_of) -> dict[str, Any]:
    reply = {"role": "assistant", "content": answer(body["messages"][-1]["content"])}
    return {
        "id": "c",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
    }


class BatchServer:
    """An OpenAI-compatible server with a Batch API. Each created batch answers ``in_progress``
    for ``polls`` polls (forever while ``hold``), then ends as its entry of ``outcomes`` says
    (``ok``, ``expire``, ``fail:K``: its first K lines in the error file; ``ok`` once the list
    is used up). ``submitted`` counts each custom id submitted."""

    def __init__(self, polls: int = 2, outcomes: list[str] | None = None, answer: Any = answer_of):
        self.polls, self.outcomes = polls, list(outcomes or [])
        self.answer = answer  # the stub model: a prompt's answer
        self.hold = False
        self.files: dict[str, str] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.submitted: Counter[str] = Counter()
        self.online = 0
        self.sticky: set[str] | None = None  # a set: a line that failed once always fails

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "judge"}]})

        async def chat(request: web.Request) -> web.Response:
            self.online += 1
            return web.json_response(completion(await request.json(), self.answer))

        async def upload(request: web.Request) -> web.Response:
            form = await request.post()
            assert form["purpose"] == "batch"
            file_id = f"file-{len(self.files)}"
            self.files[file_id] = form["file"].file.read().decode()  # type: ignore[union-attr]
            return web.json_response({"id": file_id, "object": "file", "purpose": "batch"})

        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            assert body["endpoint"] == "/v1/chat/completions"
            lines = [json.loads(x) for x in self.files[body["input_file_id"]].splitlines()]
            assert all(line["url"] == "/v1/chat/completions" for line in lines)
            self.submitted.update(line["custom_id"] for line in lines)
            batch_id = f"batch-{len(self.batches)}"
            outcome = self.outcomes.pop(0) if self.outcomes else "ok"
            self.batches[batch_id] = {"lines": lines, "polls": self.polls, "outcome": outcome}
            return web.json_response({"id": batch_id, "object": "batch", "status": "validating"})

        async def retrieve(request: web.Request) -> web.Response:
            batch_id = request.match_info["id"]
            batch = self.batches[batch_id]
            if self.hold or batch["polls"] > 0:
                batch["polls"] -= 1
                return web.json_response({"id": batch_id, "status": "in_progress"})
            return web.json_response(self._finish(batch_id, batch))

        async def content(request: web.Request) -> web.Response:
            return web.Response(text=self.files[request.match_info["id"]])

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/files", upload)
        app.router.add_post("/v1/batches", create)
        app.router.add_get("/v1/batches/{id}", retrieve)
        app.router.add_get("/v1/files/{id}/content", content)
        return app

    def _finish(self, batch_id: str, batch: dict[str, Any]) -> dict[str, Any]:
        outcome, lines = batch["outcome"], batch["lines"]
        if outcome == "expire":
            return {"id": batch_id, "status": "expired", "output_file_id": None}
        failing = int(outcome.split(":")[1]) if outcome.startswith("fail:") else 0
        if self.sticky is not None:  # the lines that failed before first, failing again
            self.sticky |= {line["custom_id"] for line in lines[:failing]}
            lines = sorted(lines, key=lambda line: line["custom_id"] not in self.sticky)
            failing = sum(line["custom_id"] in self.sticky for line in lines)
        output = [
            {
                "id": f"r{n}",
                "custom_id": line["custom_id"],
                "response": {"status_code": 200, "body": completion(line["body"], self.answer)},
                "error": None,
            }
            for n, line in enumerate(lines[failing:])
        ]
        errors = [
            {
                "id": f"e{n}",
                "custom_id": line["custom_id"],
                "response": None,
                "error": {"code": "server_error", "message": "the line failed"},
            }
            for n, line in enumerate(lines[:failing])
        ]
        out_id, err_id = f"file-out-{batch_id}", f"file-err-{batch_id}"
        self.files[out_id] = "".join(json.dumps(row) + "\n" for row in output)
        self.files[err_id] = "".join(json.dumps(row) + "\n" for row in errors)
        return {
            "id": batch_id,
            "status": "completed",
            "output_file_id": out_id,
            "error_file_id": err_id if errors else None,
            "request_counts": {"total": len(lines), "failed": failing},
        }


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    framework, items = tmp_path / "two_stages.py", tmp_path / "items.jsonl"
    framework.write_text(FRAMEWORK)
    items.write_text(
        "".join(json.dumps({"id": f"i{k}", "text": t}) + "\n" for k, t in enumerate(TEXTS))
    )
    return framework, items


def write_config(tmp_path: Path, **evaluator: Any) -> Path:
    config = tmp_path / "batch.yaml"
    # a round closes 1 s after its last call: wide enough for a loaded machine to let every item
    # of a stage ask before its round goes (the tests count rounds)
    fields = {"transport": "batch", "batch_settle": 1.0, "batch_poll": 0.05} | evaluator
    config.write_text(json.dumps({"evaluator": fields}))  # JSON is YAML
    return config


def eval_args(tmp_path: Path, url: str, run_dir: str, *more: str) -> list[str]:
    framework, items = write_inputs(tmp_path)
    return [
        "eval", str(framework), str(items), "--model", "judge", "--endpoint", url,
        "--run-dir", str(tmp_path / run_dir), "--quiet", *more,
    ]  # fmt: skip


def records(run_dir: Path) -> dict[str, tuple[Any, Any]]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return {r["id"]: (r["score"], r["details"]["summary"]) for r in rows}


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def online_records(tmp_path: Path, monkeypatch, url: str) -> dict[str, tuple[Any, Any]]:
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-online"))
    done = CliRunner().invoke(app, eval_args(tmp_path, url, "online"))
    assert done.exit_code == 0, done.output
    return records(tmp_path / "online")


def test_a_batch_run_goes_in_rounds_and_equals_the_online_run(tmp_path, monkeypatch):
    server = BatchServer(polls=2)
    with serve_app(server.app()) as url:
        online = online_records(tmp_path, monkeypatch, url)
        asked_online = server.online
        monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
        args = eval_args(tmp_path, url, "batch", "--config", str(write_config(tmp_path)))
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
    assert asked_online == 12 and server.online == 12  # the batch run asked nothing online
    assert records(tmp_path / "batch") == online
    # two rounds, one per stage: every item's summary, then every item's rating
    assert [len(b["lines"]) for b in server.batches.values()] == [6, 6]
    assert set(server.submitted.values()) == {1}
    rounds = summary(tmp_path / "batch")["batches_this_invocation"]["judge"]
    assert rounds["rounds"] == 2 and rounds["submitted"] == 12 and rounds["answered"] == 12
    assert [b["batch"] for b in rounds["batches"]] == ["batch-0", "batch-1"]
    assert all(b["status"] == "completed" and b["waited_s"] > 0 for b in rounds["batches"])
    # each file's upload (its id, tag and custom ids) was recorded before its batch was
    # created, and each batch before the run waited on it
    ledger = sorted((tmp_path / "batch" / "batches").glob("*/ledger.jsonl"))
    events = [json.loads(x) for x in ledger[0].read_text().splitlines()]
    kinds = ["uploaded", "submitted", "finished"]
    assert [e["event"] for e in events] == kinds + kinds
    assert events[0]["tag"] == events[1]["tag"] and events[0]["file_id"] == events[1]["file_id"]
    assert sorted(events[1]["custom_ids"] + events[4]["custom_ids"]) == sorted(server.submitted)
    # report and its page read the ledgers: rounds, batch ids, waits
    shown = CliRunner().invoke(app, ["report", str(tmp_path / "batch")])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert "batch jobs: 2 rounds, 2 batches, 12 lines (0 failed and asked again)" in said
    page = tmp_path / "page.html"
    html = CliRunner().invoke(app, ["report", str(tmp_path / "batch"), "--html", str(page)])
    assert html.exit_code == 0, html.output
    text = page.read_text()
    assert "<h3>Batch jobs</h3>" in text and "batch-0" in text and "batch-1" in text


def test_expired_batches_and_failed_lines_go_into_the_next_round(tmp_path, monkeypatch):
    # the first summary batch expires, its retry loses two lines, the ratings come back whole
    server = BatchServer(polls=1, outcomes=["expire", "fail:2"])
    with serve_app(server.app()) as url:
        online = online_records(tmp_path, monkeypatch, url)
        monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
        args = eval_args(tmp_path, url, "batch", "--config", str(write_config(tmp_path)))
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == online
    # round 3: the two failed summaries beside the four ratings their siblings' answers let
    # through; round 4: the last two ratings
    assert [len(b["lines"]) for b in server.batches.values()] == [6, 6, 6, 2]
    rounds = summary(tmp_path / "batch")["batches_this_invocation"]["judge"]
    assert rounds["requeued"] == 6 + 2 and rounds["failed"] == 0
    # by cause: the expired batch's 6 lines, the 2 error lines of the next (a 5xx)
    assert rounds["causes"] == {"expired": 6, "retried": 2}
    shown = CliRunner().invoke(app, ["report", str(tmp_path / "batch")])
    assert "unanswered lines: expired 6, retried 2" in " ".join(shown.output.split())
    assert [b["status"] for b in rounds["batches"]][:2] == ["expired", "completed"]
    assert [b["failed"] for b in rounds["batches"]] == [6, 2, 0, 0]
    # the provider's error lines are kept, per call
    kept = (tmp_path / "batch" / "batches").glob("*/*.errors.jsonl")
    errors = [json.loads(x) for f in kept for x in f.read_text().splitlines()]
    assert len(errors) == 2 and errors[0]["error"]["message"] == "the line failed"


def test_failed_lines_asked_online_by_a_flag(tmp_path, monkeypatch):
    """``--batch-retry online``: the two lines that fail in the summaries' batch are asked
    again online at once (two more online calls), not in a round of their own; their items go
    on with their siblings, so the ratings are one round of six."""
    server = BatchServer(polls=0, outcomes=["fail:2"])
    with serve_app(server.app()) as url:
        online = online_records(tmp_path, monkeypatch, url)
        asked_online = server.online
        monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
        config = write_config(tmp_path)
        args = [*eval_args(tmp_path, url, "batch"), "--config", str(config)]
        prices = tmp_path / "prices.yaml"
        prices.write_text("judge: {input: 2.0, output: 8.0, batch_input: 1.0, batch_output: 4.0}")
        done = CliRunner().invoke(app, [*args, "--batch-retry", "online", "--prices", str(prices)])
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == online
    assert server.online == asked_online + 2
    # by hand: 12 calls of 20 prompt and 4 completion tokens; the 2 asked online at the online
    # price (20 * 2 + 4 * 8 each), the 10 answered by batches at the batch price (20 + 4 * 4)
    cost = summary(tmp_path / "batch")["cost_this_invocation"]
    assert cost["total"] == pytest.approx((2 * (20 * 2 + 4 * 8) + 10 * (20 * 1 + 4 * 4)) / 1e6)
    assert cost["online"] == pytest.approx(12 * (20 * 2 + 4 * 8) / 1e6)
    assert [len(b["lines"]) for b in server.batches.values()] == [6, 6]
    rounds = summary(tmp_path / "batch")["batches_this_invocation"]["judge"]
    assert rounds["online"] == 2 and rounds["requeued"] == 0 and rounds["failed"] == 0
    here = ["--model", "embedded", "--transport", "batch", "--batch-retry", "online"]
    refused = CliRunner().invoke(app, ["eval", *args[1:3], *here, "--run-dir", str(tmp_path)])
    assert refused.exit_code == 2 and "needs an --endpoint" in refused.output


def test_a_line_that_keeps_failing_fails_its_item_and_the_run_exits_non_zero(tmp_path, monkeypatch):
    server = BatchServer(polls=0, outcomes=["fail:1"])
    server.sticky = set()  # the line fails in every batch it is sent in
    with serve_app(server.app()) as url:
        monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
        config = write_config(tmp_path, max_retries=3)
        done = CliRunner().invoke(app, eval_args(tmp_path, url, "batch", "--config", str(config)))
    assert done.exit_code != 0
    rows = [json.loads(x) for x in (tmp_path / "batch" / "results.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r["status"] != "ok"]
    assert len(failed) == 1 and "batch line failed 3 times" in json.dumps(failed[0])
    assert summary(tmp_path / "batch")["batches_this_invocation"]["judge"]["failed"] == 1


def test_a_run_killed_while_its_batch_is_pending_resumes_it_and_submits_nothing_twice(
    tmp_path, monkeypatch
):
    server = BatchServer(polls=1)
    with serve_app(server.app()) as url:
        online = online_records(tmp_path, monkeypatch, url)
        config = write_config(tmp_path)
        command = [sys.executable, "-m", "groundcover", *eval_args(tmp_path, url, "batch")]
        command += ["--config", str(config)]
        env = os.environ | {"GROUNDCOVER_HOME": str(tmp_path / "home-batch")}
        server.hold = True  # the first batch stays in progress
        run = subprocess.Popen(command, env=env, cwd=tmp_path, start_new_session=True)
        ledger = tmp_path / "batch" / "batches"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            "submitted" in f.read_text() for f in ledger.glob("*/ledger.jsonl")
        ):
            assert run.poll() is None, "the run ended before its batch was recorded"
            time.sleep(0.1)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
        (ledger_folder,) = [f.name for f in ledger.iterdir()]
        assert len(server.batches) == 1
        server.hold = False
        # resumed with other transport settings: concurrency, timeout, retries, the key's
        # variable and the URL's spelling decide no answer, so the same batches are polled
        (tmp_path / "other").mkdir()
        other = write_config(tmp_path / "other", timeout=123.0, max_retries=5)
        again = [sys.executable, "-m", "groundcover", *eval_args(tmp_path, url + "/", "batch")]
        again += ["--config", str(other), "--concurrency", "3", "--api-key-env", "OTHER_KEY"]
        resumed = subprocess.run(again, env=env, cwd=tmp_path, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr
    assert [f.name for f in (tmp_path / "batch" / "batches").iterdir()] == [ledger_folder]
    assert records(tmp_path / "batch") == online
    # the pending batch was waited for again, not submitted again: each request once
    assert len(server.batches) == 2 and set(server.submitted.values()) == {1}
    assert len(server.submitted) == 12
    rounds = summary(tmp_path / "batch")["batches_this_invocation"]["judge"]
    assert rounds["resumed"] == 1 and rounds["submitted"] == 6


def test_drivers_buy_their_own_batches_and_a_resume_with_fewer_adopts_them(tmp_path):
    """``--drivers 2`` with a batch judge: each driver's calls go into its own batches, its own
    ledger (``batches/<client>-d0``, ``-d1``). Killed while both drivers' batches are pending,
    the run resumes with one driver, which waits for both (the folders of drivers gone from
    this invocation are adopted): every request submitted once, the records equal the online
    run's. FanOutQA judged answers (a registered framework: drivers rebuild it by name)."""
    from tests.test_drivers import fanoutqa_inputs, judge_letter, records_of, wait_for

    dev, answers = fanoutqa_inputs(tmp_path)
    server = BatchServer(polls=1, answer=lambda p: f"Compared.\n{judge_letter(p)}")
    config = write_config(tmp_path)
    env = os.environ | {"GROUNDCOVER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}

    def command(run: str, *more: str) -> list[str]:
        return [
            *[sys.executable, "-m", "groundcover", "eval", "fanoutqa", "--data", str(dev)],
            *["--answers", str(answers), "--judge", "--endpoint", server.url, "--model"],
            *["judge", "--run-dir", str(tmp_path / run), "--quiet", *more],
        ]

    with serve_app(server.app()) as server.url:
        online = subprocess.run(command("online"), env=env, capture_output=True, text=True)
        assert online.returncode == 0, online.stderr[-3000:]
        batch = [*command("batch", "--config", str(config)), "--no-cache"]
        server.hold = True  # every batch stays in progress
        run = subprocess.Popen(
            [*batch, "--drivers", "2"], env=env, cwd=tmp_path, start_new_session=True
        )
        folders = tmp_path / "batch" / "answers" / "batches"
        deadline = time.monotonic() + 300
        while sum("submitted" in f.read_text() for f in folders.glob("*-d*/ledger.jsonl")) < 2:
            assert run.poll() is None, "the run ended before both drivers' batches were recorded"
            assert time.monotonic() < deadline, "no batch from each driver"
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGKILL)  # the command, and with it its drivers
        run.wait(30)
        # the drivers go with their owner once Ray sees it gone (a few seconds): until then
        # a live driver would collect its own batch
        home = f"GROUNDCOVER_HOME={env['GROUNDCOVER_HOME']}".encode()
        wait_for(lambda: not processes_with(home), 120, "the drivers to end")
        ours = {f.name.rsplit("-", 1)[1] for f in folders.iterdir()}
        assert ours == {"d0", "d1"}
        assert len(server.batches) == 2  # one per driver, each its shard's items
        server.hold = False
        resumed = subprocess.run(batch, env=env, cwd=tmp_path, capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records_of(tmp_path / "batch" / "answers") == records_of(tmp_path / "online" / "answers")
    assert set(server.submitted.values()) == {1} and len(server.submitted) == 24
    assert len(server.batches) == 2  # the resume bought nothing: both pending batches answered
    rounds = summary(tmp_path / "batch" / "answers")["batches_this_invocation"]["judge"]
    assert rounds["resumed"] == 2 and rounds["submitted"] == 0


def processes_with(mark: bytes) -> list[int]:
    """Processes with ``mark`` in their environment (what the command and its Ray inherit)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.engine
def test_vllm_run_batch_gives_the_served_answers_at_temperature_0(
    tmp_path, monkeypatch, vllm_server, tiny_model
):
    """The tiny model through ``vllm run-batch`` (no server started) and through the session's
    server: the same answers (temperature 0, the same chat template and budget)."""
    items = tmp_path / "items.jsonl"
    rows = [{"id": f"q{k}", "question": f"What about {w}?"} for k, w in enumerate("abc")]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["generate", str(items), "--max-tokens", "8", "--quiet"]
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-served"))
    served = CliRunner().invoke(
        app,
        [*common, "--model", vllm_server.served_name, "--endpoint", vllm_server.base_url,
         "--run-dir", str(tmp_path / "served")],
    )  # fmt: skip
    assert served.exit_code == 0, served.output
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
    config = write_config(tmp_path, batch_poll=0.5)
    batched = CliRunner().invoke(
        app,
        [*common, "--model", str(tiny_model), "--run-dir", str(tmp_path / "batch"),
         "--config", str(config)],
    )  # fmt: skip
    assert batched.exit_code == 0, batched.output

    def answers(run_dir: Path) -> dict[str, str]:
        lines = (run_dir / "results.jsonl").read_text().splitlines()
        return {r["id"]: r["details"]["response"] for r in map(json.loads, lines)}

    assert answers(tmp_path / "batch") == answers(tmp_path / "served")
    assert not (tmp_path / "batch" / "serve.log").exists()  # no server was started
    rounds = summary(tmp_path / "batch")["batches_this_invocation"]
    (only,) = rounds.values()
    assert only["rounds"] == 1 and only["batches"][0]["batch"].startswith("local-")


def test_batch_prices_in_the_cost_and_the_dry_run_says_rounds_and_saving(tmp_path, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text("judge: {input: 2.0, output: 8.0, batch_input: 1.0, batch_output: 4.0}\n")
    server = BatchServer(polls=0)
    with serve_app(server.app()) as url:
        monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home-batch"))
        config = ["--config", str(write_config(tmp_path)), "--prices", str(prices)]
        done = CliRunner().invoke(app, eval_args(tmp_path, url, "batch", *config))
        assert done.exit_code == 0, done.output
        # 12 calls of 20 prompt and 4 completion tokens: 240 and 48 tokens, by hand
        cost = summary(tmp_path / "batch")["cost_this_invocation"]
        assert cost["total"] == pytest.approx((240 * 1.0 + 48 * 4.0) / 1e6)
        assert cost["online"] == pytest.approx((240 * 2.0 + 48 * 8.0) / 1e6)
        assert cost["saving"] == pytest.approx(cost["online"] - cost["total"])
        # a plan of another run: two items solved for real, the rest estimated
        args = eval_args(tmp_path, url, "planned", *config, "--pilot", "2")
        planned = CliRunner().invoke(app, args)
        assert planned.exit_code == 0, planned.output
    said = " ".join(planned.output.split())
    assert "batch rounds: at least 2" in said
    assert "as batch jobs: $" in said and "online (saving $" in said


def test_which_batch_folders_a_driver_adopts(tmp_path):
    """A driver waits for the pending batches of the folders whose drivers are gone from this
    invocation (K >= N by K mod N; the one-driver folder by driver 0; with one driver every
    -dK folder); the live drivers' folders are siblings (their finished outputs answer)."""
    from groundcover.pipelines.runtime.execution.models import batch_folders

    base = tmp_path / "batches" / "judge-0123456789"
    for name in ("", "-d0", "-d1", "-d2", "-d3", "-dx"):
        (base.parent / f"{base.name}{name}").mkdir(parents=True, exist_ok=True)
    names = lambda folders: [f.name.removeprefix(base.name) or "base" for f in folders]  # noqa: E731
    own, adopt, siblings = batch_folders(base, 0, 1)
    assert own == base and names(adopt) == ["-d0", "-d1", "-d2", "-d3"] and not siblings
    own, adopt, siblings = batch_folders(base, 0, 2)
    assert own.name.endswith("-d0") and names(adopt) == ["base", "-d2"]
    assert names(siblings) == ["-d1", "-d3"]
    own, adopt, siblings = batch_folders(base, 1, 2)
    assert own.name.endswith("-d1") and names(adopt) == ["-d3"]
    assert names(siblings) == ["base", "-d0", "-d2"]
