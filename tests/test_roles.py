"""Model roles with scripted clients, one per role: each stage's requests reach its role's model,
scores follow the judge (not the answerer), outputs made elsewhere are scored without an
answering model, and a judge that is the answering model is said so."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.crux.framework import CRUX, CruxOptions
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.garage.framework import GARAGE, GarageOptions
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import (
    RoleSpec,
    parse_role_options,
    parse_spec,
    role_evaluator,
)
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from tests.support.scripted import ScriptedClient, by_text

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ANSWERER = "http://answerer.invalid/v1"
GRADER = "http://grader.invalid/v1"


def request_for(options, run_dir: Path, **roles: str) -> RunRequest:
    default = EvaluatorConfig(model="answerer", endpoint=ANSWERER, concurrency=2)
    specs = {role: RoleSpec.model_validate(spec) for role, spec in roles.items()}
    return RunRequest(default, RunConfig(run_dir=run_dir, cache=None), options, specs)


def run_with(study, request, clients: dict[str, ScriptedClient], opened: list[str] | None = None):
    """Run with one scripted client per model name; ``opened`` records which were opened."""

    def open_client(ev, run_dir):
        if opened is not None:
            opened.append(ev.model)
        return fixed_client(clients[ev.model])

    return execute(study, request, quiet=True, open_client=open_client)


def report_json(path: Path) -> list[dict]:
    result = CliRunner().invoke(app, ["report", str(path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


# ---- role specs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpt-oss-20b", {"model": "gpt-oss-20b", "endpoint": None, "adapter": None}),
        ("m@http://gpu:8000/v1", {"model": "m", "endpoint": "http://gpu:8000/v1", "adapter": None}),
        ("m@http://gpu:8000", {"model": "m", "endpoint": "http://gpu:8000", "adapter": None}),
        (
            "m@http://gpu:8000/v1:claims",
            {"model": "m", "endpoint": "http://gpu:8000/v1", "adapter": "claims"},
        ),
        (
            "m:claims@http://gpu/v1",
            {"model": "m:claims", "endpoint": "http://gpu/v1", "adapter": None},
        ),  # the colon is resolved by the config
        (":claims", {"adapter": "claims", "endpoint": None}),
    ],
)
def test_role_spec_grammar(text, expected):
    assert parse_spec(text) == expected


def test_role_options_are_checked():
    assert parse_role_options(["judge=m@http://x/v1"]) == {"judge": "m@http://x/v1"}
    for bad in (["judge"], ["=m"], ["judge="]):
        with pytest.raises(UserError):
            parse_role_options(bad)
    # a role given again is a judge panel (tests/test_panels.py), no longer an error
    assert parse_role_options(["judge=a", "judge=b"]) == {"judge": "a", "judge#2": "b"}
    with pytest.raises(ValueError, match="http"):
        parse_spec("m@gpu:8000")


def test_a_role_replaces_only_the_model():
    default = EvaluatorConfig(model="answerer", endpoint=ANSWERER, concurrency=7, temperature=0.3)
    judge = role_evaluator(default, RoleSpec.model_validate(f"grader@{GRADER}"))
    assert (judge.model, judge.endpoint, judge.adapter) == ("grader", GRADER, None)
    assert (judge.concurrency, judge.temperature) == (7, 0.3)  # shared settings stay
    adapter = role_evaluator(default, RoleSpec(adapter="claims"))
    assert (adapter.model, adapter.endpoint, adapter.adapter) == ("answerer", ANSWERER, "claims")
    assert role_evaluator(default, None) is default


def test_an_unknown_role_is_refused_in_one_line(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "a", "question": "Why?"}\n')
    result = CliRunner().invoke(
        app,
        [
            "generate",
            str(questions),
            "--role",
            "judge=x@http://127.0.0.1:9/v1",
            "--run-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2
    assert "--role judge: generate has the roles answer" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


# ---- FanOutQA: answerer and judge ---------------------------------------------------------------

FANOUT = [
    {
        "id": "f1",
        "question": "Which French cities host the two largest ports?",
        "answer": ["Marseille", "Le Havre"],
    },
    {"id": "f2", "question": "When did the tower open?", "answer": "1889"},
]
ANSWERS = {"French": "Marseille and Paris.", "tower": "It opened in 1887."}


def fanout_clients() -> dict[str, ScriptedClient]:
    # The answering model would grade its own answers F; the judge grades f1 B, f2 D.
    answerer = ScriptedClient(
        {"answer-closed-book": lambda p: by_text(ANSWERS, p), "judge": "Wrong.\nF"},
        model="answerer",
        check_constraints=False,
    )
    grader = ScriptedClient(
        {"judge": lambda p: "Partly right.\nB" if "Marseille" in p else "Wrong year.\nD"},
        model="grader",
        check_constraints=False,
    )
    return {"answerer": answerer, "grader": grader}


def test_fanoutqa_stages_reach_their_roles_and_the_judge_decides(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    clients = fanout_clients()
    request = request_for(
        FanoutOptions(input=data, judge=True), tmp_path / "run", judge=f"grader@{GRADER}"
    )
    outcome = run_with(FANOUTQA, request, clients)["closed-book"]
    answerer, grader = clients["answerer"], clients["grader"]
    assert [c.stage for c in answerer.calls] == ["answer-closed-book"] * 2
    assert [c.stage for c in grader.calls] == ["judge"] * 2
    assert {c.model for c in grader.calls} == {"grader"}
    assert (
        "Marseille and Paris."
        in grader.stage_calls("judge")[0].prompt + grader.stage_calls("judge")[1].prompt
    )  # the judge sees the answerer's answer
    # gpt_judge: f1 B (1), f2 D (0) -> 1/2; had the answerer judged (F, F) it would be 0.
    assert outcome.tables["gpt_judge"] == pytest.approx(0.5)
    assert outcome.tables["loose"] == pytest.approx(0.25)  # f1 finds 1 of 2, f2 none
    manifest = json.loads((outcome.dir / "manifest.json").read_text())
    assert manifest["roles"]["answer"]["request_model"] == "answerer"
    assert manifest["roles"]["judge"]["request_model"] == "grader"
    assert manifest["roles"]["judge"]["stages"] == ["judge"]
    assert manifest["self_judging"] == []
    assert manifest["config"]["model"] == "answerer"
    assert manifest["config"]["roles"]["judge"]["model"] == "grader"
    by_role = outcome.summary.usage_by_role_this_invocation
    assert (by_role["answer"]["calls"], by_role["answer"]["model"]) == (2, "answerer")
    assert (by_role["judge"]["calls"], by_role["judge"]["model"]) == (2, "grader")
    [rebuilt] = report_json(outcome.dir)
    assert rebuilt["summary"]["usage_by_role"]["judge"]["calls"] == 2
    assert rebuilt["tables"] == outcome.tables


def test_another_judge_is_another_run(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    options = FanoutOptions(input=data, judge=True)
    run_with(
        FANOUTQA, request_for(options, tmp_path / "run", judge=f"grader@{GRADER}"), fanout_clients()
    )
    with pytest.raises(Exception, match="different task or config"):
        run_with(FANOUTQA, request_for(options, tmp_path / "run"), fanout_clients())


def test_a_judge_that_is_the_answering_model_is_said_so(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    clients = fanout_clients()
    outcome = run_with(
        FANOUTQA, request_for(FanoutOptions(input=data, judge=True), tmp_path / "run"), clients
    )["closed-book"]
    assert outcome.tables["gpt_judge"] == 0.0  # the answerer judged itself: F, F
    manifest = json.loads((outcome.dir / "manifest.json").read_text())
    assert manifest["self_judging"] == [{"system": "answer", "judge": "judge", "model": "answerer"}]
    result = CliRunner().invoke(app, ["report", str(outcome.dir)], catch_exceptions=False)
    assert "self-judging: the judge role is the answer model answerer" in " ".join(
        result.output.split()
    )
    from groundcover.pipelines.reports.pages.report_html import render

    page = render([outcome.dir])
    assert "self-judging" in page and "answerer" in page


def test_fanoutqa_answers_made_elsewhere_start_no_answering_model(tmp_path, capsys):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    answers = tmp_path / "submission.json"
    answers.write_text(
        json.dumps(
            [
                {"id": "f1", "answer": "Marseille and Le Havre."},
                {"id": "nope", "answer": "not a question of ours"},
            ]
        )
    )
    clients, opened = fanout_clients(), []
    options = FanoutOptions(input=data, judge=True, answers=answers)
    request = request_for(options, tmp_path / "run", judge=f"grader@{GRADER}")
    outcomes = run_with(FANOUTQA, request, clients, opened)
    assert list(outcomes) == ["answers"] and opened == ["grader"]
    assert capsys.readouterr().out.count("FanOutQA (paper Table 1 columns)") == 1  # once, not twice
    assert clients["answerer"].calls == []
    outcome = outcomes["answers"]
    statuses = {r.id: (r.status, r.score) for r in outcome.results}
    # f2 has no answer: 0 in every column, as the official scorer counts it (not judged).
    assert statuses == {"f1": ("ok", 1.0), "f2": ("abstained", 0.0)}
    assert outcome.tables["loose"] == 0.5 and outcome.tables["strict"] == 0.5
    assert outcome.tables["gpt_judge"] == 0.5 and outcome.tables["setting"] == "answers"
    assert [c.stage for c in clients["grader"].calls] == ["judge"]
    manifest = json.loads((outcome.dir / "manifest.json").read_text())
    assert (
        list(manifest["roles"]) == ["judge"] and "answers_sha256" in manifest["config"]["options"]
    )
    # Without the judge no model at all is opened.
    opened.clear()
    plain = FanoutOptions(input=data, answers=answers)
    run_with(FANOUTQA, request_for(plain, tmp_path / "run2"), fanout_clients(), opened)
    assert opened == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # either layout is read (decided by the content): one JSON Lines record, no answer
        ('{"id": "f1"}', "answers.json:1: record 'f1': field answer: missing or not a string"),
        ('"f1"', "answers.json:1: record must be a JSON object"),
        ('[{"id": "f1"}]', "answer #0 ('f1'): field answer: missing or not a string"),
        ('[{"id": "f1", "answer": "a"}, {"id": "f1", "answer": "b"}]', "field id: duplicate"),
        ('[{"id": "x", "answer": "a"}]', "no answer's id is an item of the data file"),
    ],
)
def test_bad_fanoutqa_answers_are_one_line_and_write_nothing(tmp_path, content, message):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    answers = tmp_path / "answers.json"
    answers.write_text(content)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "fanoutqa",
            "--data",
            str(data),
            "--answers",
            str(answers),
            "--run-dir",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


# ---- GaRAGe: answers made elsewhere, one judge ------------------------------------------------


def test_garage_answers_made_elsewhere_are_judged_by_the_judge_role(tmp_path):
    records = tmp_path / "garage.jsonl"
    rows = [json.loads(line) for line in (EXAMPLES / "garage.jsonl").read_text().splitlines()]
    g1, g2 = (row["sample_id"] for row in rows)  # published rows: the id is sample_id
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        json.dumps(
            {"sample_id": g1, "answer": "It is 330 m tall [1]. It was completed in 1889 [2]."}
        )
        + "\n"
    )
    grader = ScriptedClient(
        {
            "deflection": "attempted",
            "eligibility": "No Issues",
            "support-all": "supported",
            "support-relevant": "supported",
        },
        model="grader",
    )
    opened: list[str] = []
    request = request_for(
        GarageOptions(input=records, answers=answers), tmp_path / "run", judge=f"grader@{GRADER}"
    )
    outcome = run_with(GARAGE, request, {"grader": grader}, opened)[""]
    assert opened == ["grader"]
    statuses = {r.id: (r.status, r.score) for r in outcome.results}
    assert statuses == {g1: ("ok", 1.0), g2: ("abstained", None)}  # g2: no answer given
    judged = next(r for r in outcome.results if r.id == g1)
    assert judged.details["attribution"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert outcome.tables["table2"]["RAF"] == 1.0 and outcome.tables["not_scored"] == {
        "abstained": 1
    }
    assert {c.stage for c in grader.calls} == {
        "deflection",
        "eligibility",
        "support-all",
        "support-relevant",
    }


def test_garage_reads_the_published_fields():
    from groundcover.pipelines.garage.data import Record

    record = Record.model_validate(
        {
            "id": "s1",
            "question": "q?",
            "grounding": [{"text": "a", "provider": "ent"}, {"text": "b", "provider": "web"}],
            "evidence_relevant": ["YES", "NO"],
            "evidence_cited": ["NO", "YES"],
            "question_sensitive": "No",
            "question_type": "",
            "question_complexity": "Comparison",
            "question_popularity": "Tail",
            "question_category": "Finance",
            "question_tag": "arxiv",
        }
    )
    assert record.evidence_relevant == [True, False] and record.human_citations == {2}
    assert record.dimension("time_sensitivity") == "Static"
    assert record.dimension("complexity") == "Comparison"
    assert record.dimension("popularity") == "Tail"
    assert record.dimension("domain") == "Finance" and record.dimension("source") == "Private"
    assert record.dimension("source_tag") == "arxiv"  # the finer breakdown keeps the raw tag
    fast = record.model_copy(update={"question_sensitive": "Yes", "question_type": "Fast-Changing"})
    fast.model_extra.update(question_sensitive="Yes", question_type="Fast-Changing")
    assert fast.dimension("time_sensitivity") == "Fast-Changing"
    with pytest.raises(ValueError, match="3 tags for 2 grounding passages"):
        Record.model_validate(
            {
                "id": "s",
                "question": "q",
                "grounding": [{"text": "a"}, {"text": "b"}],
                "evidence_relevant": ["YES", "NO"],
                "evidence_cited": ["YES", "NO", "NO"],
            }
        )


# ---- CRUX: a generator and a rater ---------------------------------------------------------------


def test_crux_generator_and_rater_are_different_models(tmp_path):
    topics = tmp_path / "topics.jsonl"
    topics.write_text(
        json.dumps(
            {
                "topic": "t1",
                "query": "What about the tower?",
                "questions": ["How tall?", "When built?"],
            }
        )
        + "\n"
    )
    passages = tmp_path / "passages.jsonl"
    texts = [("p1", "It is 330 m tall."), ("p2", "Built in 1889.")]
    passages.write_text(
        "".join(json.dumps({"id": i, "topic": "t1", "text": t}) + "\n" for i, t in texts)
    )
    ratings = tmp_path / "ratings.jsonl"
    ratings.write_text(
        "".join(
            json.dumps({"topic": "t1", "passage_id": p, "question": q, "rating": r}) + "\n"
            for p, q, r in [("p1", 0, 5), ("p1", 1, 0), ("p2", 0, 0), ("p2", 1, 4)]
        )
    )
    run = tmp_path / "run.trec"
    run.write_text("t1 Q0 p1 1 2.0 bm25\nt1 Q0 p2 2 1.0 bm25\n")
    writer = ScriptedClient({"answer": "The tower is 330 m tall."}, model="writer")
    # The rater finds the answer covers sub-question 0 only; the writer would rate it 5 on both.
    rater = ScriptedClient(
        {"rate_answer": lambda p: "5" if "How tall" in p else "1"}, model="rater"
    )
    options = CruxOptions(
        input=run, topics=topics, passages=passages, ratings=ratings, generate=True
    )
    request = request_for(
        options, tmp_path / "out", generate=f"writer@{ANSWERER}", rate=f"rater@{GRADER}"
    )
    [outcome] = run_with(CRUX, request, {"writer": writer, "rater": rater}).values()
    [record] = outcome.results
    assert [c.stage for c in writer.calls] == ["answer"]
    assert sorted(c.stage for c in rater.calls) == ["rate_answer", "rate_answer"]
    assert record.details["cov"] == 1.0 and record.details["cov_y"] == 0.5


# ---- ELI5: the judge of a responder's answers --------------------------------------------------


def test_eli5_says_when_the_judge_is_the_responder(tmp_path):
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import ELI5, Eli5Options

    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps(
            {"id": "q1", "query": "Where is the tower?", "contexts": ["The tower is in Paris."]}
        )
        + "\n"
    )
    coverage = "Done.\n[Covered statements]\n- The tower is in Paris. [1]\n[Uncovered statements]\n"

    def clients() -> dict[str, ScriptedClient]:
        return {
            "answerer": ScriptedClient(
                {"generate": "It is in Paris.", "coverage": coverage},
                model="answerer",
                check_constraints=False,
            ),
            "grader": ScriptedClient(
                {"coverage": coverage}, model="grader", check_constraints=False
            ),
        }

    metric = ComprehensivenessOptions(summarise=False, export_graphs=False)
    options = Eli5Options(input=questions, methods=["e2e"], metric=metric)
    run_with(ELI5, request_for(options, tmp_path / "same"), clients())
    manifest = json.loads((tmp_path / "same" / "e2e-answerer" / "manifest.json").read_text())
    assert manifest["self_judging"] == [{"system": "answer", "judge": "judge", "model": "answerer"}]
    found = clients()
    outcomes = run_with(
        ELI5, request_for(options, tmp_path / "other", judge=f"grader@{GRADER}"), found
    )
    manifest = json.loads((tmp_path / "other" / "e2e-answerer" / "manifest.json").read_text())
    assert manifest["self_judging"] == [] and manifest["roles"]["judge"]["model"] == "grader"
    assert [c.stage for c in found["grader"].calls] == ["coverage"]
    assert [c.stage for c in found["answerer"].calls] == ["generate"]
    assert outcomes["e2e-answerer"].results[0].score == 1.0


def test_other_answers_in_the_same_file_are_another_run(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    answers = tmp_path / "submission.json"
    answers.write_text(json.dumps([{"id": "f1", "answer": "Marseille."}]))
    options = FanoutOptions(input=data, answers=answers)
    run_with(FANOUTQA, request_for(options, tmp_path / "run"), fanout_clients())
    answers.write_text(json.dumps([{"id": "f1", "answer": "Le Havre."}]))
    with pytest.raises(Exception, match="different task or config"):
        run_with(FANOUTQA, request_for(options, tmp_path / "run"), fanout_clients())


# ---- one server per base for the whole invocation ----------------------------------------------


def test_lingering_servers_start_each_base_once_and_hold_one_base_at_a_time(monkeypatch, tmp_path):
    """Runs that take turns on one base (a base run, then its adapter's) share one server; a
    run on another base stops the idle one first; close stops the rest."""
    import asyncio

    from groundcover.pipelines.runtime.execution import models as evaluator

    events: list[str] = []

    class Started:
        def __init__(self, spec) -> None:
            self.name = spec.model
            self.base_url, self.adapter_prefix, self.gone = f"http://{spec.model}/v1", "", None
            events.append(f"start {spec.model} {sorted(a.name for a in spec.loras)}")

        def stop(self) -> None:
            events.append(f"stop {self.name}")

    async def start_server(spec, cfg, log):
        return Started(spec)

    monkeypatch.setattr(evaluator, "start_server", start_server)
    monkeypatch.setattr(
        evaluator, "lora_adapter", lambda n, p, base, model: type("L", (), {"name": n})()
    )
    base = EvaluatorConfig(model="org/A")  # hub ids: served here, nothing downloaded by the test
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "adapter_config.json").write_text("{}")
    tuned = EvaluatorConfig(model="org/A", adapter="x", adapters={"x": str(tmp_path / "x")})
    other = EvaluatorConfig(model="org/B")
    servers = evaluator.Servers([base, tuned, other], linger=True)

    async def turns() -> None:
        for cfg in (base, tuned, other):
            async with servers.use(cfg, tmp_path):
                events.append(f"run {cfg.model}{':' + cfg.adapter if cfg.adapter else ''}")

    asyncio.run(turns())
    servers.close()
    assert events == [
        "start org/A ['x']",
        "run org/A",
        "run org/A:x",
        "stop org/A",
        "start org/B []",
        "run org/B",
        "stop org/B",
    ]
    events.clear()
    plain = evaluator.Servers([base, tuned])  # without linger: a server stops with its last user

    async def plain_turns() -> None:
        for cfg in (base, tuned):
            async with plain.use(cfg, tmp_path):
                pass

    asyncio.run(plain_turns())
    assert events == ["start org/A ['x']", "stop org/A", "start org/A ['x']", "stop org/A"]


def test_servers_of_two_bases_start_side_by_side(monkeypatch, tmp_path):
    """The roles of a run open together: two bases' starts overlap (each waits at a barrier
    only the other can pass it through), and each stops with its last user."""
    import asyncio
    import threading

    from groundcover.pipelines.runtime.execution import models as evaluator
    from groundcover.pipelines.runtime.execution.solve import Evaluators, _open_roles, evaluator_key

    both_starting = threading.Barrier(2, timeout=20)
    events: list[str] = []

    class Started:
        def __init__(self, spec) -> None:
            self.name, self.base_url = spec.model, f"http://{spec.model}/v1"
            self.adapter_prefix, self.gone = "", None

        def stop(self) -> None:
            events.append(f"stop {self.name}")

    async def start_server(spec, cfg, log):
        await asyncio.to_thread(both_starting.wait)  # BrokenBarrierError if they take turns
        return Started(spec)

    monkeypatch.setattr(evaluator, "start_server", start_server)
    answer, judge = EvaluatorConfig(model="org/A"), EvaluatorConfig(model="org/B")
    servers = evaluator.Servers([answer, judge])

    async def open_and_close() -> dict:
        keys = [{evaluator_key(answer), evaluator_key(judge)}]
        opener = lambda ev, run_dir: open_client(ev, run_dir, servers)  # noqa: E731
        evaluators = Evaluators(opener, keys)
        try:
            clients = await _open_roles(evaluators, {"answer": answer, "judge": judge}, tmp_path)
            return {role: client.base_url for role, client in clients.items()}
        finally:
            await evaluators.aclose()

    assert asyncio.run(open_and_close()) == {
        "answer": "http://org/A/v1",
        "judge": "http://org/B/v1",
    }
    assert sorted(events) == ["stop org/A", "stop org/B"]


@pytest.mark.parametrize("goes_on", [False, True], ids=["invocation-ends", "invocation-goes-on"])
@pytest.mark.parametrize("kind", ["vllm", "ray-serve"])
def test_a_start_interrupted_by_its_run_leaves_nothing_serving(
    kind, goes_on, monkeypatch, tmp_path
):
    """A run cancelled while its server starts (in a thread it cannot stop): a vLLM server's
    process is stopped at once; a Serve app that comes up after the run has ended is stopped
    by the start's own thread. ``goes_on``: the invocation's loop runs on after the run was
    cancelled (a study's next run, say) and the start comes up meanwhile: with no run left to
    use it, it is stopped, not kept serving."""
    import asyncio
    import threading

    from groundcover.pipelines.runtime.execution import models as evaluator
    from groundcover.serving.cluster import serve_app

    release, waiting, events = threading.Event(), threading.Event(), []

    class Server:
        def __init__(self, spec, *args, **kwargs) -> None:
            self.process = "running"

        def launch(self) -> None:
            events.append("launched")

        def wait_ready(self, timeout: float = 900.0) -> None:
            waiting.set()
            while self.process and not release.wait(0.05):
                pass
            if not self.process:
                raise RuntimeError("stopped while starting")

        def start(self, timeout: float = 900.0):
            self.wait_ready(timeout)
            return self

        def stop(self) -> None:
            self.process = None
            events.append("stopped")

    monkeypatch.setattr(evaluator, "VLLMServer", Server)
    monkeypatch.setattr(serve_app, "RayReplicas", Server)
    monkeypatch.setattr(evaluator, "model_source", lambda preset: None)
    cfg = EvaluatorConfig(model="org/A", replicas=2 if kind == "ray-serve" else 1)
    servers = evaluator.Servers([cfg])

    async def interrupted() -> None:
        async def run() -> None:
            async with servers.use(cfg, tmp_path):
                events.append("used")

        task = asyncio.ensure_future(run())
        # the run is interrupted while its server is starting (waited for, not timed: a loaded
        # machine once took longer than 0.3 s to get the start under way)
        assert await asyncio.to_thread(waiting.wait, 60)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        threading.Timer(0.7, release.set).start()  # the start comes up after the run ended
        if goes_on:
            await asyncio.sleep(1.5)  # the start comes up meanwhile
            assert "stopped" in events and not servers.running and not servers.starting

    asyncio.run(interrupted())  # ends when the start's thread has
    assert "used" not in events and events.count("stopped") == 1 and not servers.running
    if kind == "vllm":
        assert events == ["launched", "stopped"]


# A process in vLLM's place for the launcher: binds its port as vLLM does (SO_REUSEADDR),
# then answers the health check.
HEALTH_ONLY = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer.allow_reuse_address = True
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_run_starts_its_server_elsewhere_when_the_chosen_port_is_taken(monkeypatch, tmp_path):
    """The port chosen for a run's server is taken before the server binds it (by an outgoing
    connection, say): the run launches it again on another port instead of failing."""
    import asyncio
    import socket
    import sys

    from groundcover.pipelines.runtime.execution import models as evaluator
    from groundcover.serving.launch.server import ServerSpec, VLLMServer

    holders: list[socket.socket] = []

    class Server(VLLMServer):
        def __init__(self, spec, log) -> None:
            super().__init__(spec, log)
            holders.append(socket.socket())  # bound, not listening: launch() sees it free
            holders[0].bind(("127.0.0.1", self.port))

        def command(self) -> list[str]:
            return [sys.executable, "-c", HEALTH_ONLY, str(self.port)]

    monkeypatch.setattr(evaluator, "VLLMServer", Server)
    monkeypatch.setattr(evaluator, "model_source", lambda preset: None)
    log = tmp_path / "serve.log"
    server = asyncio.run(
        evaluator.start_server(ServerSpec(model="embedded"), EvaluatorConfig(model="embedded"), log)
    )
    try:
        taken = holders[0].getsockname()[1]
        assert server.port != taken and server.port_moves == 1
        assert log.read_text().count("Address already in use") == 1  # the first launch's
    finally:
        server.stop()
        holders[0].close()


def test_a_server_failing_otherwise_is_not_moved_for_an_earlier_launchs_taken_port(tmp_path):
    """The log keeps every launch: only this launch's lines say whether its port was taken."""
    import sys

    from groundcover.serving.launch.server import (
        PortTaken,
        ServerSpec,
        ServerStartError,
        VLLMServer,
    )

    class Failing(VLLMServer):
        def command(self) -> list[str]:
            return [sys.executable, "-c", "raise SystemExit('no model here')"]

    log = tmp_path / "serve.log"
    log.write_text("OSError: [Errno 98] Address already in use\n")  # an earlier launch's
    server = Failing(ServerSpec(model="embedded"), log)
    with pytest.raises(ServerStartError, match="no model here") as raised:
        server.start(timeout=60)
    assert not isinstance(raised.value, PortTaken) and server.port_moves == 0


@contextlib.asynccontextmanager
async def open_client(cfg, run_dir, servers):
    """A client's place in the pool without a client: the served address is enough here."""
    async with servers.use(cfg, run_dir) as served:
        yield type("Opened", (), {"base_url": served.base_url})()
