"""Budgets and prices on scripted runs: a cap stops admitting items and leaves whole records, the
stop line names what remains, a resume with a higher cap ends identical to an uncapped run; the
dollars per stage and role by hand; prices files and uncosted models refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from groundcover.pipelines.cli.options import clean_errors
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.runtime.budget.costs import (
    BudgetReached,
    ModelPrice,
    cost_table,
    load_prices,
)
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.pipelines.runtime.store.run_dir import RESULTS, results_by_id
from tests.support.scripted import ScriptedClient

N = 8
OUTPUT = "x\n[Covered statements]\n- In Paris [1]\n[Uncovered statements]\n- In Lyon [2]\n"


def items_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {
            "id": f"q{k}",
            "query": f"Where {k}?",
            "response": f"Paris {k}.",
            "contexts": ["In Paris.", "In Lyon."],
        }
        for k in range(N)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def client() -> ScriptedClient:
    return ScriptedClient({"coverage": lambda prompt: OUTPUT}, check_constraints=False)


def run(tmp_path, run_dir, scripted, **caps):
    options = ComprehensivenessOptions(
        input=items_file(tmp_path), method="e2e", summarise=False, export_graphs=False
    )
    evaluator = EvaluatorConfig(model="judge", endpoint="http://127.0.0.1:9/v1", concurrency=3)
    request = RunRequest(evaluator, RunConfig(run_dir=run_dir, cache=None, **caps), options)
    return execute(
        COMPREHENSIVENESS, request, quiet=True, open_client=lambda ev, d: fixed_client(scripted)
    )


def records(run_dir: Path) -> dict[str, dict]:
    return {r.id: r.model_dump() for r in results_by_id(run_dir / RESULTS)}


def item_tokens(run_dir: Path) -> set[int]:
    return {
        sum(u["prompt_tokens"] + u["completion_tokens"] for u in r["usage"].values())
        for r in records(run_dir).values()
    }


def test_token_cap_stops_admitting_and_a_raised_cap_finishes_identically(tmp_path):
    run(tmp_path, tmp_path / "full", client())
    full = records(tmp_path / "full")
    (per_item,) = item_tokens(tmp_path / "full")  # every item costs the same: exact counts
    capped = tmp_path / "capped"
    first = client()
    with pytest.raises(BudgetReached, match=f"5 of {N} items remain") as stop:
        run(tmp_path, capped, first, max_run_tokens=int(3.5 * per_item))
    assert "--max-run-tokens" in str(stop.value)
    # 3 items fit (the first alone, then as long as spent + in flight + next <= cap)
    assert len(records(capped)) == 3 and len(first.calls) == 3
    assert all(r["status"] == "ok" for r in records(capped).values())
    summary = json.loads((capped / "summary.json").read_text())
    assert summary["partial"] and "max-run-tokens" in summary["budget_stop"]
    # the same cap again: nothing more is admitted, no model call is made
    again = client()
    with pytest.raises(BudgetReached, match=f"5 of {N} items remain"):
        run(tmp_path, capped, again, max_run_tokens=int(3.5 * per_item))
    assert again.calls == []
    # a raised cap resumes: only the missing items are asked, and the records equal the uncapped
    rest = client()
    run(tmp_path, capped, rest, max_run_tokens=N * per_item)
    assert len(rest.calls) == N - 3
    assert records(capped) == full


def test_dollar_cap_and_costs_by_hand(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("judge: {input: 3.0, output: 15.0}\n")
    run(tmp_path, tmp_path / "full", client(), prices=prices)
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    usage = summary["usage_this_invocation"]["coverage"]
    dollars = (usage["prompt_tokens"] * 3.0 + usage["completion_tokens"] * 15.0) / 1e6
    cost = summary["cost_recorded"]
    assert cost["by_stage"] == {"coverage": pytest.approx(dollars, abs=1e-6)}
    assert cost["by_role"] == {"judge": pytest.approx(dollars, abs=1e-6)}
    assert cost["total"] == pytest.approx(dollars, abs=1e-6) and cost["unpriced"] == []
    assert summary["cost_this_invocation"]["total"] == pytest.approx(dollars, abs=1e-6)
    per_item = dollars / N
    with pytest.raises(BudgetReached, match=f"6 of {N} items remain"):
        run(tmp_path, tmp_path / "capped", client(), prices=prices, max_cost=2.5 * per_item)
    assert len(records(tmp_path / "capped")) == 2


def test_a_dollar_cap_needs_every_models_price(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("other-model: {input: 1, output: 1}\n")
    with pytest.raises(UserError, match=r"--max-cost: no price for judge \(role judge\)"):
        run(tmp_path, tmp_path / "run", client(), prices=prices, max_cost=1.0)
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("judge: {input: 1}\n", "model judge: field (record): Value error, a token price needs"),
        ("judge: {input: -1, output: 2}\n", "model judge: field input:"),
        ("judge: {input: 1, output: 1, gpu_hour: 2}\n", "give input and output"),
        ("- judge\n", "top level must map model names to prices"),
        ("judge: {inptu: 1, output: 1}\n", "field inptu"),
    ],
)
def test_bad_prices_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as error:
        load_prices(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


class _Fw:
    roles = {"judge": "", "answer": ""}

    def role_of(self, stage, default=None):
        return {"answer": "answer", "cross-encoder": "nli"}.get(stage, "judge")


def test_gpu_hour_cost_is_shared_over_stages_by_tokens():
    usage = {
        "extract": {"prompt_tokens": 300, "completion_tokens": 100},  # 400 tokens
        "nli": {"prompt_tokens": 1000, "completion_tokens": 600},  # 1600 tokens
        "answer": {"prompt_tokens": 2_000_000, "completion_tokens": 1_000_000},
        "cross-encoder": {"calls": 50},  # no model role: no cost, not "unpriced"
    }
    roles = {
        "judge": {"model": "llama-8b", "request_model": "llama-8b"},
        "answer": {"model": "api-model", "request_model": "api-model"},
    }
    prices = {
        "llama-8b": ModelPrice(gpu_hour=2.0, gpus=2),
        "api-model": ModelPrice(input=0.5, output=1.5),
    }
    cost = cost_table(_Fw(), usage, roles, prices, seconds=1800)
    # served: 0.5 h x 2 GPUs x $2 = $2, split 400 : 1600; API: 2M x 0.5 + 1M x 1.5 per M = $2.5
    assert cost["by_stage"] == {"extract": 0.4, "nli": 1.6, "answer": 2.5}
    assert cost["by_role"] == {"judge": 2.0, "answer": 2.5} and cost["total"] == 4.5
    cost = cost_table(_Fw(), usage, roles, {"llama-8b": prices["llama-8b"]}, seconds=1800)
    assert cost["unpriced"] == ["api-model"] and cost["total"] == 2.0


def test_a_budget_stop_exits_3_with_one_line(capsys):
    @clean_errors
    def command():
        raise BudgetReached("runs/x: stopped admitting items (--max-cost 1); 4 of 9 items remain")

    with pytest.raises(typer.Exit) as exit_:
        command()
    assert exit_.value.exit_code == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "4 of 9 items remain" in err[0]
