"""Simulated annotators (``--simulated-annotators``): one model at temperature 0 made a panel by
asking each member with its own wording of the stage (the prompt, then the framework's declared
paraphrases), so the share of members agreeing is a confidence a cascade can calibrate. Each
member asks its wording, the strong tier of a cascade asks the prompt itself, a stage with too
few wordings is refused before anything is written, and the flag is part of the run's
identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from groundcover.pipelines.runtime.store.run_dir import RunStoreError
from tests.support.scripted import ScriptedClient, by_text
from tests.test_cascade_run import ANSWERS, calibration, lone_judge_reply, member_names
from tests.test_runtime import FANOUT, closing_client

URL = "http://127.0.0.1:9/v1"
# How each wording reads to the one small model: the prompt ("Expert answer"), the plain
# paraphrase ("Reference answer"), the teacher's ("Answer key"), the terse one ("Gold answer").
# f1 (Marseille): B, B, A -> B, 2 of 3 agree; f2 (1889): C, D, E -> the declared tie D, 1 of 3.
WORDINGS = {"Expert answer:": "BC", "Reference answer:": "BD", "Answer key:": "AE"}


def small(prompt: str) -> str:
    letters = next(v for k, v in WORDINGS.items() if k in prompt)
    return f"Facts.\n{letters[0] if 'Marseille' in prompt else letters[1]}"


def annotated(where, judges, cascade=None, annotators=True, confidence=None):
    """FanOutQA's judge: each ``judges`` entry a member (the same model may repeat)."""
    where.mkdir(parents=True, exist_ok=True)
    data = where / "dev.json"
    data.write_text(json.dumps(FANOUT))
    made: list[ScriptedClient] = []

    def opened(ev, run_dir):
        if ev.model == "ans":
            client = ScriptedClient({"answer-closed-book": lambda p: by_text(ANSWERS, p)})
        else:
            script = small if ev.model == "small" else (lambda p: lone_judge_reply("C", 0.9))
            stages = member_names(len(judges))
            client = ScriptedClient({s: script for s in stages}, model=ev.model)
        made.append(client)
        return closing_client(client)

    roles = parse_role_options([f"judge={j}@{URL}" for j in judges])
    request = RunRequest(
        EvaluatorConfig(model="ans", endpoint=URL),
        RunConfig(
            run_dir=where / "run",
            cache=None,
            cascade=cascade,
            simulated_annotators=annotators,
            confidence=confidence,
        ),
        FanoutOptions(input=data, judge=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    outcome = execute(FANOUTQA, request, quiet=True, open_client=opened)["closed-book"]
    return outcome, [call for client in made for call in client.calls]


def test_one_model_is_a_panel_of_three_wordings(tmp_path):
    """Member 1 asks the prompt, member 2 the plain paraphrase, member 3 the teacher's; their
    labels vote: f1 B (2 of 3), f2 the tie D (1 of 3)."""
    outcome, calls = annotated(tmp_path, ["small"] * 3)
    judges = [c for c in calls if c.stage.startswith("judge")]
    judged = {(c.stage, next(k for k in WORDINGS if k in c.prompt)) for c in judges}
    assert len(judges) == 6 and judged == {
        ("judge", "Expert answer:"),
        ("judge#2", "Reference answer:"),
        ("judge#3", "Answer key:"),
    }
    panels = {r.id: r.details["panel"] for r in outcome.results if "panel" in r.details}
    assert panels["f1"][0]["members"] == ["B", "B", "A"] and panels["f1"][0]["value"] == "B"
    assert panels["f2"][0]["members"] == ["C", "D", "E"] and panels["f2"][0]["tie"] is True
    # the same model at temperature 0 without the flag: its members would answer alike
    with pytest.raises(UserError, match="asked at temperature 0 answers the same"):
        annotated(tmp_path / "plain", ["small"] * 3, annotators=False)
    # the flag is part of the run's identity: the same directory without it is another run
    with pytest.raises(RunStoreError, match="simulated_annotators"):
        annotated(tmp_path, ["small", "other", "third"], annotators=False)


def test_a_cascades_strong_tier_asks_the_prompt_itself(tmp_path):
    """Tier 1 the three wordings of the small model, tier 2 the strong judge alone: f2 (1 of
    3) is escalated, and the strong judge asks with the stage's own prompt. The tier was
    calibrated with its wordings: a run asking otherwise is refused."""
    from tests.support.cascades import write_digested

    cal = calibration(tmp_path / "cal.json", [0.6, 1.0], models=(["small"] * 3, ["strong"]))
    with pytest.raises(UserError, match="tier 1 was calibrated without --simulated-annotators"):
        annotated(tmp_path, ["small"] * 3 + ["strong"], cascade=cal)
    made = json.loads(cal.read_text())
    made["tiers"][0]["simulated_annotators"] = True
    write_digested(cal, made)
    outcome, calls = annotated(tmp_path, ["small"] * 3 + ["strong"], cascade=cal)
    (strong,) = [c for c in calls if c.model == "strong"]
    assert strong.stage == "judge#4" and "Expert answer:" in strong.prompt
    assert "1889" in strong.prompt
    f2 = {r.id: r for r in outcome.results}["f2"].details["cascade"][0]
    assert (f2["kept"], f2["value"]) == (2, "C")


def test_a_panel_with_more_members_than_wordings_is_refused_before_anything_is_written(
    tmp_path,
):
    with pytest.raises(UserError, match="stage judge of fanoutqa has 4 wording"):
        annotated(tmp_path, ["small"] * 5)
    assert not (tmp_path / "run").exists()


def test_a_tier_of_simulated_annotators_is_calibrated_as_such(tmp_path):
    """`cascade calibrate` of the three wordings' run and a strong judge's: tier 1 says its
    members asked with their own wordings, so a cascade run must ask the same way."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.runtime.contract.cascade import read_cascade

    cheap, _ = annotated(tmp_path / "cheap", ["small"] * 3)
    strong, _ = annotated(tmp_path / "strong", ["strong"], annotators=False, confidence="logprobs")
    made = CliRunner().invoke(
        app, ["cascade", "calibrate", str(cheap.dir), str(strong.dir), "--json"]
    )
    assert made.exit_code == 0, made.output
    found = json.loads(made.output)
    assert found["tiers"][0]["simulated_annotators"] is True
    assert "simulated_annotators" not in found["tiers"][1]
    assert read_cascade(Path(found["file"])).annotators == (True, False)
