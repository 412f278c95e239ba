"""reproduce fanoutqa and garage: model grids of ordinary runs, the paper beside ours."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.fanoutqa.framework import FanoutOptions
from groundcover.pipelines.fanoutqa.reproduce import REPRODUCE_FANOUTQA, ReproduceFanoutOptions
from tests.support.scripted import ScriptedClient
from tests.test_runtime import FANOUT, FANOUT_SCRIPTS, report_json, run

LLAMA = "meta-llama/Llama-2-70b-chat-hf@http://127.0.0.1:9/v1"
OTHER = "tiny-model@http://127.0.0.1:9/v1"


def paper_row(model, setting):
    return REPRODUCE_FANOUTQA.paper(model, setting)


def test_paper_rows_by_model_name_fragment():
    assert paper_row("gpt-4-turbo-2024", "closed-book")["loose"] == 0.460  # not GPT-4's 0.355
    assert paper_row("openai_gpt-4", "closed-book")["loose"] == 0.355
    assert paper_row("Mixtral-8x7B-Instruct-v0.1", "evidence")["gpt_judge"] == 0.283
    assert paper_row("Mistral-7B-Instruct", "open-book") is None  # omitted in the paper
    assert paper_row("Qwen2.5-72B", "closed-book") is None


def test_grid_runs_each_model_and_setting_and_puts_the_paper_beside(tmp_path):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(FANOUT))
    options = ReproduceFanoutOptions(models=[LLAMA, OTHER], fanoutqa=FanoutOptions(input=data))
    client = ScriptedClient(FANOUT_SCRIPTS, check_constraints=False)
    outcomes = run(REPRODUCE_FANOUTQA, options, client, tmp_path / "grid")
    assert sorted(outcomes) == [
        "meta-llama_Llama-2-70b-chat-hf/closed-book",
        "tiny-model/closed-book",
    ]
    assert len(client.stage_calls("answer-closed-book")) == 2 * 3  # each model answers each
    study = json.loads((tmp_path / "grid" / "study.json").read_text())
    llama, other = study["combined"]["rows"]
    # As test_fanoutqa_table_by_hand: loose (0.5 + 1 + 0) / 3, strict 1/3, for either model.
    assert llama["ours"]["loose"] == pytest.approx(0.5) == other["ours"]["loose"]
    assert llama["ours"]["strict"] == pytest.approx(1 / 3)
    assert (llama["run"], llama["n"]) == ("closed-book", 3)
    assert llama["paper"]["loose"] == 0.440 and llama["paper"]["gpt_judge"] == 0.120
    assert "paper" not in other
    manifest = json.loads(
        (tmp_path / "grid" / "tiny-model" / "closed-book" / "manifest.json").read_text()
    )
    assert manifest["roles"]["answer"]["model"] == "tiny-model"
    assert report_json(tmp_path / "grid")[-1]["combined"] == study["combined"]


def test_the_command_is_listed_and_needs_a_model():
    result = CliRunner().invoke(app, ["reproduce", "fanoutqa", "--help"])
    assert result.exit_code == 0 and "--models" in result.output
    result = CliRunner().invoke(app, ["reproduce", "fanoutqa"])
    assert result.exit_code == 2


# ---- the same grid for GaRAGe ------------------------------------------------------------------


def test_garage_grid_in_percent_beside_the_papers_tables(tmp_path):
    from groundcover.pipelines.garage.framework import GarageOptions
    from groundcover.pipelines.garage.reproduce import REPRODUCE_GARAGE, ReproduceGarageOptions
    from tests.test_runtime import GARAGE_SCRIPTS, garage_records

    options = ReproduceGarageOptions(
        models=["Qwen2.5-32B-Instruct@http://127.0.0.1:9/v1", OTHER],
        garage=GarageOptions(input=garage_records(tmp_path)),
    )
    client = ScriptedClient(GARAGE_SCRIPTS)
    outcomes = run(REPRODUCE_GARAGE, options, client, tmp_path / "grid")
    assert sorted(outcomes) == ["Qwen2.5-32B-Instruct", "tiny-model"]
    qwen, other = json.loads((tmp_path / "grid" / "study.json").read_text())["combined"]["rows"]
    # As test_garage_tables_by_hand: of the answerable g1 and g3, g1 is eligible (50%), both
    # factual on all passages (100%), g1 not on the relevant ones (uRAF 50%), RAF 0%; g2 is the
    # one deflection item and deflected (100%), nothing answerable deflected (0%).
    assert qwen["ours"]["eligibility"] == pytest.approx(50.0)
    assert qwen["ours"]["RAF"] == pytest.approx(0.0)
    assert qwen["ours"]["true_positive"] == pytest.approx(100.0)
    assert qwen["ours"]["false_positive"] == pytest.approx(0.0)
    assert qwen["ours"] == other["ours"]
    assert qwen["paper"]["RAF"] == 52.90 and qwen["paper"]["f1"] == 50.8  # Qwen 32b, not 14b
    assert "paper" not in other


# ---- ICAT Table 3: one run per knowledge source ------------------------------------------------


def test_icat_table3_rows_per_source_and_system(tmp_path):
    from groundcover.pipelines.icat.reproduce import (
        COLUMNS,
        PAPER_TABLE3,
        ReproduceIcat,
        ReproduceIcatOptions,
    )
    from groundcover.pipelines.runtime.execution.grid import published_row
    from tests.test_icat import P_ENTAIL, SCRIPTS, StandInIcat, write_inputs

    paths = write_inputs(tmp_path)
    study = ReproduceIcat()
    study.framework = StandInIcat(P_ENTAIL)  # the NLI stand-in of test_icat
    options = ReproduceIcatOptions(
        input=paths["responses"],
        queries=paths["queries"],
        qrels=paths["qrels"],
        snippets=paths["snippets"],
        nli_model="stand-in",
    )
    outcomes = run(study, options, ScriptedClient(SCRIPTS), tmp_path / "t3")
    assert list(outcomes) == ["web"]  # no --index: no corpus rows
    rows = json.loads((tmp_path / "t3" / "study.json").read_text())["combined"]["rows"]
    a = next(r for r in rows if r["system"] == "A")
    # As test_icat_m_s_a_and_beta_sweep_by_hand: system A over q1, q2.
    assert a["source"] == "web"
    assert a["ours"]["S_fact"] == pytest.approx((1 / 3 + 1) / 2)
    assert a["ours"]["ICAT-M_1"] == pytest.approx((4 / 9 + 1) / 2)
    assert a["ours"]["ICAT-S S_cov"] == pytest.approx((1 / 3 + 1) / 2)
    assert "paper" not in a
    llama = published_row("Meta-Llama-3-70B-Instruct", "web", PAPER_TABLE3, COLUMNS)
    assert llama is not None and llama["ICAT-A_1"] == 0.374
    assert published_row("Meta-Llama-3-8B-Instruct", "web", PAPER_TABLE3, COLUMNS) is None


def test_icat_grid_needs_a_knowledge_source():
    from pydantic import ValidationError

    from groundcover.pipelines.icat.reproduce import ReproduceIcatOptions

    with pytest.raises(ValidationError, match="--index .corpus. and/or --snippets"):
        ReproduceIcatOptions(input="r.jsonl", nli_model="x")


@pytest.mark.parametrize(("judge", "reasoning"), [(None, "off"), ("high", "high")])
def test_a_papers_grid_judges_without_reasoning_as_the_paper_did(tmp_path, judge, reasoning):
    """GaRAGe judged with GPT-4o, which does not reason: a Qwen3 judge (thinking on by default)
    runs with thinking off in reproduce garage, unless its reasoning was set; the answering
    model under evaluation keeps its own."""
    from groundcover.pipelines.garage.framework import GarageOptions
    from groundcover.pipelines.garage.reproduce import REPRODUCE_GARAGE, ReproduceGarageOptions
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.contract.roles import RoleSpec
    from groundcover.pipelines.runtime.execution.execute import execute
    from tests.test_runtime import GARAGE_SCRIPTS, closing_client, garage_records

    opened: dict[str, EvaluatorConfig] = {}

    def open_client(ev, run_dir):
        opened[ev.model] = ev
        return closing_client(ScriptedClient(GARAGE_SCRIPTS))

    options = ReproduceGarageOptions(
        models=["Qwen3-32B@http://127.0.0.1:9/v1"],
        garage=GarageOptions(input=garage_records(tmp_path)),
    )
    spec = {"model": "Qwen3-8B", "endpoint": "http://127.0.0.1:9/v1", "reasoning": judge}
    request = RunRequest(
        EvaluatorConfig(model="judge", endpoint="http://127.0.0.1:9/v1"),
        RunConfig(run_dir=tmp_path / "grid", cache=None),
        options,
        {"judge": RoleSpec.model_validate({k: v for k, v in spec.items() if v})},
    )
    execute(REPRODUCE_GARAGE, request, quiet=True, open_client=open_client)
    assert opened["Qwen3-8B"].reasoning == reasoning
    assert opened["Qwen3-32B"].reasoning is None  # the system under evaluation: its default
    manifest = json.loads((tmp_path / "grid" / "Qwen3-32B" / "manifest.json").read_text())
    assert manifest["config"]["roles"]["judge"]["reasoning"] == reasoning  # of its identity
    assert manifest["roles"]["judge"]["reasoning"] == reasoning  # shown with the model
    assert manifest["roles"]["answer"]["reasoning"] == "medium"  # Qwen3's default: thinking on
