"""Confidences checked (a judge's label probability, an NLI model's): NaN, infinite and
outside 0 to 1 are refused in one line naming the run, the item and the stage, where a run
records one and where ``cascade calibrate`` reads one."""

from __future__ import annotations

import json
import math

import pytest

from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.cascade import (
    ConfidenceRefused,
    checked_confidence,
)
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.cascades import write_calibration
from tests.support.scripted import ScriptedClient, by_text
from tests.test_cascade_run import (
    ANSWERS,
    CHEAP,
    STRONG,
    URL,
    VERDICTS,
    lone_judge_reply,
    member_names,
    verdict_script,
)
from tests.test_runtime import FANOUT, closing_client


def test_a_confidence_is_a_finite_probability_or_one_line_says_whose_is_not():
    assert checked_confidence(0.25, "runs/x", "f1", "judge") == 0.25
    assert checked_confidence(1, "runs/x", "f1", "judge") == 1.0
    for bad, said in (
        (math.exp(0.5), "1.6487212707001282 is not a probability from 0 to 1"),
        (-0.2, "-0.2 is not a probability from 0 to 1"),
        (float("nan"), "nan is not a finite number"),
        (float("inf"), "inf is not a finite number"),
        ("0.9", "'0.9' is not a number"),
        (True, "True is not a number"),
    ):
        with pytest.raises(ConfidenceRefused) as refused:
            checked_confidence(bad, "runs/x", "f2", "judge")
        assert str(refused.value) == f"runs/x: record 'f2': stage judge: field confidence: {said}"


def lone_run(where, f2_probability, cascade=None, judges=(STRONG,)):
    """FanOutQA's judge alone with --confidence logprobs (or through ``cascade``): the strong
    judge says B for f1 at 0.95 and C for f2 at ``f2_probability`` (its logprob's exp)."""
    replies = {
        "Marseille": lone_judge_reply("B", 0.95),
        "1889": lone_judge_reply("C", f2_probability),
    }

    def strong(prompt):
        return next(r for text, r in replies.items() if text in prompt)

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
        RunConfig(
            run_dir=where / "run",
            cache=None,
            cascade=cascade,
            confidence=None if cascade else "logprobs",
        ),
        FanoutOptions(input=data, judge=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = lambda ev, run_dir: closing_client(clients[ev.model])  # noqa: E731
    return execute(FANOUTQA, request, quiet=True, open_client=opened)["closed-book"]


def test_a_positive_logprob_is_refused_where_the_confidence_is_recorded(tmp_path):
    """The judge's logprob of f2's label is +0.5 (probability 1.65): the judgement is refused
    as an odd answer is, its error one line naming the run, the item and the stage; f1's 0.95
    is recorded as before. Through a cascade whose tier 2 is that judge (logprobs), f2's
    tier-2 step keeps no confidence and says why, and no tier keeps it."""
    alone = lone_run(tmp_path / "alone", math.exp(0.5))
    records = {r.id: r for r in alone.results}
    assert [e["confidence"] for e in records["f1"].details["confidence"]] == [pytest.approx(0.95)]
    assert "confidence" not in records["f2"].details  # nothing recorded to calibrate on
    said = json.dumps(records["f2"].model_dump(mode="json"))
    assert "record 'f2': stage judge: field confidence: 1.64872" in said
    assert str(alone.dir) in said

    cal = write_calibration(
        tmp_path / "cal.json",
        [(member_names(3), list(CHEAP)), (["judge"], [STRONG])],
        {"judge": {"thresholds": [0.6, 0.5], "confidence": ["share", "logprobs"]}},
    )
    cascaded = lone_run(tmp_path / "cascaded", math.exp(0.5), cascade=cal, judges=(*CHEAP, STRONG))
    f2 = {r.id: r for r in cascaded.results}["f2"]
    entry = f2.details["cascade"][0]
    assert entry["kept"] is None
    strong_step = entry["tiers"][1]
    assert strong_step["confidence"] is None
    assert strong_step["refused"].endswith(
        "record 'f2': stage judge: field confidence: 1.6487212707001282 is not a probability "
        "from 0 to 1"
    )


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        ("NaN", "nan is not a finite number"),
        ("1.65", "1.65 is not a probability from 0 to 1"),
        ("-0.2", "-0.2 is not a probability from 0 to 1"),
    ],
)
def test_cascade_calibrate_refuses_a_recorded_confidence_that_is_no_probability(
    tmp_path, recorded, said
):
    """A run from elsewhere whose records say f2's confidence is NaN, 1.65 or -0.2: `cascade
    calibrate` stops in one line naming the run, the item and the stage, and writes nothing."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.audits.cascade import Guarantee, calibrate

    alone = lone_run(tmp_path / "alone", 0.7)
    results = alone.dir / "results.jsonl"
    lines = results.read_text().splitlines()
    edited = []
    for line in lines:
        if json.loads(line)["id"] == "f2":
            line = line.replace('"confidence":0.7', f'"confidence":{recorded}')
            assert recorded in line
        edited.append(line)
    results.write_text("\n".join(edited) + "\n")
    human = tmp_path / "human.jsonl"
    human.write_text(json.dumps({"id": "f1", "stage": "judge", "label": "B"}) + "\n")
    argv = ["cascade", "calibrate", str(alone.dir), "--human", str(human), "--check-share", "0"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0
    assert f"{alone.dir}: record 'f2': stage judge: field confidence: {said}" in " ".join(
        result.output.split()
    )
    assert not (alone.dir / "cascade").exists()
    # the test itself refuses one too: a NaN would sort anywhere and make a NaN threshold
    with pytest.raises(ValueError, match="confidence #1: nan is not a finite number"):
        calibrate([0.9, float("nan")], [True, True], Guarantee(0.1, 0.1))
