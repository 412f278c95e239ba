"""`agreement --swap-audit K`: recorded answer comparisons asked again with the two answers
swapped through the comprehensiveness Q&A stage itself, the verdicts mapped back and the flips
counted, worked out by hand; resumed without asking twice; an unparseable answer counted apart."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.reports.audits.swap import (
    AUDIT,
    judge_config,
    swap_audit,
    swap_candidates,
)
from groundcover.pipelines.reports.exports.rows import run_rows
from tests.support.scripted import ScriptedClient, field_of
from tests.test_exact_scores import ITEM, QA_SCRIPTS
from tests.test_runtime import run

# The recorded run (QA_SCRIPTS): per item the model decided two comparisons, both of the
# response's "the full height" against a context answer:
#   "the full height" vs "324 metres" -> second implies first
#   "the full height" vs "300 metres" -> neutral
# The four others were decided by rules (identical text, pint units): no order to flip.
SWAPPED = {
    # second answer first: "324 metres implies the full height" read back is the recorded
    # "second implies first" -> no flip
    "324 metres - the full height": "x\n324 metres - the full height [first implies second]",
    # "neutral" recorded, now "second implies first", read back "first implies second" -> flip
    "300 metres - the full height": "x\n300 metres - the full height [second implies first]",
}


def swapped_judge(broken: str | None = None) -> ScriptedClient:
    def compare(prompt: str) -> str:
        pair = field_of(prompt, "Answer pair")
        return "no relation here" if pair == broken else SWAPPED[pair]

    return ScriptedClient({"compare": compare}, check_constraints=False)


@pytest.fixture
def qa_run(tmp_path):
    items = [ITEM.model_dump(), ITEM.model_dump() | {"id": "tower2"}]
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    options = ComprehensivenessOptions(input=data, method="qa", protocol="spec")
    run(COMPREHENSIVENESS, options, ScriptedClient(QA_SCRIPTS), tmp_path / "run")
    return tmp_path / "run"


async def test_flips_counted_by_hand_and_rules_left_out(qa_run):
    candidates = swap_candidates(run_rows(qa_run))
    assert [(c.item, c.pair.key, c.pair.verdict) for c in candidates] == [
        ("tower", "q2.r.1|q2.c1.1", "second implies first"),
        ("tower", "q2.r.1|q2.c2.1", "neutral"),
        ("tower2", "q2.r.1|q2.c1.1", "second implies first"),
        ("tower2", "q2.r.1|q2.c2.1", "neutral"),
    ]
    async with swapped_judge() as client:
        found = await swap_audit(qa_run, 10, 0, client)
        # the swapped prompt: the context's answer first, the same question
        prompts = [field_of(c.prompt, "Answer pair") for c in client.stage_calls("compare")]
    assert sorted(prompts) == sorted(2 * list(SWAPPED))
    # one flip of two per item: 2 of 4; every item-resample has rate 1/2
    assert (found["drawn"], found["answered"], found["flips"]) == (4, 4, 2)
    assert found["flip_rate"] == 0.5
    assert found["flip_rate_ci"] == pytest.approx((0.5, 0.5))
    assert found["table"] == [
        {"original": "neutral", "swapped": "first implies second", "count": 2},
        {"original": "second implies first", "swapped": "second implies first", "count": 2},
    ]
    # the records are untouched; the answers are beside them
    rows = [json.loads(line) for line in (qa_run / "labels" / AUDIT).read_text().splitlines()]
    assert len(rows) == 4 and {r["stage"] for r in rows} == {"compare"}


async def test_a_second_audit_asks_only_what_is_missing(qa_run):
    async with swapped_judge() as client:
        first = await swap_audit(qa_run, 2, 7, client)
        assert first["asked_now"] == 2 and len(client.stage_calls("compare")) == 2
    async with swapped_judge() as client:
        again = await swap_audit(qa_run, 4, 7, client)
        assert again["asked_now"] == 2 and len(client.stage_calls("compare")) == 2
    assert again["drawn"] == 4 and again["flips"] == 2


async def test_an_unparseable_swapped_answer_is_counted_apart(qa_run):
    # the 300-metre pair never parses (asked 1 + 2 re-asks per item): neither flip nor agreement
    async with swapped_judge(broken="300 metres - the full height") as client:
        found = await swap_audit(qa_run, 4, 0, client)
        assert len(client.stage_calls("compare")) == 2 + 2 * 3
    assert (found["drawn"], found["answered"], found["unparseable"]) == (4, 2, 2)
    assert (found["flips"], found["flip_rate"]) == (0, 0.0)
    # the next audit asks just those two again, as a run retries its failed items
    async with swapped_judge() as client:
        again = await swap_audit(qa_run, 4, 0, client)
        assert again["asked_now"] == 2 and len(client.stage_calls("compare")) == 2
    assert (again["answered"], again["unparseable"], again["flips"]) == (4, 0, 2)


def test_the_judge_asked_is_the_one_the_manifest_records(qa_run):
    # the run's judge (tests.test_runtime.run: model "judge" at 127.0.0.1:9), or one moved
    recorded = run_rows(qa_run)
    roles = recorded.manifest.roles
    assert roles is not None and roles["judge"]["endpoint"] == "http://127.0.0.1:9/v1"
    config = judge_config(recorded, "compare", None, None)
    assert (config.model, config.endpoint, config.temperature) == (
        "judge",
        roles["judge"]["endpoint"],
        0.0,
    )
    moved = judge_config(recorded, "compare", "other", "http://127.0.0.1:8/v1")
    assert (moved.model, moved.endpoint) == ("other", "http://127.0.0.1:8/v1")


def test_a_run_without_comparisons_says_so(tmp_path):
    from tests.test_labels import judged_run

    out = CliRunner().invoke(app, ["agreement", str(judged_run(tmp_path)), "--swap-audit", "5"])
    assert out.exit_code == 0, out.output
    assert "no recorded judgement of this run compares two texts" in out.output
    bad = CliRunner().invoke(app, ["agreement", str(tmp_path / "run"), "--swap-audit", "0"])
    assert bad.exit_code != 0 and "--swap-audit must be at least 1" in bad.output


async def test_a_judge_that_reasons_first_is_read_for_its_answer(qa_run):
    # shaped like gpt-oss behind vLLM: 400 reasoning tokens before every answer, returned
    # apart; the swapped comparison's budget leaves room for them and the relation is read
    # from the answer alone
    def compare(prompt: str) -> str:
        return SWAPPED[field_of(prompt, "Answer pair")]

    async with ScriptedClient({"compare": compare}, check_constraints=False, reasons=400) as c:
        found = await swap_audit(qa_run, 4, 0, c)
        budgets = [call.body["max_tokens"] for call in c.stage_calls("compare")]
    assert (found["answered"], found["unparseable"], found["flips"]) == (4, 0, 2)
    assert min(budgets) > 400
