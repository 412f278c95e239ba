"""A run judged through a calibrated cascade (``--cascade``): FanOutQA's A-F judge as two tiers,
a panel of three cheap judges, then one strong judge. The strong judge is asked exactly for the
judgements tier 1 is not confident of, the records equal those worked out by hand, a judgement no
tier keeps is recorded unjudged (never a score) and offered for labelling, a resumed run asks
nothing twice, and the calibration is part of the run's identity."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.cascade import (
    CALIBRATION_KIND,
    content_digest,
    read_cascade,
)
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from groundcover.pipelines.runtime.store.run_dir import RESULTS, RunStoreError
from tests.support.scripted import ScriptedClient, by_text
from tests.test_runtime import FANOUT, closing_client

URL = "http://127.0.0.1:9/v1"
ANSWERS = {"French": "Paris and Marseille.", "tower": "It opened in 1889.", "sky": ""}
# f1 (Marseille): B, B, A -> B, 2 of 3 agree; f2 (1889): C, D, E -> the declared tie D, 1 of 3;
# f3 has no answer, so no judge is asked. The strong judge says B for f1 and C for f2.
VERDICTS = {"j1": ("B", "C"), "j2": ("B", "D"), "j3": ("A", "E"), "strong": ("B", "C")}
CHEAP, STRONG = ["j1", "j2", "j3"], "strong"


def calibration(path, thresholds, models=(CHEAP, [STRONG])):
    """A calibration as ``cascade calibrate`` writes it (the fields a run reads), known by its
    digest."""
    made = {
        "kind": CALIBRATION_KIND,
        "version": 1,
        "alpha": 0.1,
        "delta": 0.1,
        "tiers": [
            {"run": "tier1", "task": "closed-book", "members": member_names(len(models[0]))}
            | {"models": list(models[0])},
            {"run": "tier2", "task": "closed-book", "members": ["judge"]}
            | {"models": list(models[1])},
        ],
        "stages": {"judge": {"thresholds": thresholds}},
        "skipped": {},
    }
    made["sha256"] = content_digest(made)
    path.write_text(json.dumps(made))
    return path


def member_names(n):
    return ["judge"] + [f"judge#{k}" for k in range(2, n + 1)]


def verdict_script(first, second):
    """A judge's reasoning, then its letter: ``first`` for f1 (Marseille), else ``second``."""
    return lambda p: f"Reasoning.\n{first}" if "Marseille" in p else f"Reasoning.\n{second}"


def cascade_run(tmp_path, cascade, judges=(*CHEAP, STRONG)):
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
    )
    return outcomes["closed-book"], clients


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
    assert f2.status == "unjudged" and f2.score is None
    assert f2.failure is not None and f2.failure.stage == "judge"
    assert "tier 1: 0.333 < 0.600; tier 2: 1.000 (no threshold)" in f2.failure.error
    assert f2.details["cascade"][0]["kept"] is None
    assert by_id["f1"].status == "ok" and by_id["f3"].status == "abstained"  # no answer given
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


def test_the_calibration_is_known_by_content_and_checked_against_the_roles(tmp_path):
    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    first, _ = cascade_run(tmp_path / "a", cal)
    other = calibration(tmp_path / "other.json", [0.5, 1.0])
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
