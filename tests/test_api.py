"""The Python API: `evaluate` runs a framework as the command does (a YAML file and keyword
sections, one configuration) and returns typed results; `score_item` scores one item outside a
run. Both reach the hand-derived score of tests/test_exact_scores.py."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.api import Evaluation, evaluate, score_item
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult
from tests.support.scripted import ScriptedClient
from tests.test_exact_scores import ITEM, QA_SCRIPTS


async def test_score_item_is_the_frameworks_solve_outside_a_run():
    async with ScriptedClient(QA_SCRIPTS) as client:
        result = await score_item(
            "comprehensiveness", ITEM, client, {"protocol": "spec", "method": "qa"}
        )
    assert isinstance(result, ItemResult) and result.status == "ok", result.failure
    assert result.score == pytest.approx(1 / 3)  # derived in test_qa_method_exact_score


def test_evaluate_runs_a_framework_from_yaml_and_keywords_and_resumes(tmp_path):
    items = tmp_path / "items.jsonl"
    rows = [ITEM.model_dump() | {"id": name} for name in ("a", "b")]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "c.yaml"  # the YAML sets the method; a keyword section the protocol
    config.write_text("comprehensiveness:\n  method: qa\n  protocol: paper\n")
    run_dir = tmp_path / "run"

    def run(client) -> Evaluation:
        return evaluate(
            "comprehensiveness",
            config,
            options={"input": items, "protocol": "spec", "export_graphs": False},
            evaluator={"model": "stub", "endpoint": "http://127.0.0.1:9/v1"},
            run={"run_dir": run_dir, "cache": None},
            client=client,
        )

    client = ScriptedClient(QA_SCRIPTS)
    done = run(client)
    assert done.run_dir == run_dir and sorted(r.id for r in done.results) == ["a", "b"]
    assert all(r.score == pytest.approx(1 / 3) for r in done.results)
    assert done.summary.mean_score == pytest.approx(1 / 3)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["options"]["method"] == "qa" and manifest["options"]["protocol"] == "spec"
    asked = len(client.calls)
    again = run(client)  # the same call resumes: nothing is asked twice
    assert len(client.calls) == asked  # every item was recorded: no request this time
    stable = {"recorded", "statuses", "mean_score", "scored_items"}
    assert again.summary.model_dump(include=stable) == done.summary.model_dump(include=stable)
    assert again.summary.usage_this_invocation == {}


def test_evaluate_refuses_bad_configuration_in_one_line(tmp_path):
    with pytest.raises(UserError) as refused:
        evaluate("comprehensiveness", options={"input": tmp_path / "x.jsonl", "method": "nope"})
    assert "method" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UserError, match="unknown framework"):
        evaluate("no-such-framework")
