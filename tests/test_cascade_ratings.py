"""Cascades over verdicts that are not A-F labels: CRUX's 0-5 ratings (a median on an ordinal
scale, kept where most of a tier give the same rating) and comprehensiveness' Q&A answer
comparisons (a relation between two answers, voted). The strong rater is asked exactly for the
rating the cheap panel splits on, and the score rests on the kept ratings; a rating no tier keeps
leaves the topic unjudged until a person rates it in ``view``."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.crux.framework import CRUX
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.panels import Average, Vote, verdict_of
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.cascades import write_calibration
from tests.support.scripted import ScriptedClient, field_of
from tests.test_crux import crux_options, write_crux
from tests.test_runtime import closing_client

URL = "http://127.0.0.1:9/v1"
# p4 is unrated: each rater is asked for it on the answerable Q0, Q1, Q2. The cheap three:
# Q0 4, 4, 1 (median 4, 2 of 3 agree: kept); Q1 5, 5, 5 (kept); Q2 1, 3, 5 (median 3, 1 of 3:
# escalated). The strong rater says 1 for Q2. With eta 3, p2 covers Q0 and Q1, and Q2 only p4
# can: the cascade's kept 1 leaves it uncovered (2/3), where the cheap panel's median 3 would
# have covered it (1.0).
RATES = {
    "c1": {"Q0?": 4, "Q1?": 5, "Q2?": 1},
    "c2": {"Q0?": 4, "Q1?": 5, "Q2?": 3},
    "c3": {"Q0?": 1, "Q1?": 5, "Q2?": 5},
    "strong": {"Q0?": 0, "Q1?": 0, "Q2?": 1},
}
CHEAP, STRONG = ["c1", "c2", "c3"], "strong"
MEMBERS = ["rate", "rate#2", "rate#3", "rate#4"]


def calibration(path, thresholds):
    tiers = [(MEMBERS[:3], CHEAP), (["rate"], [STRONG])]
    return write_calibration(path, tiers, {"rate": {"thresholds": thresholds}})


def rated(where, cascade, raters=(*CHEAP, STRONG)):
    where.mkdir(parents=True, exist_ok=True)
    options = crux_options(write_crux(where), rate=True)
    clients = {}
    for name in raters:
        ratings = RATES[name]

        def script(prompt, ratings=ratings):
            return f"Rating: {ratings[field_of(prompt, 'Question')]}"

        clients[name] = ScriptedClient(
            {stage: script for stage in MEMBERS}, model=name, check_constraints=False
        )
    roles = parse_role_options([f"rate={r}@{URL}" for r in raters])
    request = RunRequest(
        EvaluatorConfig(model=STRONG, endpoint=URL),
        RunConfig(run_dir=where / "run", cache=None, cascade=cascade),
        options,
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = lambda ev, run_dir: closing_client(clients[ev.model])  # noqa: E731
    (outcome,) = execute(CRUX, request, quiet=True, open_client=opened).values()
    return outcome, clients


def test_ratings_and_relations_are_verdicts_a_cascade_keeps_means_are_not():
    assert verdict_of(Vote(tie="D")) == "label"
    assert verdict_of(Average("median", level="ordinal")) == "rating"
    assert verdict_of(Average("mean")) is None and verdict_of(None) is None
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS

    assert verdict_of(COMPREHENSIVENESS.panel_rule("compare")) == "label"
    assert verdict_of(CRUX.panel_rule("rate_answer")) == "rating"
    assert verdict_of(COMPREHENSIVENESS.panel_rule("relevance")) is None


def test_the_strong_rater_is_asked_only_for_the_rating_the_cheap_panel_splits_on(tmp_path):
    cal = calibration(tmp_path / "cal.json", [0.6, 1.0])
    outcome, clients = rated(tmp_path, cal)
    (record,) = outcome.results
    assert record.status == "ok", record.failure
    assert [len(clients[c].calls) for c in CHEAP] == [3, 3, 3]
    (asked,) = clients[STRONG].calls
    assert field_of(asked.prompt, "Question") == "Q2?"
    entries = record.details["cascade"]
    kept = {tuple(e["tiers"][0]["members"]): (e["kept"], e["value"]) for e in entries}
    assert kept == {(4, 4, 1): (1, 4), (5, 5, 5): (1, 5), (1, 3, 5): (2, 1)}
    assert record.score == pytest.approx(2 / 3)  # Q2 uncovered: the strong rater's 1 is kept


def test_a_rating_no_tier_keeps_is_rated_by_a_person_in_view(tmp_path):
    """Tier 2 without a threshold: p4's Q2 is abstained and the topic unjudged. Rated 4 in
    view, the same command scores the topic with it: Q2 covered, 1.0."""
    from groundcover.pipelines.reports.pages.viewer import Viewer

    cal = calibration(tmp_path / "cal.json", [0.6, None])
    outcome, _ = rated(tmp_path, cal)
    (record,) = outcome.results
    assert (record.status, record.score) == ("unjudged", None)
    assert record.failure is not None and record.failure.stage == "rate"
    (key,) = [k for k, e in enumerate(record.details["cascade"]) if e["kept"] is None]
    viewer = Viewer([outcome.dir])
    assert ("t1", key, None) in viewer.units(0, "rate")
    # what the rater read: the question and p4's text
    shown = viewer.unit(0, "t1", "rate", key)["judged"]
    assert shown == {"question": "Q2?", "text": "four words text here"}
    assert viewer.choices(0, "rate")["kind"] == "number"
    body = {"id": "t1", "stage": "rate", "key": key, "label": 4, "annotator": "p"}
    assert viewer.add_label(0, body)["label"] == 4.0
    again, _ = rated(tmp_path, cal)
    (record,) = again.results
    assert (record.status, record.score) == ("ok", 1.0)
    assert sorted(str(e["kept"]) for e in record.details["cascade"]) == ["1", "1", "people"]


# ---- comprehensiveness' Q&A answer comparisons: a relation, voted ------------------------------

HEIGHT_324, HEIGHT_300 = "the full height - 324 metres", "the full height - 300 metres"
# The cheap three on the two comparisons the model decides (test_exact_scores' Q&A item): 324 m
# "second implies first" twice and "neutral" once (2 of 3: kept); 300 m "neutral", "equivalent",
# "contradictory" (a tie: escalated). The strong judge says what QA_SCRIPTS says.
RELATES = {
    "c1": {HEIGHT_324: "second implies first", HEIGHT_300: "neutral"},
    "c2": {HEIGHT_324: "second implies first", HEIGHT_300: "equivalent"},
    "c3": {HEIGHT_324: "neutral", HEIGHT_300: "contradictory"},
}


def test_an_answer_comparison_escalates_only_where_the_cheap_panel_ties(tmp_path):
    """The strong judge answers every other stage (mining, refining, answering: no verdict to
    keep) and only the 300 m comparison; the score is the hand-worked 1/3."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.test_exact_scores import ITEM, QA_SCRIPTS

    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps(ITEM.model_dump()) + "\n")
    members = ["compare", "compare#2", "compare#3"]
    clients = {}
    for name, says in RELATES.items():

        def script(prompt, says=says):
            pair = field_of(prompt, "Answer pair")
            return f"Compared.\n{pair} [{says[pair]}]"

        clients[name] = ScriptedClient({m: script for m in members}, model=name)
    clients[STRONG] = ScriptedClient(
        {f"{stage}#4": reply for stage, reply in QA_SCRIPTS.items()}, model=STRONG
    )
    tiers = [(["judge", "judge#2", "judge#3"], CHEAP), (["judge"], [STRONG])]
    cal = write_calibration(tmp_path / "cal.json", tiers, {"compare": {"thresholds": [0.6, 1.0]}})
    roles = parse_role_options([f"judge={r}@{URL}" for r in (*CHEAP, STRONG)])
    request = RunRequest(
        EvaluatorConfig(model=STRONG, endpoint=URL),
        RunConfig(run_dir=tmp_path / "run", cache=None, cascade=cal),
        ComprehensivenessOptions(input=items, protocol="spec", method="qa"),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = lambda ev, run_dir: closing_client(clients[ev.model])  # noqa: E731
    (outcome,) = execute(COMPREHENSIVENESS, request, quiet=True, open_client=opened).values()
    (record,) = outcome.results
    assert record.status == "ok", record.failure
    assert record.score == pytest.approx(1 / 3)
    assert [len(clients[c].calls) for c in CHEAP] == [2, 2, 2]
    (asked,) = clients[STRONG].stage_calls("compare#4")
    assert field_of(asked.prompt, "Answer pair") == HEIGHT_300
    kept = sorted((e["kept"], e["value"]) for e in record.details["cascade"])
    assert kept == [(1, "second implies first"), (2, "neutral")]


def test_a_rating_panels_run_is_a_tier_to_calibrate(tmp_path):
    """The cheap panel's run alone: each rating is a unit of `rate` with the panel's median and
    the share of raters who gave it, what `cascade calibrate` reads as the tier's confidence."""
    from groundcover.pipelines.reports.audits.cascade import read_tier

    outcome, _ = rated(tmp_path, None, raters=CHEAP)
    tier = read_tier(outcome.dir, None)
    assert "rate" not in tier.skipped and tier.kinds["rate"] == "share"
    found = sorted(tier.units["rate"].values())
    assert found == [(3.0, pytest.approx(1 / 3)), (4.0, pytest.approx(2 / 3)), (5.0, 1.0)]
    assert tier.members == MEMBERS[:3] and tier.models == CHEAP
