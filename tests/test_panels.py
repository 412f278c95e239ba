"""Judge panels: several models in one judging role, their answers combined per stage by the
framework's declared rule (strict majority for labels, ties by a declared label; mean or median
for scores), each member asked, cached and accounted apart; a panel of one is the role."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.panels import Average, Vote, asked_digest, split_member
from groundcover.pipelines.runtime.contract.protocol import RunRequest, request_model
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.scripted import ScriptedClient, by_text
from tests.test_runtime import FANOUT, closing_client

URL = "http://127.0.0.1:9/v1"


def test_a_strict_majority_wins_and_anything_less_is_a_declared_tie():
    vote = Vote(tie="D")
    assert vote.combine(["B", "B", "A"]) == ("B", False)
    assert vote.combine(["A", "B", "C"]) == ("D", True)  # never the first member's A
    assert vote.combine(["B", "A", "A"]) == ("A", False)  # the order of members plays no part
    assert vote.combine(["A", "A", None]) == ("A", False)  # 2 of 3 members
    assert vote.combine(["A", None, None]) == ("D", True)  # 1 of 3 is no majority
    assert vote.combine(["A", "B"]) == ("D", True)
    assert vote.level == "nominal" and Vote(tie=0, order=(0, 1, 2)).level == "ordinal"
    assert Average("mean").combine([0.5, None, 1.0]) == (0.75, False)
    assert Average("median").combine([3, 5, 4, 0]) == (3.5, False)
    assert Average("median").combine([None, None]) == (None, False)


def test_a_repeated_role_or_a_yaml_list_is_a_panel():
    assert parse_role_options(["judge=a@" + URL, "judge=b@" + URL, "answer=c@" + URL]) == {
        "judge": "a@" + URL,
        "judge#2": "b@" + URL,
        "answer": "c@" + URL,
    }
    config = request_model(FANOUTQA).model_validate(
        {"roles": {"judge": ["a@" + URL, "b@" + URL], "answer": "c@" + URL}, "fanoutqa": {}}
    )
    assert sorted(config.roles) == ["answer", "judge", "judge#2"]
    one = request_model(FANOUTQA).model_validate({"roles": {"judge": ["a@" + URL]}, "fanoutqa": {}})
    assert list(one.roles) == ["judge"]
    assert split_member("judge#3") == ("judge", 3) and split_member("judge") == ("judge", 1)


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (["answer=a", "answer=b"], "the system under evaluation; a panel judges"),
        (["judge#3=a"], "must be judge#2, judge#3"),
        (["critic#2=a"], "has the roles"),
    ],
)
def test_a_panel_only_judges(roles, message):
    with pytest.raises(UserError, match=message):
        FANOUTQA.check_roles(list(parse_role_options(roles)))


# ---- a three-judge FanOutQA panel ------------------------------------------------------------

ANSWERS = {"French": "Paris and Marseille.", "tower": "It opened in 1889.", "sky": ""}
# what each judge says about f1 (Marseille) and f2 (1889); f3 has no answer, so no verdict
VERDICTS = {"j1": ("B", "C"), "j2": ("B", "D"), "j3": ("A", "E")}


def judge_script(model: str):
    first, second = VERDICTS[model]
    return lambda p: f"Reasoning.\n{first}" if "Marseille" in p else f"Reasoning.\n{second}"


def panel_run(tmp_path, judges: list[str], yaml_roles=None, **how):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path.parent / "dev.json"  # one file for the runs a test compares
    data.write_text(json.dumps(FANOUT))
    clients = {"ans": ScriptedClient({"answer-closed-book": lambda p: by_text(ANSWERS, p)})}
    for name in VERDICTS:
        stages = ("judge", "judge#2", "judge#3")  # the stage as each member asks it
        clients[name] = ScriptedClient({s: judge_script(name) for s in stages}, model=name)
    roles = yaml_roles or parse_role_options([f"judge={j}@{URL}" for j in judges])
    request = RunRequest(
        EvaluatorConfig(model="ans", endpoint=URL),
        RunConfig(run_dir=tmp_path / "run", cache=None),
        FanoutOptions(input=data, judge=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = []

    def open_client(ev, run_dir):
        opened.append(ev.model)
        return closing_client(clients[ev.model])

    outcomes = execute(FANOUTQA, request, quiet=True, open_client=open_client, **how)
    return outcomes["closed-book"], clients, opened


def test_three_judges_a_majority_and_a_tie_each_member_accounted(tmp_path):
    outcome, clients, opened = panel_run(tmp_path, ["j1", "j2", "j3"])
    assert sorted(opened) == ["ans", "j1", "j2", "j3"]
    details = {r.id: r.details for r in outcome.results}
    # f1: B, B, A -> B by majority (passes); f2: C, D, E -> no majority: the declared D (fails)
    assert details["f1"]["judge"]["category"] == "B" and details["f1"]["judge"]["score"] == 1
    assert details["f2"]["judge"]["category"] == "D" and details["f2"]["judge"]["score"] == 0
    # each entry keeps a digest of the values its prompt was rendered with (the audits find
    # each member's own answer to a judgement by it)
    asked = {
        q["id"]: asked_digest(
            {"question": q["question"], "reference": json.dumps(q["answer"]), "answer": answer}
        )
        for q, answer in zip(FANOUT, ANSWERS.values(), strict=True)
    }
    assert details["f1"]["panel"] == [
        {"stage": "judge", "members": ["B", "B", "A"], "value": "B", "asked": asked["f1"]}
    ]
    assert details["f2"]["panel"] == [
        {
            "stage": "judge",
            "members": ["C", "D", "E"],
            "value": "D",
            "tie": True,
            "asked": asked["f2"],
        }
    ]
    assert outcome.tables["gpt_judge"] == pytest.approx(1 / 3)
    # each member asked once per answered question, accounted under its own stage and role
    assert [len(clients[j].calls) for j in VERDICTS] == [2, 2, 2]
    by_role = outcome.summary.usage_by_role_this_invocation
    assert {r: by_role[r]["calls"] for r in ("judge", "judge#2", "judge#3")} == {
        "judge": 2,
        "judge#2": 2,
        "judge#3": 2,
    }
    assert (by_role["judge#2"]["model"], by_role["judge#3"]["model"]) == ("j2", "j3")
    manifest = json.loads((tmp_path / "run" / "closed-book" / "manifest.json").read_text())
    assert [manifest["config"]["roles"][r]["model"] for r in ("judge", "judge#2", "judge#3")] == [
        "j1",
        "j2",
        "j3",
    ]


def test_a_pilot_estimates_each_member_apart(tmp_path):
    """f1 is piloted (every member judges it once); the rest's estimate has a row per member,
    each under its own role, as do the costs a price file gives."""
    outcome, _, _ = panel_run(tmp_path, ["j1", "j2", "j3"], pilot=1)
    estimate = outcome.summary.estimate_of_the_rest
    rows = {s["stage"]: s for s in estimate["stages"]}
    assert {r: rows[r]["role"] for r in ("judge", "judge#2", "judge#3")} == {
        "judge": "judge",
        "judge#2": "judge#2",
        "judge#3": "judge#3",
    }
    assert rows["judge#3"]["calls"][0] == pytest.approx(2.0)  # one per item, 2 items to go


def test_a_panel_of_one_is_the_role_byte_for_byte(tmp_path):
    single, _, _ = panel_run(tmp_path / "a", ["j1"])
    listed, _, _ = panel_run(tmp_path / "b", [], yaml_roles={"judge": f"j1@{URL}"})
    as_list = request_model(FANOUTQA).model_validate(
        {"roles": {"judge": [f"j1@{URL}"]}, "fanoutqa": {}}
    )
    assert {r: s.model_dump() for r, s in as_list.roles.items()} == {
        "judge": RoleSpec.model_validate(f"j1@{URL}").model_dump()
    }
    for name in ("results.jsonl",):
        a = (tmp_path / "a" / "run" / "closed-book" / name).read_bytes()
        b = (tmp_path / "b" / "run" / "closed-book" / name).read_bytes()
        assert a == b and b"panel" not in a
    manifests = [
        json.loads((tmp_path / d / "run" / "closed-book" / "manifest.json").read_text())
        for d in ("a", "b")
    ]
    assert manifests[0]["config"] == manifests[1]["config"]
    assert "judge#2" not in json.dumps(manifests[0])
    assert single.tables == listed.tables


def test_the_same_model_twice_in_a_panel_is_refused(tmp_path):
    with pytest.raises(UserError, match="judge#2: the same model as judge .* temperature 0"):
        panel_run(tmp_path, ["j1", "j1"])
    assert not (tmp_path / "run").exists()  # refused before anything is written


async def test_a_comprehensiveness_panel_votes_nli_labels_and_averages_relevance(tmp_path):
    """The NLI method with two judges that answer alike: the hand-derived score 0.5 of
    tests/test_exact_scores.py stands; every NLI label and relevance score was asked of both
    members (their own stage names), unanimous, with the NLI probability the vote share 1.0;
    extraction went to the first member only."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
    from groundcover.pipelines.runtime.contract.context import ItemContext
    from groundcover.pipelines.runtime.execution.solve import solve_item
    from tests.test_exact_scores import ITEM, NLI_SCRIPTS

    options = ComprehensivenessOptions(protocol="spec", method="nli")
    second = {f"{stage}#2": script for stage, script in NLI_SCRIPTS.items()}
    async with ScriptedClient(NLI_SCRIPTS) as lead, ScriptedClient(second, model="b") as other:
        clients = {"judge": lead, "judge#2": other}
        ctx = ItemContext(ITEM.id, clients, options, LlmNli(), tmp_path, 2, COMPREHENSIVENESS)
        record = await solve_item(COMPREHENSIVENESS, ITEM, ctx)
    assert record.status == "ok" and record.score == 0.5
    asked = {c.stage for c in other.calls}
    assert asked == {"nli#2", "relevance#2"}  # no extraction by the second member
    assert len(other.stage_calls("nli#2")) == len(lead.stage_calls("nli"))
    entries = record.details["panel"]
    assert {e["stage"] for e in entries} == {"nli", "relevance"}
    assert all(e["members"][0] == e["members"][1] == e["value"] for e in entries)
    assert "tie" not in json.dumps(entries)
