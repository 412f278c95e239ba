"""reproduce fanoutqa: a model x setting grid of ordinary runs, the paper beside ours."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.fanoutqa.framework import FanoutOptions
from pipelines.fanoutqa.reproduce import (
    REPRODUCE_FANOUTQA,
    ReproduceFanoutOptions,
    paper_row,
)
from tests.support.scripted import ScriptedClient
from tests.test_runtime import FANOUT, FANOUT_SCRIPTS, report_json, run

LLAMA = "meta-llama/Llama-2-70b-chat-hf@http://127.0.0.1:9/v1"
OTHER = "tiny-model@http://127.0.0.1:9/v1"


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
    assert sorted(outcomes) == ["meta-llama_Llama-2-70b-chat-hf/closed-book",
                                "tiny-model/closed-book"]  # fmt: skip
    assert len(client.stage_calls("answer-closed-book")) == 2 * 3  # each model answers each
    study = json.loads((tmp_path / "grid" / "study.json").read_text())
    llama, other = study["combined"]["rows"]
    # As test_fanoutqa_table_by_hand: loose (0.5 + 1 + 0) / 3, strict 1/3, for either model.
    assert llama["ours"]["loose"] == pytest.approx(0.5) == other["ours"]["loose"]
    assert llama["ours"]["strict"] == pytest.approx(1 / 3)
    assert llama["paper"]["loose"] == 0.440 and llama["paper"]["gpt_judge"] == 0.120
    assert "paper" not in other
    manifest = json.loads((tmp_path / "grid" / "tiny-model" / "closed-book" / "manifest.json")
                          .read_text())  # fmt: skip
    assert manifest["roles"]["answer"]["model"] == "tiny-model"
    assert report_json(tmp_path / "grid")[-1]["combined"] == study["combined"]


def test_the_command_is_listed_and_needs_a_model():
    result = CliRunner().invoke(app, ["reproduce", "fanoutqa", "--help"])
    assert result.exit_code == 0 and "--models" in result.output
    result = CliRunner().invoke(app, ["reproduce", "fanoutqa"])
    assert result.exit_code == 2
