"""Judge variance (``--repeats K``) on scripted runs whose judge answers by its seed: K seeded
runs, the item means and between-repeat spread by hand, resume, report and compare of a root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.reports.compare import compare_runs
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunPlan, RunRequest
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.pipelines.runtime.execution.models import sampling_defaults
from groundcover.pipelines.runtime.execution.repeats import repeat_plans
from tests.support.scripted import Sampled, ScriptedClient, field_of

HALF = "x\n[Covered statements]\n- In Paris [1]\n[Uncovered statements]\n- In Lyon [2]\n"
FULL = "x\n[Covered statements]\n- In Paris [1]\n- In Lyon [2]\n[Uncovered statements]\n"


def items_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {
            "id": f"q{k}",
            "query": "Where?",
            "response": f"Paris {k}.",
            "contexts": ["In Paris.", "In Lyon."],
        }
        for k in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def judge(prompt: str, body: dict) -> str:
    """q0 is judged 0.5, 1.0, 0.5 under seeds 1, 2, 3; every other item 1.0 whatever the seed."""
    if field_of(prompt, "Answer") == "Paris 0.":
        return FULL if body.get("seed") == 2 else HALF
    return FULL


class Clients:
    """One scripted client per evaluator, with the sampling parameters the real path sends."""

    def __init__(self) -> None:
        self.made: dict[int | None, ScriptedClient] = {}

    def __call__(self, ev: EvaluatorConfig, run_dir: Path):
        if ev.seed not in self.made:
            self.made[ev.seed] = ScriptedClient(
                {"coverage": Sampled(judge)},
                check_constraints=False,
                default_params=sampling_defaults(ev),
            )
        return fixed_client(self.made[ev.seed])

    def calls(self) -> int:
        return sum(len(c.calls) for c in self.made.values())


def run(tmp_path, root, clients, temperature=0.7, repeats=3):
    options = ComprehensivenessOptions(
        input=items_file(tmp_path), method="e2e", summarise=False, export_graphs=False
    )
    evaluator = EvaluatorConfig(
        model="judge", endpoint="http://127.0.0.1:9/v1", temperature=temperature
    )
    request = RunRequest(evaluator, RunConfig(run_dir=root, cache=None, repeats=repeats), options)
    return execute(COMPREHENSIVENESS, request, quiet=True, open_client=clients)


def test_repeats_record_k_judgements_and_their_spread(tmp_path):
    root, clients = tmp_path / "rep", Clients()
    outcomes = run(tmp_path, root, clients)
    assert list(outcomes) == ["repeat-1", "repeat-2", "repeat-3"]
    # each repeat's requests carry its own seed, 4 items each
    assert {seed: len(c.calls) for seed, c in clients.made.items()} == {1: 4, 2: 4, 3: 4}
    assert all(c.body["seed"] == seed for seed, cl in clients.made.items() for c in cl.calls)
    meta = json.loads((root / "study.json").read_text())
    table = meta["combined"]
    assert meta["repeats"] == 3 and table["repeats"] == 3
    # item means: q0 (0.5 + 1 + 0.5) / 3 = 2/3, the others 1 -> (2/3 + 3) / 4
    assert table["mean_of_item_means"] == pytest.approx((2 / 3 + 3) / 4)
    # between-repeat SD: q0 stdev(0.5, 1, 0.5) = sqrt(1/12), others 0; mean over 4 items
    assert table["mean_between_repeat_sd"] == pytest.approx((1 / 12) ** 0.5 / 4)
    assert (table["items_changed"], table["items_with_two_scores"]) == (1, 4)
    assert table["repeat_means"] == {
        "repeat-1": pytest.approx(0.875),
        "repeat-2": 1.0,
        "repeat-3": pytest.approx(0.875),
    }
    assert table["per_item"]["q0"] == {
        "scores": [0.5, 1.0, 0.5],
        "mean": pytest.approx(2 / 3),
        "sd": pytest.approx((1 / 12) ** 0.5),
    }
    assert table["per_item"]["q1"] == {"scores": [1.0, 1.0, 1.0], "mean": 1.0, "sd": 0.0}
    # each repeat is a whole run with its own manifest: a seeded judge is part of its identity
    manifest = json.loads((root / "repeat-2" / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 2
    # resumed: nothing is asked again
    again = Clients()
    run(tmp_path, root, again)
    assert again.calls() == 0
    # report rebuilds the table from disk
    out = CliRunner().invoke(app, ["report", str(root), "--json"])
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[-1]["repeats"]["mean_of_item_means"] == pytest.approx(table["mean_of_item_means"])


def test_compare_scores_a_repeats_root_by_item_means(tmp_path):
    root = tmp_path / "rep"
    run(tmp_path, root, Clients())
    single = tmp_path / "single"
    run(tmp_path, single, Clients(), repeats=1)  # one run, seed unset: q0 judged HALF
    result = compare_runs([root, single], resamples=500)
    rep, one = result["runs"]
    assert rep["repeats"] == 3 and rep["between_repeat_sd"] == pytest.approx((1 / 12) ** 0.5 / 4)
    assert one["repeats"] == 1 and one["mean"] == pytest.approx(0.875)
    (pair,) = result["pairs"]
    assert pair["deltas"][0] == {
        "id": "q0",
        "a": pytest.approx(2 / 3),
        "b": 0.5,
        "delta": pytest.approx(1 / 6),
    }
    assert (pair["test"]["wins"], pair["test"]["ties"], pair["test"]["losses"]) == (1, 3, 0)


def test_repeats_at_temperature_zero_are_refused(tmp_path):
    with pytest.raises(UserError, match="samples at temperature 0"):
        run(tmp_path, tmp_path / "rep", Clients(), temperature=0.0)
    assert not (tmp_path / "rep").exists()


def test_repeats_are_for_a_study_of_one_run(tmp_path):
    options = ComprehensivenessOptions(input=items_file(tmp_path), method="e2e")
    request = RunRequest(EvaluatorConfig(temperature=1.0), RunConfig(repeats=2), options)
    plans = [RunPlan("a", "t", options), RunPlan("b", "t", options)]
    with pytest.raises(UserError, match="makes 2 runs"):
        repeat_plans(COMPREHENSIVENESS, request, plans)


def test_compare_page_of_a_repeats_root_shows_each_repeat(tmp_path):
    root, single = tmp_path / "rep", tmp_path / "single"
    run(tmp_path, root, Clients())
    run(tmp_path, single, Clients(), repeats=1)
    page = tmp_path / "c.html"
    out = CliRunner().invoke(
        app, ["compare", str(root), str(single), "--html", str(page), "--resamples", "200"]
    )
    assert out.exit_code == 0, out.output
    html = page.read_text()
    assert html.count('<section class="run"') == 4  # three repeats and the single run
    # q0 of the repeats root links to the first repeat's drill-down, of the single run to its own
    assert 'href="#item=0:q0"' in html and 'href="#item=3:q0"' in html
