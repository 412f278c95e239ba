"""The three comprehensiveness methods end to end against the real tiny vLLM server."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions, Item
from groundcover.pipelines.comprehensiveness.framework import evaluate_item
from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
from groundcover.serving.client import EvalClient
from tests.conftest import SHARED

pytestmark = pytest.mark.engine

ITEM = Item(
    id="tower",
    query="How tall is the Eiffel Tower?",
    response="The Eiffel Tower in Paris is 330 metres tall.",
    contexts=[
        "The Eiffel Tower is 330 metres tall including its antennas.",
        "Without its antennas, the Eiffel Tower measures 300 metres.",
    ],
)
SMALL = {"list_max_items": 3, "line_max_chars": 30, "list_max_tokens": 600}


def client_for(server) -> EvalClient:
    return EvalClient(server.base_url, server.served_name, default_params={"temperature": 0.0})


def check_score(record):
    assert record.status in {"ok", "undefined"}, record.failure
    n_in, n_out = len(record.details["covered"]), len(record.details["uncovered"])
    if record.status == "ok":
        assert record.score == pytest.approx(n_in / (n_in + n_out))
    else:
        assert record.score is None and n_in + n_out == 0


async def test_nli_method(vllm_server, tmp_path):
    config = ComprehensivenessOptions(method="nli", **SMALL)
    async with client_for(vllm_server) as client:
        record = await evaluate_item(client, ITEM, config, nli_judge=LlmNli(), run_dir=tmp_path)
    check_score(record)
    details = record.details
    kept = details["kept_context_atoms"]
    n_r = len(details["atoms"]["response"])
    assert details["pairs"]["ordered"] == 2 * n_r * len(kept) + len(kept) * (len(kept) - 1)
    assert details["pairs"]["judged"] <= details["pairs"]["ordered"]
    # Paper protocol: one kept relation per unordered pair (R-C and C-C).
    assert len(details["kept_relations"]) == n_r * len(kept) + len(kept) * (len(kept) - 1) // 2
    assert details["summaries"] and len(details["summaries"]) == 2
    # No response->response pair; every relation is one of the three labels.
    for relation in details["relations"]:
        assert not (relation["premise"].startswith("r") and relation["hypothesis"].startswith("r"))
        assert relation["label"] in {"entailment", "contradiction", "neutral"}
    # Relevance filter: kept atoms scored >= T_rel, dropped ones below.
    for atom_id, score in details["relevance"].items():
        assert (atom_id in kept) == (score >= config.t_rel)
        assert 1.0 <= score <= 5.0
    assert {"extract", "relevance"} <= set(record.usage)
    if details["statements"]:
        assert json.loads((tmp_path / "graphs" / "tower.json").read_text())["nodes"]


@pytest.mark.parametrize("protocol", ["paper", "spec"])
async def test_qa_method(vllm_server, tmp_path, protocol):
    config = ComprehensivenessOptions(
        method="qa", protocol=protocol, t_rel=1.0, t_conf=1.0, **SMALL
    )
    async with client_for(vllm_server) as client:
        record = await evaluate_item(client, ITEM, config, run_dir=tmp_path)
    check_score(record)
    details = record.details
    source_of = {a["id"]: a["source"] for a in details["answers"]}
    for comparison in details["comparisons"]:
        pair = (source_of[comparison["first"]], source_of[comparison["second"]])
        if protocol == "spec":  # the paper protocol compares response answers too
            assert pair != ("response", "response")
        assert comparison["first"].split(".")[0] == comparison["second"].split(".")[0]  # same q
        assert comparison["relation"] in {
            "equivalent",
            "first implies second",
            "second implies first",
            "contradictory",
            "neutral",
        }
    for answer in details["answers"]:
        assert answer["kept"] == (answer["confidence"] >= config.t_conf)
    assert all(q["weighted"] for q in details["refined_questions"])  # logprob-weighted


@pytest.mark.parametrize("method", ["nli", "qa", "e2e"])
async def test_unconstrained_garbage_is_recorded_unparseable_never_scored(vllm_server, method):
    # Without format-constrained decoding the random model cannot follow the formats: the item
    # is recorded with the failing stage and every raw output, and no score.
    # No summaries: unconstrained ones from the random model would push the re-ask past the tiny
    # model's 4,096-token window, which the server rejects (status error, rightly).
    config = ComprehensivenessOptions(method=method, max_reasks=1, summarise=False, **SMALL)
    client = EvalClient(
        vllm_server.base_url,
        vllm_server.served_name,
        default_params={"temperature": 0.0},
        vllm_extensions=False,
    )
    async with client:
        record = await evaluate_item(client, ITEM, config)
    assert record.status == "unparseable", record.failure
    assert record.score is None
    assert record.failure.stage in {"extract", "mine", "coverage"}
    assert len(record.failure.outputs) == 2  # first answer + one re-ask
    assert record.usage[record.failure.stage]["calls"] >= 2


async def test_e2e_method(vllm_server):
    config = ComprehensivenessOptions(method="e2e", **SMALL)
    async with client_for(vllm_server) as client:
        record = await evaluate_item(client, ITEM, config)
    check_score(record)
    for statement in record.details["covered"] + record.details["uncovered"]:
        assert set(statement["sources"]) <= {"c1", "c2"} and statement["sources"]
    assert record.usage["coverage"]["calls"] == 1


def test_cli_runs_resumes_and_exports(vllm_server, tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text(json.dumps(ITEM.model_dump()) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("comprehensiveness:\n" + "".join(f"  {k}: {v}\n" for k, v in SMALL.items()))
    args = [
        "eval",
        "comprehensiveness",
        str(data),
        "--method",
        "nli",
        "--config",
        str(cfg),
        "--endpoint",
        vllm_server.base_url,
        "--model",
        vllm_server.served_name,
        "--run-dir",
        str(tmp_path / "run"),
        "--quiet",
    ]
    runner = CliRunner()
    first = runner.invoke(app, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["recorded"] == 1
    assert summary["usage_this_invocation"]["extract"]["requests"] > 0
    second = runner.invoke(app, args, catch_exceptions=False)
    assert second.exit_code == 0
    again = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert again["usage_this_invocation"] == {}  # resumed: nothing left, no model call
    assert len((tmp_path / "run" / "results.jsonl").read_text().splitlines()) == 1
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["prompts"]["extract_atoms"].startswith("extract_atoms@v1#")
    assert manifest["options"]["method"] == "nli"
    assert manifest["framework"] == "comprehensiveness"


WC = SHARED / "data" / "wikicontradict" / "humaneval-dev.jsonl"


@pytest.mark.skipif(not WC.is_file(), reason=f"shared data not found at {WC}")
def test_meta_eval_wikicontradict_on_real_rows(vllm_server, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("comprehensiveness:\n" + "".join(f"  {k}: {v}\n" for k, v in SMALL.items()))
    result = CliRunner().invoke(
        app,
        [
            "meta-eval",
            "wikicontradict",
            "--data",
            str(WC),
            "--limit",
            "2",
            "--method",
            "e2e",
            "--config",
            str(cfg),
            "--endpoint",
            vllm_server.base_url,
            "--model",
            vllm_server.served_name,
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
            "--resamples",
            "2000",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    lmr = json.loads((tmp_path / "run" / "lmr.json").read_text())
    assert lmr["n"] == 10  # 2 rows x 5 responses, failures included
    assert 0.0 <= lmr["lmr"] <= 1.0
    assert lmr["ci95"]["low"] <= lmr["lmr"] <= lmr["ci95"]["high"]
    assert sum(v["n"] for v in lmr["by_label"].values()) == 10
    # the annotators' grades the rows ship, against the label each score predicts
    shown = CliRunner().invoke(
        app, ["agreement", str(tmp_path / "run"), "--human-sample", "4", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.output)["runs"][0]
    label = found["dataset_labels"]["label"]
    assert label["units"] + label["not_decided"] == 10  # every response, scored or not
    assert sum(sum(row.values()) for row in label["confusion"].values()) == label["units"]
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    graded = [json.loads(line)["details"]["meta"]["label"] for line in lines]
    assert found["dataset_score_mean"][0] == pytest.approx(
        sum({"C": 1.0, "PC": 0.5, "I": 0.0}[g] for g in graded) / 10
    )


async def test_nli_method_with_cross_encoder_backend(vllm_server, tmp_path):
    from tests.support.tiny import build_tiny_classifier

    checkpoint = build_tiny_classifier(tmp_path / "nli")
    config = ComprehensivenessOptions(
        method="nli", nli_backend="cross-encoder", nli_model=str(checkpoint), t_rel=1.0, **SMALL
    )
    async with client_for(vllm_server) as client:
        record = await evaluate_item(client, ITEM, config)
    check_score(record)
    assert record.details["nli_backend"] == "cross-encoder"
    assert "nli" not in client.usage  # no LLM call judged a pair
    judged = record.details["pairs"]["judged"]
    assert record.usage.get("nli-cross-encoder", {}).get("calls", 0) == judged


def test_eli5_study_table(vllm_server, tmp_path):
    data = tmp_path / "eli5.jsonl"
    rows = [
        {"id": "q1", "query": ITEM.query, "contexts": ITEM.contexts},
        {"id": "q2", "query": "Why is the sky blue?", "contexts": ["Air scatters blue light."]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "evaluator:\n  max_tokens: 48\neli5:\n  metric:\n"
        + "".join(f"    {k}: {v}\n" for k, v in SMALL.items())
    )
    url = vllm_server.base_url
    result = CliRunner().invoke(
        app,
        [
            "eli5",
            str(data),
            "--responder",
            f"{vllm_server.served_name}@{url}",
            "--method",
            "e2e",
            "--config",
            str(cfg),
            "--endpoint",
            url,
            "--model",
            vllm_server.served_name,
            "--run-dir",
            str(tmp_path / "run"),
            "--quiet",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    study = json.loads((tmp_path / "run" / "study.json").read_text())
    assert study["runs"] == [f"answers-{vllm_server.served_name}", f"e2e-{vllm_server.served_name}"]
    table = study["combined"]
    row = table[vllm_server.served_name]
    assert row["questions"] == 2
    assert row["e2e"]["n"] + sum(row["e2e"]["not_scored"].values()) == row["answered"]
    answers = tmp_path / "run" / f"answers-{vllm_server.served_name}" / "results.jsonl"
    assert len(answers.read_text().splitlines()) == 2
    # report rebuilds the study table from the runs on disk, equal to what the study printed.
    report = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--json"])
    lines = [json.loads(line) for line in report.output.splitlines()]
    assert lines[-1] == {"study": str(tmp_path / "run"), "combined": table}
