"""A judge's reliability measured, each number worked out by hand: self-consistency (recorded
judgements asked again of the same judge, the cache bypassed for them), rubric wording (asked
with each declared paraphrase of the prompt) and correlated errors of a panel's members against
human labels (the effective number of independent judges)."""

from __future__ import annotations

import asyncio
import json
import math
import re
from contextlib import ExitStack

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.crux.framework import CRUX
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.reports.audits.agreement import Unit, judge_errors
from groundcover.pipelines.reports.audits.reask import (
    PARAPHRASE,
    RERUN,
    reask_audit,
    recorded_audits,
    recorded_judgements,
)
from groundcover.pipelines.reports.exports.rows import run_rows
from groundcover.pipelines.runtime.contract.panels import Vote
from tests.support.loopback import serve_app
from tests.support.scripted import ScriptedClient, field_of
from tests.test_crux import crux_options, write_crux
from tests.test_judges_apart import JudgeServer, eval_panel
from tests.test_panels import panel_run
from tests.test_runtime import FANOUT, FANOUT_SCRIPTS, run

# ---- correlated errors ----------------------------------------------------------------------


def test_effective_judges_by_hand():
    """Three members against the human label B on six units. Errors (1: not B):
    A 0 1 0 1 0 0, B 0 1 0 0 1 0, C 1 1 0 1 0 0. Pearson: r(A,B) = (1/18) / (2/9) = 1/4,
    r(A,C) = (1/6) / (sqrt(2/9) * 1/2) = 1/sqrt(2), r(B,C) = 0. Mean r = (1/4 + 1/sqrt 2) / 3;
    effective judges 3 / (1 + 2 r)."""
    given = {"A": "BDBDBB", "B": "BDBBDB", "C": "DDBDBB"}
    units = [Unit(f"i{k}", "judge", 0, [given[m][k] for m in "ABC"], None) for k in range(6)]
    human = {(f"i{k}", "judge", 0): "B" for k in range(6)}
    found = judge_errors(units, ["A", "B", "C"], human, Vote(tie="D", labels=tuple("ABCDEF")))
    assert found is not None
    pairs = {(p["a"], p["b"]): p for p in found["pairwise"]}
    assert pairs[("A", "B")]["error_correlation"] == pytest.approx(0.25)
    assert pairs[("A", "C")]["error_correlation"] == pytest.approx(1 / math.sqrt(2))
    assert pairs[("B", "C")]["error_correlation"] == pytest.approx(0.0, abs=1e-12)
    mean = (0.25 + 1 / math.sqrt(2)) / 3
    assert found["mean_error_correlation"] == pytest.approx(mean)
    assert found["effective_judges"] == pytest.approx(3 / (1 + 2 * mean))
    # both wrong on one unit of six (i1), where independent errors would give (2/6) * (2/6)
    assert pairs[("A", "B")]["both_wrong"] == pytest.approx(1 / 6)
    assert pairs[("A", "B")]["both_wrong_if_independent"] == pytest.approx(1 / 9)


def test_perfectly_correlated_judges_count_once_and_a_judge_never_wrong_says_nothing():
    units = [Unit(f"i{k}", "s", 0, [v, v, "B"], None) for k, v in enumerate("BDBD")]
    human = {(f"i{k}", "s", 0): "B" for k in range(4)}
    found = judge_errors(units, ["A", "B", "C"], human, None)
    assert found is not None
    pairs = {(p["a"], p["b"]): p["error_correlation"] for p in found["pairwise"]}
    assert pairs[("A", "B")] == pytest.approx(1.0)
    assert pairs[("A", "C")] is None and pairs[("B", "C")] is None  # C never errs
    assert found["effective_judges"] == pytest.approx(3 / (1 + 2 * 1.0))


def test_ordered_ratings_err_by_their_difference():
    """Ratings 0-5 against a human's: errors are signed differences. A: +1 -1 +2, B: +2 -2 +4
    (twice A's: r = 1), so two judges count as one."""
    units = [
        Unit("a", "rate", 0, [4, 5]),
        Unit("b", "rate", 0, [2, 1]),
        Unit("c", "rate", 0, [5, 7]),
    ]
    human = {("a", "rate", 0): 3, ("b", "rate", 0): 3, ("c", "rate", 0): 3}
    found = judge_errors(units, ["A", "B"], human, None)
    assert found is not None and found["error"] == "value minus human's"
    assert found["pairwise"][0]["error_correlation"] == pytest.approx(1.0)
    assert found["effective_judges"] == pytest.approx(1.0)


# ---- self-consistency: asked again -----------------------------------------------------------


def fanout_run(tmp_path):
    """FanOutQA closed book judged: f1's answer judged B; f2's verdict stayed unreadable (no
    judgement to ask again); f3 has no answer (not judged)."""
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    scripts = dict(FANOUT_SCRIPTS) | {
        "judge": lambda p: "Facts.\nB" if "Marseille" in p else "Facts.\nC"
    }
    client = ScriptedClient(scripts, check_constraints=False)
    options = FanoutOptions(input=data, judge=True)
    return run(FANOUTQA, options, client, tmp_path / "run")["closed-book"].dir


def test_a_rerun_counts_flips_by_hand_and_resumes(tmp_path):
    run_dir = fanout_run(tmp_path)
    rows = run_rows(run_dir)
    found = recorded_judgements(rows)
    assert [(r.item, r.judgement.verdict, r.members) for r in found] == [
        ("f1", "B", {"judge": "B"}),
        ("f2", "C", {"judge": "C"}),
    ]
    assert found[0].judgement.values["answer"] == "Paris and Marseille."
    # asked again: f1 is judged A now (a flip), f2 still C
    again = ScriptedClient(
        {"judge": lambda p: "Facts.\nA" if "Marseille" in p else "Facts.\nC"},
        check_constraints=False,
    )
    result = asyncio.run(reask_audit(rows, "rerun", 5, 0, {"judge": again}))
    assert (result["judgements"], result["answered"], result["flips"]) == (2, 2, 1)
    assert result["flip_rate"] == pytest.approx(0.5)
    assert result["by_member"]["judge"]["flips"] == 1
    assert {(t["original"], t["again"]) for t in result["table"]} == {("B", "A"), ("C", "C")}
    assert len(again.calls) == 2
    # a second audit asks nothing: its answers are in the run's labels folder
    second = asyncio.run(reask_audit(run_rows(run_dir), "rerun", 5, 0, {"judge": again}))
    assert second["asked_now"] == 0 and second["flips"] == 1 and len(again.calls) == 2
    assert (run_dir / "labels" / RERUN).is_file()
    # read back without a model (what agreement and the page show)
    assert recorded_audits(run_dir)["rerun"]["flips"] == 1


def test_an_unparseable_answer_is_counted_apart_and_asked_next_time(tmp_path):
    run_dir = fanout_run(tmp_path)
    broken = ScriptedClient({"judge": "no letter at all"}, check_constraints=False)
    result = asyncio.run(reask_audit(run_rows(run_dir), "rerun", 5, 0, {"judge": broken}))
    assert (result["answered"], result["unparseable"], result["flips"]) == (0, 2, 0)
    assert result["flip_rate"] is None  # never a silent 0
    fixed = ScriptedClient({"judge": "Facts.\nB"}, check_constraints=False)
    again = asyncio.run(reask_audit(run_rows(run_dir), "rerun", 5, 0, {"judge": fixed}))
    assert again["asked_now"] == 2 and (again["answered"], again["flips"]) == (2, 1)


def test_a_panels_members_are_each_asked_against_their_own_answers(tmp_path):
    """The three-judge panel of tests/test_panels.py: f1 voted B, B, A and f2 C, D, E. Asked
    again, judge#2 now says C on f2 (a flip of its own D), the others repeat themselves."""
    outcome, _, _ = panel_run(tmp_path, ["j1", "j2", "j3"])
    rows = run_rows(outcome.dir)
    found = {r.item: r.members for r in recorded_judgements(rows)}
    assert found == {
        "f1": {"judge": "B", "judge#2": "B", "judge#3": "A"},
        "f2": {"judge": "C", "judge#2": "D", "judge#3": "E"},
    }
    letters = {"judge": ("B", "C"), "judge#2": ("B", "C"), "judge#3": ("A", "E")}
    clients = {
        member: ScriptedClient(
            {"judge": lambda p, f=f, s=s: f"R.\n{f}" if "Marseille" in p else f"R.\n{s}"},
            check_constraints=False,
        )
        for member, (f, s) in letters.items()
    }
    result = asyncio.run(reask_audit(rows, "rerun", 10, 0, clients))
    assert (result["answered"], result["flips"]) == (6, 1)
    assert {m: p["flips"] for m, p in result["by_member"].items()} == {
        "judge": 0,
        "judge#2": 1,
        "judge#3": 0,
    }


# ---- rubric wording: paraphrases -------------------------------------------------------------


def test_paraphrases_of_the_fanoutqa_judge_count_flips_per_variant(tmp_path):
    run_dir = fanout_run(tmp_path)
    variants = FANOUTQA.paraphrases("judge")
    assert [v.variant for v in variants] == ["plain", "teacher", "terse"]
    assert all(f"~{v.variant}@v1#" in v.id for v in variants)

    # each paraphrase keeps the values, the six cases and the last-line letter
    def fields(text: str) -> set[str]:
        return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text))

    for variant in variants:
        assert fields(FANOUTQA.prompts["judge"].user) == fields(variant.user)
        assert all(f"({letter})" in variant.user for letter in "ABCDEF")

    def reworded(prompt: str) -> str:
        assert "Expert answer:" not in prompt  # a paraphrase, never the run's prompt
        return "Facts.\nC"  # f1 was B (a flip under each paraphrase), f2 was C

    client = ScriptedClient({"judge": reworded}, check_constraints=False)
    result = asyncio.run(reask_audit(run_rows(run_dir), "paraphrase", 5, 0, {"judge": client}))
    assert list(result["by_variant"]) == [v.id for v in variants]
    # two judgements, each asked with each of the three paraphrases: f1 flips three times
    assert (result["answered"], result["flips"]) == (6, 3)
    assert [c.body.get("max_tokens") for c in client.calls] == [768] * 6


def test_crux_rating_paraphrase_counts_flips_and_the_mean_change(tmp_path):
    """p4 is rated by the run for Q0..Q2 (4, 2, 0 by question); each paraphrase rates 4, 3, 2:
    two flips of three, the mean absolute change (0 + 1 + 2) / 3 = 1."""
    paths = write_crux(tmp_path)
    ratings = {"Q0?": "4", "Q1?": "2", "Q2?": "0"}
    client = ScriptedClient(
        {"rate": lambda p: ratings[field_of(p, "Question")]}, check_constraints=False
    )
    outcome = run(CRUX, crux_options(paths), client, tmp_path / "run")[""]
    rows = run_rows(outcome.dir)
    found = sorted((r.judgement.key, r.judgement.verdict) for r in recorded_judgements(rows))
    assert found == [("p4|0", 4), ("p4|1", 2), ("p4|2", 0)]
    new = {"Q0?": "4", "Q1?": "3", "Q2?": "2"}

    def paraphrased(prompt: str) -> str:
        assert not prompt.startswith("Rate how well")  # a paraphrase, never the run's prompt
        return new[field_of(prompt, "Question")]

    again = ScriptedClient({"rate": paraphrased}, check_constraints=False)
    result = asyncio.run(reask_audit(rows, "paraphrase", 10, 0, {"rate": again}))
    # each of the three paraphrases rates 4, 3, 2: two flips of three, a change of 1, each
    assert len(result["by_variant"]) == 3
    assert (result["answered"], result["flips"]) == (9, 6)
    assert result["change"] == pytest.approx(1.0)
    assert (outcome.dir / "labels" / PARAPHRASE).is_file()


# ---- the command, over HTTP with the run's own cache ----------------------------------------


def test_agreement_rerun_asks_the_servers_again_not_the_cache(tmp_path, monkeypatch):
    """A two-server panel recorded; one server then answers otherwise. `agreement --rerun`
    asks each member's server again (the cache holds the recorded answers, and is bypassed for
    these requests only), counts that member's flips, and resumes without asking; `agreement`
    and the HTML page then show what it found."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    servers = [JudgeServer("BBBBBB"), JudgeServer("DDDDAA")]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_app(s.app())) for s in servers]
        assert eval_panel(tmp_path, urls, "run").exit_code == 0
        asked = [sum(s.asked.values()) for s in servers]
        servers[1].letters = "DDDDDD"  # q4 and q5 now D: two flips of judge#2
        out = CliRunner().invoke(
            app, ["agreement", str(tmp_path / "run"), "--rerun", "6", "--json"]
        )
        assert out.exit_code == 0, out.output
        assert [sum(s.asked.values()) - a for s, a in zip(servers, asked, strict=True)] == [6, 6]
        [found] = json.loads(out.output)["rerun"]
        assert (found["answered"], found["flips"]) == (12, 2)
        assert found["by_member"]["judge"]["flips"] == 0
        assert found["by_member"]["judge#2"]["flips"] == 2
        again = CliRunner().invoke(app, ["agreement", str(tmp_path / "run"), "--rerun", "6"])
        assert again.exit_code == 0 and "asked now 0" in again.output
        assert [sum(s.asked.values()) - a for s, a in zip(servers, asked, strict=True)] == [6, 6]
    shown = CliRunner().invoke(app, ["agreement", str(tmp_path / "run"), "--json"])
    [run_report] = json.loads(shown.output)["runs"]
    assert run_report["audits"]["rerun"]["flips"] == 2
    page = tmp_path / "page.html"
    assert (
        CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--html", str(page)]).exit_code
        == 0
    )
    text = page.read_text()
    assert "Judge reliability" in text and "self-consistency (asked again)" in text
    both = CliRunner().invoke(
        app, ["agreement", str(tmp_path / "run"), "--rerun", "1", "--paraphrase", "1"]
    )
    assert both.exit_code == 2 and "one audit at a time" in both.output


def test_garage_judgements_carry_the_values_each_stage_was_asked_with(tmp_path):
    """A GaRAGe panel of two: every recorded judgement (deflection, eligibility, each
    sentence's support against all and against the relevant passages) finds both members'
    own answers by the digest of its values, so they are the values the stages were asked
    with; asked again, only the member that now answers otherwise flips."""
    from groundcover.pipelines.garage.framework import GARAGE, GarageOptions
    from tests.test_roles import EXAMPLES, request_for, run_with

    records = tmp_path / "garage.jsonl"
    rows = [json.loads(line) for line in (EXAMPLES / "garage.jsonl").read_text().splitlines()]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = tmp_path / "answers.jsonl"
    first = rows[0]["sample_id"]
    text = "It is 330 m tall [1]. It was completed in 1889 [2]."
    answers.write_text(json.dumps({"sample_id": first, "answer": text}) + "\n")
    labels = {
        "deflection": "attempted",
        "eligibility": "No Issues",
        "support-all": "supported",
        "support-relevant": "supported",
    }

    def grader(name: str, support: str) -> ScriptedClient:
        scripts = {s: labels[s] for s in labels} | {"support-all": support}
        member = {f"{s}#2": v for s, v in scripts.items()}
        return ScriptedClient(scripts | member, model=name, check_constraints=False)

    request = request_for(
        GarageOptions(input=records, answers=answers),
        tmp_path / "run",
        judge="g1@http://g.invalid/v1",
        **{"judge#2": "g2@http://g.invalid/v1"},
    )
    clients = {"g1": grader("g1", "supported"), "g2": grader("g2", "unsupported")}
    outcome = run_with(GARAGE, request, clients)[""]
    found = recorded_judgements(run_rows(outcome.dir))
    stages = sorted((r.judgement.stage, r.judgement.key) for r in found)
    # two sentences, each against all three passages and against the two relevant ones
    assert rows[0]["evidence_relevant"] == ["YES", "YES", "NO"]
    expected = [("deflection", "0"), ("eligibility", "0")]
    expected += [(stage, n) for stage in ("support-all", "support-relevant") for n in "01"]
    assert stages == sorted(expected)
    by = {(r.judgement.stage, r.judgement.key): r.members for r in found}
    assert by[("support-all", "0")] == {"judge": "supported", "judge#2": "unsupported"}
    assert by[("eligibility", "0")] == {"judge": "No Issues", "judge#2": "No Issues"}
    again = {"judge": grader("g1", "unsupported"), "judge#2": grader("g2", "unsupported")}
    result = asyncio.run(reask_audit(run_rows(outcome.dir), "rerun", 50, 0, again))
    assert result["by_member"]["judge"]["flips"] == 2  # its two support-all labels changed
    assert result["by_member"]["judge#2"]["flips"] == 0


def test_agreement_reports_the_members_correlated_errors_from_human_labels(tmp_path):
    """The three-judge panel (f1: B, B, A; f2: C, D, E) against human labels A and C: errors
    judge 1 0, judge#2 1 1 (constant: no correlation), judge#3 0 1; r(judge, judge#3) = -1,
    so no positive spread: the effective number is undefined, never a made-up one."""
    outcome, _, _ = panel_run(tmp_path, ["j1", "j2", "j3"])
    human = tmp_path / "human.jsonl"
    human.write_text(
        "".join(
            json.dumps({"id": i, "stage": "judge", "label": label}) + "\n"
            for i, label in (("f1", "A"), ("f2", "C"))
        )
    )
    args = ["agreement", str(outcome.dir), "--human", str(human), "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    errors = json.loads(out.output)["runs"][0]["stages"]["judge"]["errors"]
    assert (errors["units"], errors["judges"]) == (2, 3)
    pairs = {(p["a"].split()[0], p["b"].split()[0]): p for p in errors["pairwise"]}
    assert pairs[("judge", "judge#3")]["error_correlation"] == pytest.approx(-1.0)
    assert pairs[("judge", "judge#2")]["error_correlation"] is None
    assert errors["effective_judges"] is None
    text = CliRunner().invoke(app, ["agreement", str(outcome.dir), "--human", str(human)])
    assert "effective independent judges - of 3" in " ".join(text.output.split())
