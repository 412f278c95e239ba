"""Judges known apart: an endpoint whose model nothing identifies is known by its URL (in the
run identity and every cache key), so a panel of servers sharing one model name keeps each
member's own votes from run to run; members that are one model asked the same way are refused
before anything is written, and a self-consistency panel keeps each member's sample."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig
from groundcover.pipelines.runtime.execution.model_content import location, names_weights
from groundcover.serving.cache import ResponseCache
from groundcover.serving.client import EvalClient
from groundcover.serving.endpoints import ServedModel
from tests.support.loopback import serve_app

QUESTIONS = [
    {"id": f"q{k}", "question": f"Which year is number {k}?", "answer": str(1900 + k)}
    for k in range(6)
]
ANSWERS = [{"id": q["id"], "answer": f"It was {1900 + int(q['id'][1:])}."} for q in QUESTIONS]


class JudgeServer:
    """An OpenAI-compatible server that lists its model as ``judge`` and nothing more (as
    hosted APIs, proxies and stubs do), answering the A-F judge with its own letters: ``letters``
    by question number, or one letter per request in turn (``cycle``: a sampled judge)."""

    def __init__(self, letters: str, listing: dict | None = None, cycle: bool = False):
        self.letters, self.cycle = letters, cycle
        self.listing = listing or {"id": "judge", "object": "model"}
        self.asked = Counter()

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [self.listing]})

        async def complete(request: web.Request) -> web.Response:
            body = await request.json()
            prompt = body["messages"][-1]["content"]
            self.asked[body["model"]] += 1
            if self.cycle:
                letter = self.letters[(sum(self.asked.values()) - 1) % len(self.letters)]
            else:
                number = int(prompt.split("number ")[1].split("?")[0])
                letter = self.letters[number]
            reply = {"role": "assistant", "content": f"The facts compared.\n{letter}"}
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
                }
            )

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", complete)
        return app


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    data, answers = tmp_path / "dev.json", tmp_path / "answers.json"
    data.write_text(json.dumps(QUESTIONS))
    answers.write_text(json.dumps(ANSWERS))
    return data, answers


def eval_panel(tmp_path: Path, urls: list[str], run_dir: str, *more: str):
    data, answers = write_inputs(tmp_path)
    roles = [arg for url in urls for arg in ("--role", f"judge=judge@{url}")]
    args = ["eval", "fanoutqa", "--data", str(data), "--answers", str(answers), "--judge"]
    args += [*roles, "--run-dir", str(tmp_path / run_dir), "--quiet", *more]
    return CliRunner().invoke(app, args)


def panel_votes(run_dir: Path) -> dict[str, list]:
    lines = (run_dir / "answers" / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["id"]: r["details"]["panel"][0]["members"] for r in records}


# ---- three servers, one model name ---------------------------------------------------------

LETTERS = ("BBBBBB", "DDDDAA", "FBFBFB")


def test_a_panel_of_servers_sharing_a_name_keeps_each_members_votes(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    servers = [JudgeServer(letters) for letters in LETTERS]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(s.app())) for s in servers]
        first = eval_panel(tmp_path, urls, "first")
        assert first.exit_code == 0, first.output
        assert [sum(s.asked.values()) for s in servers] == [6, 6, 6]
        second = eval_panel(tmp_path, urls, "second")
        assert second.exit_code == 0, second.output
    # the second run asked nothing: each member was answered from its own cache rows
    assert [sum(s.asked.values()) for s in servers] == [6, 6, 6]
    votes = panel_votes(tmp_path / "first")
    assert votes == panel_votes(tmp_path / "second")
    assert votes["q0"] == ["B", "D", "F"] and votes["q1"] == ["B", "D", "B"]
    assert votes["q4"] == ["B", "A", "F"]
    # the run says how the model is known, and its identity holds each member's URL
    assert "known by its URL" in " ".join(first.output.split())
    manifest = json.loads((tmp_path / "first" / "answers" / "manifest.json").read_text())
    models = manifest["config"]["content"]["models"]
    assert len({models[r]["model"] for r in ("judge", "judge#2", "judge#3")}) == 3


def test_agreement_of_such_a_panel_is_the_members_own(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    servers = [JudgeServer(letters) for letters in LETTERS]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(s.app())) for s in servers]
        for run_dir in ("first", "second"):
            assert eval_panel(tmp_path, urls, run_dir).exit_code == 0
    alphas = []
    for run_dir in ("first", "second"):
        out = CliRunner().invoke(app, ["agreement", str(tmp_path / run_dir), "--json"])
        assert out.exit_code == 0, out.output
        alphas.append(json.loads(out.output)["runs"][0]["stages"]["judge"]["alpha"])
    assert alphas[0] == alphas[1] and alphas[0] < 0.5  # members that disagree, not alpha 1


def test_servers_that_name_their_weights_are_replicas_sharing_the_cache(tmp_path, monkeypatch):
    """Two servers whose listing names the same weights (vLLM's root) are one model: a single
    judge moved from one to the other is answered from the cache."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    listing = {"id": "judge", "root": "org/judge-8b", "max_model_len": 8192}
    servers = [JudgeServer("BBBBBB", listing), JudgeServer("DDDDDD", listing)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(s.app())) for s in servers]
        assert eval_panel(tmp_path, urls[:1], "one").exit_code == 0
        assert eval_panel(tmp_path, urls[1:], "two").exit_code == 0
        assert sum(servers[1].asked.values()) == 0  # the same weights: the cache answered
        # and as a panel at temperature 0 they are refused before anything is written
        result = eval_panel(tmp_path, urls, "panel")
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "--role judge#2: the same model as judge" in text and "temperature 0" in text
    assert "--role-revision judge#2=REVISION" in text
    assert not (tmp_path / "panel").exists()


def test_a_revision_per_member_tells_replicas_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    listing = {"id": "judge", "root": "org/judge-8b"}
    servers = [JudgeServer("BBBBBB", listing), JudgeServer("DDDDDD", listing)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(s.app())) for s in servers]
        more = ["--role-revision", "judge=team-a", "--role-revision", "judge#2=team-b"]
        result = eval_panel(tmp_path, urls, "panel", *more)
        assert result.exit_code == 0, result.output
    assert [sum(s.asked.values()) for s in servers] == [6, 6]
    assert panel_votes(tmp_path / "panel")["q0"] == ["B", "D"]
    manifest = json.loads((tmp_path / "panel" / "answers" / "manifest.json").read_text())
    assert manifest["config"]["roles"]["judge#2"]["revision"] == "team-b"
    bad = CliRunner().invoke(
        app, ["eval", "fanoutqa", "--data", "x.json", "--role-revision", "judge#2=b"]
    )
    assert bad.exit_code == 2 and "no --role judge#2 on the command line" in bad.output


def test_a_self_consistency_panel_keeps_each_sample(tmp_path, monkeypatch):
    """One server sampled at temperature 0.7 three times: each member's request carries its
    member index, so three samples are asked and kept; a second run asks nothing and records
    the same votes. At temperature 0 the same panel is refused."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    server = JudgeServer("BDA", cycle=True)
    with serve_app(server.app()) as url:
        urls = [url, url, url]
        refused = eval_panel(tmp_path, urls, "greedy")
        assert refused.exit_code == 2 and "temperature 0" in refused.output
        first = eval_panel(tmp_path, urls, "first", "--temperature", "0.7")
        assert first.exit_code == 0, first.output
        assert sum(server.asked.values()) == 18  # 6 questions x 3 samples
        second = eval_panel(tmp_path, urls, "second", "--temperature", "0.7")
        assert second.exit_code == 0, second.output
    assert sum(server.asked.values()) == 18
    votes = panel_votes(tmp_path / "first")
    assert votes == panel_votes(tmp_path / "second")
    assert all(len(set(v)) > 1 for v in votes.values())  # three samples, not one thrice


# ---- the rules, one by one -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (ServedModel("judge"), False),  # a bare listing
        (ServedModel("judge", root="judge"), False),  # the root repeats the served name
        (ServedModel("judge", root="/models/judge-ft3"), True),  # --served-model-name
        (ServedModel("Qwen/Qwen3-8B", root="Qwen/Qwen3-8B"), True),  # a hub id
        (None, False),
    ],
)
def test_which_listing_names_weights(entry, named):
    assert names_weights(entry) is named


def test_one_url_is_one_spelling():
    assert location("HTTP://Judge.example:80/v1/") == "http://judge.example:80/v1"
    assert location("https://user:pw@judge.example/v1?x=1") == "https://judge.example:443/v1"
    assert location("http://[::1]:8000/v1") == "http://[::1]:8000/v1"


async def test_a_cache_written_before_answers_an_unchanged_single_judge_once(tmp_path):
    """Rows keyed by the rules before (no revision for a model that said nothing) answer the
    first endpoint that claims them, and only that one."""
    path = tmp_path / "responses.sqlite"
    messages = [{"role": "user", "content": "Which case?"}]
    cache = ResponseCache(path)
    before = EvalClient("http://127.0.0.1:9/v1", "judge", cache=cache, max_retries=0)
    before._request = _answering("B")  # type: ignore[method-assign]
    assert (await before.chat(messages)).text == "B"
    await before.aclose()
    cache.close()
    with sqlite3.connect(path) as db:  # as the schema before this one left the file
        db.execute("UPDATE meta SET value='2' WHERE name='schema'")

    def client(url_revision: str, answer: str) -> EvalClient:
        found = EvalClient(
            "http://127.0.0.1:9/v1",
            "judge",
            cache=ResponseCache(path),
            max_retries=0,
            revisions={"judge": url_revision},
            keyed_before={"judge": None},
        )
        found._request = _answering(answer)  # type: ignore[method-assign]
        return found

    same = client("endpoint:aaaa", "asked again")
    assert (await same.chat(messages)).cached  # the same single judge: answered from before
    other = client("endpoint:bbbb", "D")
    reply = await other.chat(messages)
    assert not reply.cached and reply.text == "D"  # another server of that name: asked
    again = client("endpoint:aaaa", "asked again")
    assert (await again.chat(messages)).text == "B"  # bound to the first one
    for c in (same, other, again):
        await c.aclose()
        assert c.cache is not None
        c.cache.close()


def _answering(text: str):
    async def request(model, messages, body, usage, *, stage, template):
        return {
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }

    return request


def test_a_member_sample_is_part_of_the_key_only_when_set():
    plain = EvaluatorConfig(model="judge", endpoint="http://127.0.0.1:9/v1")
    assert plain.sample is None
    with pytest.raises(ValueError):
        EvaluatorConfig(model="judge", sample=1)  # the first member is the plain request


def test_a_run_directory_made_before_urls_counted_resumes(tmp_path, monkeypatch):
    """A run directory whose identity knew a bare-listing model by nothing (as runs made before
    this change did) resumes under the same command; its identity becomes today's."""
    from groundcover.pipelines.runtime.store.run_dir import fingerprint

    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    server = JudgeServer("BBBBBB")
    with serve_app(server.app()) as url:
        assert eval_panel(tmp_path, [url], "old").exit_code == 0
        path = tmp_path / "old" / "answers" / "manifest.json"
        manifest = json.loads(path.read_text())
        now = manifest["config_fingerprint"]
        assert manifest["config"]["content"]["models"]["judge"]["model"].startswith("endpoint:")
        manifest["config"]["content"]["models"]["judge"]["model"] = None  # as made before
        manifest["config_fingerprint"] = fingerprint(
            {"task": manifest["task"], "config": manifest["config"]}
        )
        path.write_text(json.dumps(manifest))
        resumed = eval_panel(tmp_path, [url], "old")
        assert resumed.exit_code == 0, resumed.output
        assert json.loads(path.read_text())["config_fingerprint"] == now
        # another model there is still another run
        manifest = json.loads(path.read_text())
        manifest["config"]["content"]["models"]["judge"]["model"] = "endpoint:0000"
        manifest["config_fingerprint"] = fingerprint(
            {"task": manifest["task"], "config": manifest["config"]}
        )
        path.write_text(json.dumps(manifest))
        refused = eval_panel(tmp_path, [url], "old")
        assert refused.exit_code == 2 and "changed" in refused.output
    assert sum(server.asked.values()) == 6  # resumed from its records: nothing asked again


def test_a_stage_that_fixes_temperature_0_refuses_a_self_consistency_panel():
    """CRUX rates at temperature 0 whatever the run's (the paper): one rater given twice at
    --temperature 0.7 would repeat one rating, so it is refused; FanOutQA's judge, which takes
    the run's sampling, keeps both samples (the second keyed by its member index)."""
    from groundcover.pipelines.crux.framework import CRUX
    from groundcover.pipelines.fanoutqa.framework import FANOUTQA
    from groundcover.pipelines.runtime.contract.config import UserError
    from groundcover.pipelines.runtime.execution.identity import members_apart

    content = {"base": {"revision": "sha256:abc", "source": "directory"}, "adapters": {}}
    ev = EvaluatorConfig(
        model="rater", endpoint="http://127.0.0.1:9/v1", temperature=0.7, content=content
    )
    with pytest.raises(UserError, match="crux asks rate, rate_answer at temperature 0"):
        members_apart(CRUX, {"rate": ev, "rate#2": ev})
    apart = members_apart(FANOUTQA, {"judge": ev, "judge#2": ev, "judge#3": ev})
    assert [apart[r].sample for r in ("judge", "judge#2", "judge#3")] == [None, 2, 3]
    seeded = ev.model_copy(update={"seed": 1})
    with pytest.raises(UserError, match="with --seed 1 answers the same"):
        members_apart(FANOUTQA, {"judge": seeded, "judge#2": seeded})
