"""A run judged through a calibrated cascade (``--cascade``): FanOutQA's A-F judge as two tiers,
a panel of three cheap judges, then one strong judge. The strong judge is asked exactly for the
judgements tier 1 is not confident of, the records equal those worked out by hand, a judgement no
tier keeps is recorded unjudged (never a score) and offered for labelling, a resumed run asks
nothing twice, and the calibration is part of the run's identity."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.cascade import read_cascade
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from groundcover.pipelines.runtime.store.run_dir import RESULTS, RunStoreError
from tests.support.cascades import write_calibration, write_digested
from tests.support.scripted import ScriptedClient, by_text
from tests.test_runtime import FANOUT, closing_client

URL = "http://127.0.0.1:9/v1"
ANSWERS = {"French": "Paris and Marseille.", "tower": "It opened in 1889.", "sky": ""}
# f1 (Marseille): B, B, A -> B, 2 of 3 agree; f2 (1889): C, D, E -> the declared tie D, 1 of 3;
# f3 has no answer, so no judge is asked. The strong judge says B for f1 and C for f2.
VERDICTS = {"j1": ("B", "C"), "j2": ("B", "D"), "j3": ("A", "E"), "strong": ("B", "C")}
CHEAP, STRONG = ["j1", "j2", "j3"], "strong"


def calibration(path, thresholds, models=(CHEAP, [STRONG])):
    """Tier 1 a panel of ``models[0]``, tier 2 ``models[1]``, for FanOutQA's judge."""
    tiers = [(member_names(len(models[0])), list(models[0])), (["judge"], list(models[1]))]
    return write_calibration(path, tiers, {"judge": {"thresholds": thresholds}})


def member_names(n):
    return ["judge"] + [f"judge#{k}" for k in range(2, n + 1)]


def verdict_script(first, second):
    """A judge's reasoning, then its letter: ``first`` for f1 (Marseille), else ``second``."""
    return lambda p: f"Reasoning.\n{first}" if "Marseille" in p else f"Reasoning.\n{second}"


def cascade_run(tmp_path, cascade, judges=(*CHEAP, STRONG), **how):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    clients = {"ans": ScriptedClient({"answer-closed-book": lambda p: by_text(ANSWERS, p)})}
    for name, (first, second) in VERDICTS.items():
        script = verdict_script(first, second)
        stages = member_names(4)  # the stage as each member asks it
        clients[name] = ScriptedClient({s: script for s in stages}, model=name)
    roles = parse_role_options([f"judge={j}@{URL}" for j in judges])
    request = RunRequest(
        EvaluatorConfig(model="ans", endpoint=URL),
        RunConfig(run_dir=tmp_path / "run", cache=None, cascade=cascade),
        FanoutOptions(input=data, judge=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    outcomes = execute(
        FANOUTQA,
        request,
        quiet=True,
        open_client=lambda ev, run_dir: closing_client(clients[ev.model]),
        **how,
    )
    return outcomes.get("closed-book"), clients  # a dry run has no outcome


def test_the_strong_judge_is_asked_only_what_the_panel_cannot_decide(tmp_path):
    """Thresholds 0.6 (tier 1) and 1.0 (tier 2, one member: its share is 1 when it answers):
    f1's 2/3 keeps tier 1's B; f2's 1/3 escalates, and the strong judge's C is kept."""
    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    outcome, clients = cascade_run(tmp_path, cal)
    assert [len(clients[j].calls) for j in CHEAP] == [2, 2, 2]
    assert len(clients[STRONG].calls) == 1 and "1889" in str(clients[STRONG].calls[0])
    details = {r.id: r.details for r in outcome.results}
    assert details["f1"]["judge"] == {"category": "B", "score": 1}
    assert details["f2"]["judge"] == {"category": "C", "score": 1}  # B, C, E pass (SPEC §4)
    (f1,) = details["f1"]["cascade"]
    assert (f1["kept"], f1["value"]) == (1, "B")
    assert f1["tiers"] == [
        {"tier": 1, "members": ["B", "B", "A"], "value": "B", "confidence": pytest.approx(2 / 3)}
    ]
    (f2,) = details["f2"]["cascade"]
    assert (f2["kept"], f2["value"]) == (2, "C")
    assert [t["confidence"] for t in f2["tiers"]] == [pytest.approx(1 / 3), 1.0]
    assert f2["tiers"][0]["tie"] is True and f2["tiers"][1]["members"] == ["C"]
    # the strong member asks under its own stage and role, and is accounted there
    by_role = outcome.summary.usage_by_role_this_invocation
    assert by_role["judge#4"]["calls"] == 1 and by_role["judge"]["calls"] == 2
    assert "panel" not in details["f1"]  # the cascade's record is its own


def test_a_judgement_no_tier_keeps_is_unjudged_offered_for_labels_and_resumes(tmp_path):
    """Tier 2 without a threshold (its guarantee was not attainable): f2 is abstained. Killed
    after f1's record, the resumed run asks only what was missing and ends as the whole run."""
    cal = calibration(tmp_path / "cal.json", [0.6, None])
    whole, clients = cascade_run(tmp_path / "whole", cal)
    by_id = {r.id: r for r in whole.results}
    f2 = by_id["f2"]
    # FanOutQA's judge is one metric among several: its verdict is recorded unjudged, the
    # string metrics stand, and the judge's mean leaves it out (counted), never as a 0
    assert f2.status == "ok" and f2.details["judge"]["status"] == "unjudged"
    assert "tier 1: 0.333 < 0.600; tier 2: 1.000 (no threshold)" in f2.details["judge"]["error"]
    assert f2.details["cascade"][0]["kept"] is None
    assert by_id["f1"].status == "ok" and by_id["f3"].status == "abstained"  # no answer given
    assert whole.tables["judge_unjudged"] == 1
    assert whole.tables["gpt_judge"] == pytest.approx(1 / 2)  # f1 1, f3 unanswered 0; f2 out
    assert len(clients[STRONG].calls) == 1  # asked, and still escalated (no threshold)

    # offered for labelling: the abstained judgement is a unit of the viewer's judge stage
    from groundcover.pipelines.reports.pages.viewer import Viewer

    viewer = Viewer([whole.dir])
    assert ("f2", 0, None) in viewer.units(0, "judge")
    added = viewer.add_label(0, {"id": "f2", "stage": "judge", "label": "C", "annotator": "p"})
    assert added["judge"] is None and added["label"] == "C"

    # a kill after f1 was recorded: the resume asks only f2 and f3, nothing twice
    killed, _ = cascade_run(tmp_path / "killed", cal)
    results = killed.dir / RESULTS
    lines = results.read_text().splitlines(keepends=True)
    first = next(line for line in lines if json.loads(line)["id"] == "f1")
    results.write_text(first)
    resumed, again = cascade_run(tmp_path / "killed", cal)
    assert [len(again[j].calls) for j in CHEAP] == [1, 1, 1]  # f2 only (f3 has no answer)
    assert len(again[STRONG].calls) == 1

    def comparable(outcome):
        return {r.id: (r.status, r.score, r.details) for r in outcome.results}

    assert comparable(resumed) == comparable(whole)

    # what people labelled decides the abstained judgement once the same command runs again:
    # only f2 is solved again (its tiers asked as before), and its verdict is the person's
    decided, asked = cascade_run(tmp_path / "whole", cal)
    assert [len(asked[j].calls) for j in (*CHEAP, STRONG)] == [1, 1, 1, 1]
    f2 = {r.id: r for r in decided.results}["f2"]
    assert f2.details["judge"] == {"category": "C", "score": 1}
    assert (f2.details["cascade"][0]["kept"], f2.details["cascade"][0]["value"]) == ("people", "C")
    assert decided.tables["gpt_judge"] == pytest.approx(2 / 3) and "judge_unjudged" not in (
        decided.tables
    )
    from groundcover.pipelines.reports.audits.cascade import run_cascade

    found = run_cascade(decided.dir, decided.results)["stages"]["judge"]
    assert (found["people"], found["abstained"], found["labelled"]) == (1, 0, 0)
    assert found["coverage"] == pytest.approx(1 / 2)  # a tier kept f1 only
    again, asked = cascade_run(tmp_path / "whole", cal)  # nothing left to decide: no call
    assert sum(len(c.calls) for c in asked.values()) == 0


def test_the_calibration_is_known_by_content_and_checked_against_the_roles(tmp_path, capsys):
    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    first, _ = cascade_run(tmp_path / "a", cal)
    other = calibration(tmp_path / "other.json", [0.5, 1.0])
    # the dry run knows the run as the run keeps itself: the same calibration is this run
    capsys.readouterr()
    cascade_run(tmp_path / "a", cal, dry_run=True)
    assert "holds a different run" not in capsys.readouterr().out
    cascade_run(tmp_path / "a", other, dry_run=True)
    said = " ".join(capsys.readouterr().out.split())
    assert "holds a different run" in said and "cascade.sha256" in said
    with pytest.raises(RunStoreError, match=r"changed: cascade\.sha256"):  # another calibration
        cascade_run(tmp_path / "a", other)
    assert read_cascade(cal).sha256 != read_cascade(other).sha256
    # edited after it was written: refused, naming the field
    edited = json.loads(cal.read_text())
    edited["stages"]["judge"]["thresholds"] = [0.0, 0.0]
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(UserError, match=r"edited.json: record: field 'sha256'"):
        read_cascade(tmp_path / "edited.json")
    # the role's members are the tiers, model for model
    with pytest.raises(UserError, match=r"2 tier\(s\) have 3 \+ 1 member\(s\); role judge has 3"):
        cascade_run(tmp_path / "b", cal, judges=("j1", "j2", STRONG))
    with pytest.raises(UserError, match="role judge#4 is j9, but the calibration's member"):
        cascade_run(tmp_path / "c", cal, judges=(*CHEAP, "j9"))


def test_report_json_html_and_agreement_say_what_the_cascade_kept_saved_and_abstained(tmp_path):
    """The first test's run: 2 judgements; tier 1 asked both (3 members each: 6 calls), kept f1;
    tier 2 asked f2 once and kept it. The strongest alone: 2 calls, at its tokens per call.
    A person labels f1's kept judgement B: agreement 1 of 1."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.people.labels import append_labels

    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    outcome, _ = cascade_run(tmp_path, cal)
    label = {"id": "f1", "stage": "judge", "key": 0, "label": "B", "annotator": "p"}
    append_labels(outcome.dir, [label | {"judge": "B", "source": "view"}])
    shown = CliRunner().invoke(app, ["report", str(outcome.dir), "--json"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.output.splitlines()[-1])["cascade"]
    assert found["sha256"] == read_cascade(cal).sha256 and found["tiers"] == [3, 1]
    assert (found["guaranteed_agreement"], found["confidence"]) == (0.9, 0.9)
    stage = found["stages"]["judge"]
    usage = outcome.summary.usage_by_role_this_invocation["judge#4"]
    strong_tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    assert stage | {} == stage and {k: stage[k] for k in ("asked", "kept", "calls")} == {
        "asked": [2, 1],
        "kept": [1, 1],
        "calls": [6, 1],
    }
    assert (stage["judgements"], stage["abstained"], stage["coverage"]) == (2, 0, 1.0)
    assert (stage["calls_total"], stage["calls_strongest_alone"]) == (7, 2)
    assert stage["tokens"][1] == strong_tokens
    assert stage["tokens_strongest_alone"] == 2 * strong_tokens
    assert (stage["labelled"], stage["agreeing"], stage["agreement"]) == (1, 1, 1.0)
    assert stage["agreement_ci"][1] == 1.0 and 0 < stage["agreement_ci"][0] < 1
    text = CliRunner().invoke(app, ["report", str(outcome.dir)])
    assert "kept judgements agree with people at least 90%" in text.output
    assert "7 calls against 2 for the strongest tier alone" in " ".join(text.output.split())
    agreement = CliRunner().invoke(app, ["agreement", str(outcome.dir)])
    assert "judge cascade, calibration" in agreement.output, agreement.output
    # priced: each tier's dollars from its members' tokens, the strongest alone at its own rate
    prices = tmp_path / "prices.yaml"
    prices.write_text("j1: {input: 1.0, output: 1.0}\nj2: {input: 1.0, output: 1.0}\n")
    prices.write_text(prices.read_text() + "j3: {input: 1.0, output: 1.0}\n")
    prices.write_text(prices.read_text() + "strong: {input: 10.0, output: 10.0}\n")
    priced = CliRunner().invoke(
        app, ["report", str(outcome.dir), "--json", "--prices", str(prices)]
    )
    assert priced.exit_code == 0, priced.output
    dollars = json.loads(priced.output.splitlines()[-1])["cascade"]["stages"]["judge"]
    assert dollars["cost"] == [
        pytest.approx(stage["tokens"][0] / 1e6),
        pytest.approx(10 * strong_tokens / 1e6),
    ]
    assert dollars["cost_strongest_alone"] == pytest.approx(2 * 10 * strong_tokens / 1e6)
    page = tmp_path / "page.html"
    made = CliRunner().invoke(app, ["report", str(outcome.dir), "--html", str(page)])
    assert made.exit_code == 0, made.output
    assert "<h3>Judge cascade</h3>" in page.read_text()
    argv = ["report", str(outcome.dir), "--html", str(page), "--prices", str(prices)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    alone = f"${2 * 10 * strong_tokens / 1e6:.4f}"
    assert f"against {alone}" in page.read_text()


# ---- a framework whose score is the verdict: an abstained judgement leaves the item unjudged --

ADDRESSED = """
from pydantic import BaseModel, Field

from groundcover import Framework, FrameworkOptions, InputFile, ItemContext, ItemResult
from groundcover import PromptTemplate
from groundcover.inputs import RecordId, read_jsonl
from groundcover.judges import Vote

PROMPT = PromptTemplate(
    name="addressed",
    version=1,
    user="Question: {{ question }}\\nAnswer: {{ answer }}\\nyes/partly/no?",
)
SCORES = {"yes": 1.0, "partly": 0.5, "no": 0.0}


class Item(BaseModel):
    id: RecordId
    question: str
    answer: str


class Options(FrameworkOptions):
    input: InputFile = Field(description="items JSONL: id, question, answer")
    explain: bool = Field(False, description="ask for an explanation first (free text)")


class Addressed(Framework[Options, Item]):
    name = "addressed"
    Options = Options
    prompts = {"addressed": PROMPT}
    panel_rules = {"addressed": Vote(tie="no", labels=tuple(SCORES))}

    def load(self, options: Options) -> list[Item]:
        return list(read_jsonl(options.input, Item))

    async def solve(self, item: Item, ctx: ItemContext) -> ItemResult:
        values = {"question": item.question, "answer": item.answer}
        if ctx.options.explain:  # free text of the cascaded role: the strongest tier's
            said = await ctx.chat(PROMPT.messages(**values), stage="explain")
            ctx.details["explained"] = said.text
        label = await ctx.choose(PROMPT, list(SCORES), "addressed", values)
        return ctx.result("ok", SCORES[label], label)


ADDRESSED = Addressed()
"""


# an escalation from two cheap judges to a strong one: a1 both say yes; a2 they split
ADDRESSED_ITEMS = [
    {"id": "a1", "question": "Capital of France?", "answer": "Paris."},
    {"id": "a2", "question": "Tallest mountain?", "answer": "A tall one."},
]


def addressed_inputs(tmp_path, thresholds):
    """The framework's file, its items and a calibration of tiers c1 + c2, then big."""
    framework, items = tmp_path / "addressed.py", tmp_path / "items.jsonl"
    framework.write_text(ADDRESSED)
    items.write_text("".join(json.dumps(r) + "\n" for r in ADDRESSED_ITEMS))
    tiers = [(["judge", "judge#2"], ["c1", "c2"]), (["judge"], ["big"])]
    stages = {"addressed": {"thresholds": thresholds}}
    cal = write_calibration(tmp_path / "cal.json", tiers, stages, alpha=0.2)
    return framework, items, cal


def test_an_item_whose_score_is_the_abstained_verdict_is_recorded_unjudged(tmp_path):
    """Tier 1: two cheap judges; a1 both say yes (2/2 >= 0.9: kept); a2 yes / no (1/2: the
    declared tie no, escalated). Tier 2 has no threshold: a2 is abstained, recorded unjudged
    with its stage, no score; the run's mean rests on a1 alone, and the summary counts a2."""
    from groundcover.pipelines.runtime.contract.plugins import from_file

    framework, items, cal = addressed_inputs(tmp_path, [0.9, None])
    _, fw = from_file(str(framework))
    stages = [f"{s}{k}" for s in ("addressed", "explain") for k in ("", "#2", "#3")]
    says = {"c1": "yes", "c2": None, "big": "partly"}
    clients = {}
    for name, said in says.items():
        script = (lambda p: "no" if "tall one" in p else "yes") if said is None else said
        clients[name] = ScriptedClient({s: script for s in stages}, model=name)
    roles = parse_role_options([f"judge={m}@{URL}" for m in says])
    request = RunRequest(
        EvaluatorConfig(model="c1", endpoint=URL),
        RunConfig(run_dir=tmp_path / "run", cache=None, cascade=cal),
        fw.Options(input=items, explain=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    (outcome,) = execute(
        fw, request, quiet=True, open_client=lambda ev, _: closing_client(clients[ev.model])
    ).values()
    by_id = {r.id: r for r in outcome.results}
    assert (by_id["a1"].status, by_id["a1"].score) == ("ok", 1.0)
    a2 = by_id["a2"]
    assert (a2.status, a2.score) == ("unjudged", None)
    assert a2.failure is not None and a2.failure.stage == "addressed"
    assert "tier 1: 0.500 < 0.900; tier 2: 1.000 (no threshold)" in a2.failure.error
    # big: a2's verdict, and both explanations (asked of the strongest tier, never tier 1)
    assert [len(clients[m].calls) for m in says] == [2, 2, 3]
    assert by_id["a1"].details["explained"] == "partly"  # big's script says partly
    assert outcome.summary.statuses["unjudged"] == 1 and outcome.summary.mean_score == 1.0
    # a person labels a2 "partly": the same command solves a2 again and scores the label
    from groundcover.pipelines.reports.people.labels import append_labels

    label = {"id": "a2", "stage": "addressed", "key": 0, "label": "partly", "annotator": "p"}
    append_labels(outcome.dir, [label | {"judge": None, "source": "view"}])
    (again,) = execute(
        fw, request, quiet=True, open_client=lambda ev, _: closing_client(clients[ev.model])
    ).values()
    a2 = {r.id: r for r in again.results}["a2"]
    assert (a2.status, a2.score) == ("ok", 0.5)
    assert again.summary.statuses["unjudged"] == 0
    assert again.summary.mean_score == pytest.approx(0.75)


# ---- a lone judge's own probability as its tier's confidence (--confidence logprobs) ----------


def lone_judge_reply(letter: str, probability: float):
    """The strong judge's reasoning (certain tokens), then its letter with ``probability``."""
    import math

    from tests.support.scripted import Reply

    tokens = [
        {"token": "Reasoning.\n", "logprob": 0.0},
        {"token": letter, "logprob": math.log(probability)},
    ]
    return Reply(f"Reasoning.\n{letter}", tokens)


def test_a_lone_judges_label_probability_is_recorded_calibrated_and_trusted(tmp_path):
    """The strong judge says B for f1 with probability 0.95 and C for f2 with 0.7. Recorded
    alone with --confidence logprobs, each label keeps its probability, which `cascade
    calibrate` reads as that tier's confidence. In a cascade whose tier 2 trusts it above 0.8,
    f2 (escalated by tier 1) is abstained at 0.7; above 0.6 it is kept."""
    from groundcover.pipelines.reports.audits.cascade import read_tier

    replies = {"Marseille": lone_judge_reply("B", 0.95), "1889": lone_judge_reply("C", 0.7)}

    def strong(prompt):
        return next(r for text, r in replies.items() if text in prompt)

    def run(where, cascade=None, judges=(*CHEAP, STRONG), confidence=None):
        where.mkdir(parents=True, exist_ok=True)
        data = where / "dev.json"
        data.write_text(json.dumps(FANOUT))
        clients = {"ans": ScriptedClient({"answer-closed-book": lambda p: by_text(ANSWERS, p)})}
        for name, (first, second) in VERDICTS.items():
            script = strong if name == STRONG else verdict_script(first, second)
            clients[name] = ScriptedClient({s: script for s in member_names(4)}, model=name)
        roles = parse_role_options([f"judge={j}@{URL}" for j in judges])
        request = RunRequest(
            EvaluatorConfig(model="ans", endpoint=URL),
            RunConfig(run_dir=where / "run", cache=None, cascade=cascade, confidence=confidence),
            FanoutOptions(input=data, judge=True),
            {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
        )
        opened = lambda ev, run_dir: closing_client(clients[ev.model])  # noqa: E731
        return execute(FANOUTQA, request, quiet=True, open_client=opened)["closed-book"], clients

    alone, clients = run(tmp_path / "alone", judges=(STRONG,), confidence="logprobs")
    recorded = {r.id: r.details.get("confidence") for r in alone.results}
    assert [e["confidence"] for e in recorded["f1"]] == [pytest.approx(0.95)]
    assert [(e["stage"], e["value"]) for e in recorded["f2"]] == [("judge", "C")]
    assert clients[STRONG].calls[0].body.get("logprobs") is True  # asked for them
    tier = read_tier(alone.dir, None)
    assert tier.kinds == {"judge": "logprobs"} and tier.members == ["judge"]
    # known by what it asked (the entry's digest), not by its place among the item's judgements
    assert tier.units["judge"][("f2", recorded["f2"][0]["asked"])] == ("C", pytest.approx(0.7))

    def cascade_file(name, threshold):
        made = json.loads(calibration(tmp_path / name, [0.6, threshold]).read_text())
        made["stages"]["judge"]["confidence"] = ["share", "logprobs"]
        return write_digested(tmp_path / name, made)

    strict, clients = run(tmp_path / "strict", cascade_file("strict.json", 0.8))
    f2 = {r.id: r for r in strict.results}["f2"]
    assert f2.details["judge"]["status"] == "unjudged"
    assert [t["confidence"] for t in f2.details["cascade"][0]["tiers"]] == [
        pytest.approx(1 / 3),
        pytest.approx(0.7),
    ]
    assert len(clients[STRONG].calls) == 1 and clients[STRONG].calls[0].body.get("logprobs")
    assert all("logprobs" not in c.body for j in CHEAP for c in clients[j].calls)  # shares
    lenient, _ = run(tmp_path / "lenient", cascade_file("lenient.json", 0.6))
    f2 = {r.id: r for r in lenient.results}["f2"]
    assert f2.details["judge"] == {"category": "C", "score": 1}
    assert f2.details["cascade"][0]["kept"] == 2


# ---- bought as batch jobs: an escalation is the next round --------------------------------------


def test_bought_as_batch_jobs_the_escalation_is_the_next_round_and_only_its_lines(
    tmp_path, monkeypatch
):
    """Each judge is its own Batch API. Round 1: c1 and c2 each get both items' lines; a1 they
    agree on (kept), a2 they split (1/2 < 0.9). Round 2, created only once round 1's output was
    read: big gets a2's line alone. Nothing is asked online."""
    import time

    from aiohttp import web
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from tests.support.loopback import serve_app
    from tests.test_batch import BatchServer

    says = {
        "c1": lambda p: "yes",
        "c2": lambda p: "no" if "tall one" in p else "yes",
        "big": lambda p: "partly",
    }
    seen: dict[str, list[tuple[str, float]]] = {name: [] for name in says}

    def server_of(name):
        server = BatchServer(polls=1, answer=says[name])

        @web.middleware
        async def listed(request, handler):
            seen[name].append((f"{request.method} {request.path}", time.monotonic()))
            if request.path == "/v1/models":  # the judge's own name
                return web.json_response({"object": "list", "data": [{"id": name}]})
            return await handler(request)

        made = server.app()
        made.middlewares.append(listed)
        return server, made

    framework, items, cal = addressed_inputs(tmp_path, [0.9, 1.0])
    servers = {name: server_of(name) for name in says}
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    with (
        serve_app(servers["c1"][1]) as c1,
        serve_app(servers["c2"][1]) as c2,
        serve_app(servers["big"][1]) as big,
    ):
        config = tmp_path / "cascade.yaml"
        batch = {"transport": "batch", "batch_settle": 1.0, "batch_poll": 0.05}
        roles = {"judge": [f"c1@{c1}", f"c2@{c2}", f"big@{big}"]}
        config.write_text(json.dumps({"evaluator": batch, "roles": roles}))
        argv = ["eval", str(framework), str(items), "--config", str(config), "--cascade", str(cal)]
        argv += ["--run-dir", str(tmp_path / "run"), "--quiet"]
        done = CliRunner().invoke(app, argv)
        assert done.exit_code == 0, done.output
    lines = {n: [len(b["lines"]) for b in s.batches.values()] for n, (s, _) in servers.items()}
    assert lines == {"c1": [2], "c2": [2], "big": [1]}
    (escalated,) = servers["big"][0].batches.values()
    assert "tall one" in json.dumps(escalated["lines"][0]["body"])
    assert all(s.online == 0 for s, _ in servers.values())
    created = {n: [t for what, t in seen[n] if what == "POST /v1/batches"] for n in says}
    read = {n: [t for what, t in seen[n] if what.endswith("/content")] for n in says}
    assert created["big"][0] > max(read["c1"] + read["c2"])  # round 2 after round 1 was read
    scores = {
        json.loads(x)["id"]: json.loads(x)["score"]
        for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    }
    assert scores == {"a1": 1.0, "a2": 0.5}


TWO_ANSWERS = """
from pydantic import BaseModel, Field

from groundcover import Framework, FrameworkOptions, InputFile, ItemContext, ItemResult
from groundcover import PromptTemplate
from groundcover.inputs import RecordId, read_jsonl
from groundcover.judges import Vote

PROMPT = PromptTemplate(name="capital", version=1, user="{{ question }} {{ answer }}?")


class Item(BaseModel):
    id: RecordId
    question: str
    answers: list[str]


class TwoOptions(FrameworkOptions):
    input: InputFile = Field(description="items JSONL")
    reverse: bool = Field(False, description="ask the answers last first")


class TwoAnswers(Framework[TwoOptions, Item]):
    name = "two-answers"
    Options = TwoOptions
    prompts = {"capital": PROMPT}
    panel_rules = {"capital": Vote(tie="no", labels=("yes", "no"))}

    def load(self, options):
        return list(read_jsonl(options.input, Item))

    async def solve(self, item, ctx: ItemContext) -> ItemResult:
        answers = item.answers[::-1] if ctx.options.reverse else item.answers
        said = []
        for answer in answers:  # one after the other: the order is the run's
            values = {"question": item.question, "answer": answer}
            said.append(await ctx.choose(PROMPT, ["yes", "no"], "capital", values))
        return ctx.result("ok", said.count("yes") / len(said), " ".join(said))


TWO = TwoAnswers()
"""


def test_tiers_asking_an_items_judgements_in_another_order_line_up_judgement_by_judgement(
    tmp_path,
):
    """One item, two judgements of one stage (Paris: yes, Lyon: no, say people, labelling them
    as the first run asked them). Tier 1 (c1 and c2, both always yes) asks Paris first; tier 2
    (big: yes for Paris, no for Lyon) asks Lyon first. Lined up by what each asked, big agrees
    with people on both (2 kept, 0 wrong: p = 0.5^2 = 0.25, its threshold 1.0 holds at alpha =
    delta = 0.5); lined up by place it would disagree on both."""
    from groundcover.pipelines.reports.audits.cascade import Guarantee, calibrate_runs, read_tier
    from groundcover.pipelines.reports.people.labels import append_labels
    from groundcover.pipelines.runtime.contract.plugins import from_file

    source = tmp_path / "two_answers.py"  # from a file: read_tier finds it again by its record
    source.write_text(TWO_ANSWERS)
    _, TwoAnswers = from_file(str(source))

    items = tmp_path / "items.jsonl"
    row = {"id": "x", "question": "Capital of France:", "answers": ["Paris.", "Lyon."]}
    items.write_text(json.dumps(row) + "\n")
    stages = [f"capital{k}" for k in ("", "#2")]
    scripts = {
        "c1": "yes",
        "c2": "yes",
        "big": lambda p: "yes" if "Paris" in p else "no",
    }
    clients = {m: ScriptedClient({s: v for s in stages}, model=m) for m, v in scripts.items()}

    def run(where, judges, reverse):
        fw = TwoAnswers
        roles = parse_role_options([f"judge={m}@{URL}" for m in judges])
        request = RunRequest(
            EvaluatorConfig(model=judges[0], endpoint=URL),
            RunConfig(run_dir=tmp_path / where, cache=None),
            fw.Options(input=items, reverse=reverse),
            {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
        )
        opened = lambda ev, _: closing_client(clients[ev.model])  # noqa: E731
        (outcome,) = execute(fw, request, quiet=True, open_client=opened).values()
        return outcome.dir

    # big alone is no panel: recorded as a panel of two samples would be, here two equal
    # members told apart by a revision label, so its confidence is its (whole) share
    cheap = run("cheap", ["c1", "c2"], reverse=False)
    strong = tmp_path / "strong"
    fw = TwoAnswers
    roles = {
        "judge": {"model": "big", "endpoint": URL, "revision": "sample-1"},
        "judge#2": {"model": "big", "endpoint": URL, "revision": "sample-2"},
    }
    request = RunRequest(
        EvaluatorConfig(model="big", endpoint=URL),
        RunConfig(run_dir=strong, cache=None),
        fw.Options(input=items, reverse=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    execute(fw, request, quiet=True, open_client=lambda ev, _: closing_client(clients[ev.model]))
    labels = [("yes", 0), ("no", 1)]  # as the cheap run asked them: Paris, then Lyon
    append_labels(
        cheap,
        [
            {"id": "x", "stage": "capital", "key": k, "label": v, "annotator": "p", "judge": "yes"}
            for v, k in labels
        ],
    )
    strong_panel = json.loads((strong / "results.jsonl").read_text().splitlines()[0])
    assert [e["members"] for e in strong_panel["details"]["panel"]] == [
        ["no", "no"],
        ["yes", "yes"],
    ]
    made = calibrate_runs(
        [read_tier(cheap, None), read_tier(strong, None)], Guarantee(0.5, 0.5), check_share=0
    )
    first, second = made["stages"]["capital"]["calibration"]["tiers"]
    assert (first["kept"], first["attainable"]) == (0, False)  # always yes: wrong on Lyon
    assert (second["reached"], second["kept"], second["errors"], second["threshold"]) == (
        2,
        2,
        0,
        1.0,
    )


def test_a_cascades_members_are_asked_again_against_what_each_tier_answered(tmp_path):
    """`agreement --rerun` on a cascade run (thresholds 0.6, 1.0): f1 was kept by tier 1 (B, B,
    A), so only its three members answered it; f2 went on to the strong judge (tier 1 C, D, E;
    tier 2 C). Asked again: each member that answered, against its own answer -- 3 + 4 = 7
    asks, the strong judge once (for f2 only, never for f1, which it never saw). judge#2 now
    says C on f2 (a flip of its D) and the strong judge B (a flip of its C): 2 flips of 7."""
    import asyncio

    from groundcover.pipelines.reports.audits.reask import reask_audit, recorded_judgements
    from groundcover.pipelines.reports.exports.rows import run_rows
    from tests.support.scripted import ScriptedClient

    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    outcome, _ = cascade_run(tmp_path, cal)
    rows = run_rows(outcome.dir)
    found = {r.item: r.members for r in recorded_judgements(rows)}
    assert found == {
        "f1": {"judge": "B", "judge#2": "B", "judge#3": "A"},
        "f2": {"judge": "C", "judge#2": "D", "judge#3": "E", "judge#4": "C"},
    }
    again = {
        "judge": ("B", "C"),
        "judge#2": ("B", "C"),
        "judge#3": ("A", "E"),
        "judge#4": ("X", "B"),
    }
    clients = {
        member: ScriptedClient({"judge": verdict_script(f, s)}, check_constraints=False)
        for member, (f, s) in again.items()
    }
    result = asyncio.run(reask_audit(rows, "rerun", 10, 0, clients))
    assert [len(clients[m].calls) for m in again] == [2, 2, 2, 1]
    assert "1889" in str(clients["judge#4"].calls[0])  # f2's judgement, the one it was asked
    assert (result["judgements"], result["answered"], result["flips"]) == (2, 7, 2)
    assert {m: p["flips"] for m, p in result["by_member"].items()} == {
        "judge": 0,
        "judge#2": 1,
        "judge#3": 0,
        "judge#4": 1,
    }
