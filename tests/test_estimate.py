"""Dry runs and pilots on scripted runs: the calls the items fix are exact, the estimate of the
rest holds the real count within its interval, a pilot's items are not asked again, and a dry
run starts no model and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.runtime.budget.estimate import predict_total
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.pipelines.runtime.store.run_dir import RESULTS, results_by_id
from tests.support.scripted import ScriptedClient, field_of

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COVERAGE = "x\n[Covered statements]\n- In Paris [1]\n[Uncovered statements]\n"


def write_items(path: Path, n: int) -> Path:
    rows = [
        {
            "id": f"q{k:02d}",
            "query": f"Where is item {k}?",
            "response": " ".join(["Paris"] * (k % 5 + 1)) + f" {k}.",
            "contexts": [f"In Paris {j}." for j in range(k % 3 + 1)],
        }
        for k in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def request(items: Path, run_dir: Path, summarise: bool, concurrency: int = 1) -> RunRequest:
    options = ComprehensivenessOptions(
        input=items, method="e2e", summarise=summarise, export_graphs=False
    )
    evaluator = EvaluatorConfig(
        model="judge", endpoint="http://127.0.0.1:9/v1", concurrency=concurrency
    )
    return RunRequest(evaluator, RunConfig(run_dir=run_dir, cache=None), options)


def scripted(reask_every: int = 0) -> ScriptedClient:
    """Coverage parses at once, except (``reask_every``) every such item's first answer."""
    seen: set[str] = set()

    def coverage(prompt: str) -> str:
        answer = field_of(prompt, "Answer")
        number = int(answer.split()[-1].rstrip("."))
        if reask_every and number % reask_every == 0 and answer not in seen:
            seen.add(answer)
            return "I will not use the format."
        return COVERAGE

    return ScriptedClient(
        {"coverage": coverage, "summarise": lambda p: "Paris, in short."}, check_constraints=False
    )


def estimate_of(outcomes) -> dict:
    ((_, outcome),) = outcomes.items()
    assert outcome.summary is None  # a dry run records nothing
    return outcome.estimate


def stage(estimate: dict, name: str) -> dict:
    return next(s for s in estimate["stages"] if s["stage"] == name)


def test_calls_the_items_fix_are_exact_and_a_dry_run_writes_nothing(tmp_path):
    items = write_items(tmp_path / "items.jsonl", 6)  # 1, 2, 3, 1, 2, 3 contexts
    run_dir = tmp_path / "run"
    dry = estimate_of(
        execute(
            COMPREHENSIVENESS,
            request(items, run_dir, summarise=True),
            dry_run=True,
            open_client=_no_model,
        )
    )
    assert not run_dir.exists()
    assert dry["missing"] == 6 and dry["recorded"] == 0
    summaries, coverage = stage(dry, "summarise"), stage(dry, "coverage")
    assert (summaries["exact_calls"], summaries["fixed_items"]) == (12, 6)
    assert (coverage["exact_calls"], coverage["fixed_items"]) == (6, 6)
    assert summaries["tokens"] is None  # nothing recorded: tokens unknown, never guessed
    client = scripted()
    execute(
        COMPREHENSIVENESS,
        request(items, run_dir, summarise=True),
        quiet=True,
        open_client=lambda ev, d: fixed_client(client),
    )
    assert len(client.stage_calls("summarise")) == 12 and len(client.stage_calls("coverage")) == 6


def _no_model(ev, run_dir):
    raise AssertionError("a dry run opened a model")


def test_pilot_estimate_holds_the_real_counts_and_its_items_are_not_asked_again(tmp_path):
    items = write_items(tmp_path / "items.jsonl", 30)
    run_dir = tmp_path / "run"
    pilot_client = scripted(reask_every=3)
    outcomes = execute(
        COMPREHENSIVENESS,
        request(items, run_dir, summarise=False),
        quiet=True,
        pilot=6,
        open_client=lambda ev, d: fixed_client(pilot_client),
    )
    piloted = {r.id for r in results_by_id(run_dir / RESULTS)}
    assert piloted == {f"q{k:02d}" for k in range(6)}
    estimate = outcomes[""].summary.estimate_of_the_rest
    written = json.loads((run_dir / "summary.json").read_text())["estimate_of_the_rest"]
    assert written == json.loads(json.dumps(estimate))
    assert estimate["missing"] == 24 and estimate["recorded"] == 6
    coverage = stage(estimate, "coverage")
    assert coverage["exact_calls"] == 24  # one per item, whatever the model says
    # the pilot re-asked q00 and q03 (1 of 3 items): 24 + 24/3 calls expected
    assert coverage["calls"][0] == pytest.approx(8)
    dry = estimate_of(
        execute(
            COMPREHENSIVENESS,
            request(items, run_dir, summarise=False),
            dry_run=True,
            open_client=_no_model,
        )
    )
    assert stage(dry, "coverage") == coverage  # a later dry run reads the same records
    # the real run: only the 24 missing items are asked
    rest_client = scripted(reask_every=3)
    execute(
        COMPREHENSIVENESS,
        request(items, run_dir, summarise=False),
        quiet=True,
        open_client=lambda ev, d: fixed_client(rest_client),
    )
    asked = {field_of(c.prompt, "Answer") for c in rest_client.stage_calls("coverage")}
    assert len(asked) == 24 and not any(a.endswith((" 0.", " 3.")) for a in asked)
    rest = [r for r in results_by_id(run_dir / RESULTS) if r.id not in piloted]
    real_calls = sum(r.usage["coverage"]["calls"] for r in rest)
    assert real_calls == len(rest_client.stage_calls("coverage")) == 24 + 8
    _point, low, high = coverage["calls"]
    assert low <= real_calls - 24 <= high
    for key in ("prompt_tokens", "completion_tokens"):
        real = sum(r.usage["coverage"][key] for r in rest)
        _point, low, high = coverage["tokens"][key]
        assert low <= real <= high, (key, real, low, high)


def test_a_pilot_with_a_reasoning_judge_estimates_its_reasoning_tokens_apart(tmp_path):
    """Each coverage call reasons 40 tokens: the pilot's 6 items make the rest's 24 exactly
    24 x 40 reasoning tokens (no spread), part of the completion tokens and printed apart."""
    from io import StringIO

    from rich.console import Console

    from groundcover.pipelines.runtime.budget.estimate import print_estimate
    from groundcover.serving.reasoning import Reasoning

    items = write_items(tmp_path / "items.jsonl", 30)
    judge = scripted()
    judge.reasons, judge.reasoning = 40, Reasoning.make("always", "low", 100)
    outcomes = execute(
        COMPREHENSIVENESS,
        request(items, tmp_path / "run", summarise=False),
        quiet=True,
        pilot=6,
        open_client=lambda ev, d: fixed_client(judge),
    )
    estimate = outcomes[""].summary.estimate_of_the_rest
    tokens = stage(estimate, "coverage")["tokens"]
    assert tokens["reasoning_tokens"] == (24 * 40,) * 3
    assert tokens["completion_tokens"][0] > 24 * 40  # reasoning is part of the completion
    printed = StringIO()
    print_estimate("run", estimate, Console(file=printed, width=200))
    assert "of which reasoning" in printed.getvalue() and "960 (960-960)" in printed.getvalue()


def test_prediction_interval_by_theory():
    assert predict_total([2, 2, 2], 10) == (20.0, 20.0, 20.0)  # no spread: no width
    # 1000 more items of a 0/1 quantity seen 100 times: sd of the sum = sqrt(n var + n^2 var / m)
    # = sqrt(250 + 2500) = 52.4, so about 500 -+ 103
    point, low, high = predict_total([0, 1] * 50, 1000)
    assert point == 500 and abs(low - 397) < 15 and abs(high - 603) < 15
    # seen only 6 times: the mean is uncertain, the interval far wider (sd 205)
    _, low, high = predict_total([0, 1] * 3, 1000)
    assert low < 250 and high > 750
    # 5 more items: the item-to-item spread alone spans 0..5
    assert predict_total([0, 1] * 50, 5) == (2.5, 0.0, 5.0)


def test_dry_run_and_pilot_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    out = CliRunner().invoke(
        app,
        [
            "eval",
            "comprehensiveness",
            str(EXAMPLES / "comprehensiveness.jsonl"),
            "--method",
            "e2e",
            "--run-dir",
            str(run_dir),
            "--dry-run",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "no model is started" in out.output and "(exact)" in out.output
    assert not run_dir.exists()
    bad = CliRunner().invoke(
        app,
        ["eval", "comprehensiveness", str(EXAMPLES / "comprehensiveness.jsonl"), "--pilot", "0"],
    )
    assert bad.exit_code == 2 and "--pilot K needs K >= 1" in bad.output


def test_dry_run_says_when_the_run_directory_holds_another_run(tmp_path):
    items = write_items(tmp_path / "items.jsonl", 3)
    run_dir = tmp_path / "run"
    client = scripted()
    execute(
        COMPREHENSIVENESS,
        request(items, run_dir, summarise=False),
        quiet=True,
        open_client=lambda ev, d: fixed_client(client),
    )
    out = CliRunner().invoke(
        app,
        [
            "eval",
            "comprehensiveness",
            str(items),
            "--method",
            "qa",
            "--run-dir",
            str(run_dir),
            "--dry-run",
        ],
    )
    assert out.exit_code == 0 and "holds a different run" in out.output


def test_dry_run_replays_the_response_cache(tmp_path):
    from groundcover.pipelines.runtime.execution.models import client_options
    from groundcover.serving.cache import ResponseCache

    cache_path = tmp_path / "responses.sqlite"
    first = write_items(tmp_path / "six.jsonl", 6)
    req = request(first, tmp_path / "a", summarise=False)
    req.run = RunConfig(run_dir=tmp_path / "a", cache=cache_path)
    cache = ResponseCache(cache_path)

    def cached_client(ev, run_dir):
        # built as the real client is (client_options): the same requests, the same cache keys
        client = ScriptedClient(
            {"coverage": scripted(reask_every=3).scripts["coverage"]},
            check_constraints=False,
            cache=cache,
            **client_options(ev),
        )
        return fixed_client(client)

    execute(COMPREHENSIVENESS, req, quiet=True, open_client=cached_client)
    cache.close()
    recorded = list(results_by_id(tmp_path / "a" / RESULTS))
    # a new run over the same six items and two more: the six are answered by the cache
    more = write_items(tmp_path / "eight.jsonl", 8)
    req = request(more, tmp_path / "b", summarise=False)
    req.run = RunConfig(run_dir=tmp_path / "b", cache=cache_path)
    dry = estimate_of(execute(COMPREHENSIVENESS, req, dry_run=True, open_client=_no_model))
    assert not (tmp_path / "b").exists()
    assert dry["missing"] == 8 and dry["cached_items"] == 6
    coverage = stage(dry, "coverage")
    # q00 and q03 were re-asked: 6 + 2 calls, all in the cache; q06, q07: one call each, fixed
    assert coverage["cached_calls"] == 8 == sum(r.usage["coverage"]["calls"] for r in recorded)
    assert (coverage["exact_calls"], coverage["fixed_items"]) == (2, 2)
    assert coverage["cached_tokens"] == {
        t: sum(r.usage["coverage"][t] for r in recorded)
        for t in ("prompt_tokens", "completion_tokens", "reasoning_tokens")
    }
    # without the cache nothing is answered by it
    req.run = RunConfig(run_dir=tmp_path / "b", cache=None)
    dry = estimate_of(execute(COMPREHENSIVENESS, req, dry_run=True, open_client=_no_model))
    assert dry["cached_items"] == 0 and stage(dry, "coverage")["exact_calls"] == 8
