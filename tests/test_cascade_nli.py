"""An NLI model as the first tier of an entailment stage (``--cascade``): comprehensiveness'
pairs are scored by a real cross-encoder (a tiny DeBERTa built here), and the judge is asked
exactly for the pairs whose probability is below the model's threshold. The model's labels and
probabilities are recorded for calibration, the calibration knows the model by content, a pair
no tier keeps leaves the item unjudged until people label it, and another model is refused."""

from __future__ import annotations

import json

import pytest

from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.cascades import write_calibration, write_digested
from tests.support.scripted import ScriptedClient, field_of, label
from tests.test_exact_scores import C1, C2, ITEM, NLI_SCRIPTS, R1
from tests.test_runtime import closing_client

URL = "http://127.0.0.1:9/v1"
# ITEM's relevant context atoms (C1's third is not), and its 20 ordered pairs: C->R, R->C, C->C
CONTEXT = [C1[0], C1[1], C2[0], C2[1]]
PAIRS = [(c, R1) for c in CONTEXT] + [(R1, c) for c in CONTEXT]
PAIRS += [(a, b) for a in CONTEXT for b in CONTEXT if a != b]
ENTAILING = {(R1, C1[0]), (C1[0], R1), (C1[0], C2[1])}  # what NLI_SCRIPTS' judge says


def judge_says(pair: tuple[str, str]) -> str:
    return "entailment" if pair in ENTAILING else "neutral"


def digests() -> dict[str, tuple[str, str]]:
    """Each pair by the digest of what its judgement asks."""
    from groundcover.pipelines.runtime.contract.panels import asked_digest

    return {asked_digest({"premise": p, "hypothesis": h}): (p, h) for p, h in PAIRS}


def judge_label(prompt: str):
    """The strong judge's NLI_SCRIPTS label, with its token's logprob (certain)."""
    return label({NLI_SCRIPTS["nli"](prompt): 1.0})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.support.tiny import build_tiny_classifier

    where = tmp_path_factory.mktemp("nli")
    return build_tiny_classifier(where / "a"), build_tiny_classifier(where / "b", seed=1)


def run(where, nli_model=None, cascade=None, confidence=None):
    """ITEM through comprehensiveness' NLI method, the strong judge scripted (atoms, relevance,
    and NLI where it is asked), the pairs scored by ``nli_model`` when given."""
    where.mkdir(parents=True, exist_ok=True)
    items = where / "items.jsonl"
    items.write_text(json.dumps(ITEM.model_dump()) + "\n")
    strong = ScriptedClient(dict(NLI_SCRIPTS, nli=judge_label), model="strong")
    backend = {"nli_backend": "cross-encoder", "nli_model": str(nli_model)} if nli_model else {}
    roles = parse_role_options([f"judge=strong@{URL}"])
    request = RunRequest(
        EvaluatorConfig(model="strong", endpoint=URL),
        RunConfig(run_dir=where / "run", cache=None, cascade=cascade, confidence=confidence),
        ComprehensivenessOptions(input=items, protocol="spec", method="nli", **backend),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = lambda ev, run_dir: closing_client(strong)  # noqa: E731
    (outcome,) = execute(COMPREHENSIVENESS, request, quiet=True, open_client=opened).values()
    return outcome, strong


def model_digest(checkpoint) -> str:
    from groundcover.serving.content import model_content

    return str(model_content(str(checkpoint))["revision"])


def calibration(path, checkpoint, thresholds):
    """Tier 1 the NLI model (by content), tier 2 the strong judge alone (its share is 1)."""
    tiers = [(["nli"], [model_digest(checkpoint)]), (["judge"], ["strong"])]
    stages = {"nli": {"thresholds": thresholds, "confidence": ["nli", "share"]}}
    return write_calibration(path, tiers, stages)


def model_says(checkpoint, pairs):
    """The cross-encoder's own (label, probability) of each pair, asked directly."""
    from groundcover.retrieval.nli import CANONICAL, NliScorer

    rows = NliScorer(str(checkpoint)).probabilities(pairs)
    return {
        p: (CANONICAL[row.argmax()], float(row.max())) for p, row in zip(pairs, rows, strict=True)
    }


def test_the_nli_model_is_recorded_and_calibrated_as_tier_1_known_by_content(tmp_path, checkpoints):
    """Run with the cross-encoder and --confidence logprobs: each of the 20 pairs' label and
    probability is recorded (kind nli) as the model gives them; `cascade calibrate CE LLM`
    makes tier 1 the model, known by its checkpoint's digest, confidence kind nli."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.audits.cascade import read_tier
    from groundcover.pipelines.runtime.contract.cascade import read_cascade

    model, _ = checkpoints
    ce, strong = run(tmp_path / "ce", nli_model=model, confidence="logprobs")
    (record,) = ce.results
    assert record.status == "ok", record.failure
    assert strong.stage_calls("nli") == []  # the model scored every pair
    entries = record.details["confidence"]
    assert len(entries) == 20 and {e["kind"] for e in entries} == {"nli"}
    said, pair_of = model_says(model, PAIRS), digests()
    assert {pair_of[e["asked"]] for e in entries} == set(PAIRS)
    for entry in entries:
        expected_label, probability = said[pair_of[entry["asked"]]]
        assert entry["value"] == expected_label
        assert entry["confidence"] == pytest.approx(probability, abs=1e-5)
    tier = read_tier(ce.dir, None)
    assert tier.kinds["nli"] == "nli" and tier.members == ["nli"]
    assert tier.models == [model_digest(model)]
    # the model's judgements are people's to label, as a judge's are: exported, imported
    from groundcover.pipelines.reports.pages.viewer import Viewer
    from groundcover.pipelines.reports.people.labels import run_labels

    units = Viewer([ce.dir]).units(0, "nli")
    assert [(item, key) for item, key, _ in units] == [("tower", k) for k in range(20)]
    sheet = tmp_path / "pairs.csv"
    exported = ["labels", "export", str(ce.dir), str(sheet), "--stage", "nli"]
    assert CliRunner().invoke(app, exported).exit_code == 0
    rows = sheet.read_text().splitlines()
    assert len(rows) == 21 and rows[0].startswith("id,stage,key,")
    first = entries[0]["value"]
    labelled = tmp_path / "labelled.csv"
    labelled.write_text(f"id,stage,key,label\ntower,nli,0,{first}\n")
    back = CliRunner().invoke(app, ["labels", "import", str(ce.dir), str(labelled)])
    assert back.exit_code == 0, back.output
    assert run_labels(ce.dir) == {("tower", "nli", 0): first}
    assert read_tier(ce.dir, None).labels == {("tower", "nli", entries[0]["asked"]): first}

    llm, _ = run(tmp_path / "llm", confidence="logprobs")
    human = tmp_path / "human.jsonl"
    (judged,) = llm.results
    human.write_text(
        "".join(
            json.dumps({"id": "tower", "stage": "nli", "key": k, "label": e["value"]}) + "\n"
            for k, e in enumerate(judged.details["confidence"])
        )
    )
    argv = ["cascade", "calibrate", str(ce.dir), str(llm.dir), "--human", str(human)]
    made = CliRunner().invoke(app, [*argv, "--check-share", "0", "--json"])
    assert made.exit_code == 0, made.output
    found = json.loads(made.output)
    assert found["tiers"][0]["members"] == ["nli"]
    assert found["tiers"][0]["models"] == [model_digest(model)]
    assert found["stages"]["nli"]["confidence"] == ["nli", "logprobs"]
    assert found["stages"]["nli"]["calibration"]["units"] == 20
    cascade = read_cascade(tmp_path / "llm" / "run" / found["file"].split("/run/")[-1])
    assert cascade.nli_model == model_digest(model) and cascade.members == 1
    # a run of the model that recorded no confidence: nothing to calibrate, no file written
    bare, _ = run(tmp_path / "bare", nli_model=model)
    written = sorted((llm.dir / "cascade").glob("calibration-*.json"))
    nothing = CliRunner().invoke(app, ["cascade", "calibrate", str(bare.dir), str(llm.dir)])
    assert nothing.exit_code != 0 and "with --confidence logprobs" in nothing.output
    assert sorted((llm.dir / "cascade").glob("calibration-*.json")) == written
    # the model's run second: refused, the model is tier 1
    wrong = CliRunner().invoke(app, ["cascade", "calibrate", str(llm.dir), str(ce.dir)])
    assert wrong.exit_code != 0 and "NLI model" in wrong.output


def test_the_judge_is_asked_exactly_for_the_pairs_below_the_models_threshold(tmp_path, checkpoints):
    """Threshold: the median of the model's 20 probabilities. The pairs at or above it keep the
    model's label; the judge is asked for the others alone, and its label is theirs."""
    from groundcover.pipelines.reports.audits.cascade import run_cascade

    model, _ = checkpoints
    probe, _ = run(tmp_path / "probe", nli_model=model, confidence="logprobs")
    probabilities = sorted(e["confidence"] for e in probe.results[0].details["confidence"])
    threshold = (probabilities[9] + probabilities[10]) / 2
    assert probabilities[9] < threshold < probabilities[10]  # ten above, ten below
    cal = calibration(tmp_path / "cal.json", model, [threshold, 1.0])
    outcome, strong = run(tmp_path / "cascaded", nli_model=model, cascade=cal)
    (record,) = outcome.results
    assert record.status == "ok", record.failure
    said, pair_of = model_says(model, PAIRS), digests()
    below = {p for p, (_, prob) in said.items() if prob < threshold}
    assert len(below) == 10
    calls = strong.stage_calls("nli")
    assert len(calls) == 10
    assert {
        (field_of(c.prompt, "Premise"), field_of(c.prompt, "Hypothesis")) for c in calls
    } == below
    entries = record.details["cascade"]
    assert len(entries) == 20
    for entry in entries:
        pair = pair_of[entry["asked"]]
        step = entry["tiers"][0]
        assert (step["tier"], step["value"]) == (1, said[pair][0])
        assert step["confidence"] == pytest.approx(said[pair][1], abs=1e-5)
        if pair in below:  # escalated: the judge's label is the verdict
            assert (entry["kept"], entry["value"]) == (2, judge_says(pair))
        else:
            assert (entry["kept"], entry["value"]) == (1, said[pair][0])
    found = run_cascade(outcome.dir, outcome.results)
    assert found is not None and found["members"] == ["NLI model", "1"]
    nli = found["stages"]["nli"]
    assert (nli["asked"], nli["kept"], nli["abstained"]) == ([20, 10], [10, 10], 0)
    assert nli["calls"] == [20, 10] and nli["tokens"][0] == 0
    # the judge's calls against the judge alone; the model's pairs said apart (no request)
    assert (nli["calls_total"], nli["model_scored"]) == (10, 20)
    assert (nli["calls_strongest_alone"], nli["strongest_asked_share"]) == (20, 0.5)


def test_a_pair_no_tier_keeps_leaves_the_item_unjudged_until_people_label_it(tmp_path, checkpoints):
    """Tier 2 without a threshold: the ten pairs below the model's threshold are abstained,
    every one recorded (not only the first), and the item is unjudged; once people label all
    ten, the same command scores the item, the labels deciding those pairs."""
    from groundcover.pipelines.reports.people.labels import append_labels

    model, _ = checkpoints
    probe, _ = run(tmp_path / "probe", nli_model=model, confidence="logprobs")
    probabilities = sorted(e["confidence"] for e in probe.results[0].details["confidence"])
    threshold = (probabilities[9] + probabilities[10]) / 2
    cal = calibration(tmp_path / "cal.json", model, [threshold, None])
    outcome, strong = run(tmp_path / "cascaded", nli_model=model, cascade=cal)
    (record,) = outcome.results
    assert (record.status, record.score) == ("unjudged", None)
    assert record.failure is not None and record.failure.stage == "nli"
    entries = record.details["cascade"]
    abstained = [k for k, e in enumerate(entries) if e["kept"] is None]
    assert len(abstained) == 10 and len(strong.stage_calls("nli")) == 10
    # the labelling page shows the person each abstained pair, as the judge read it
    from groundcover.pipelines.reports.pages.viewer import Viewer

    viewer, pair_of = Viewer([outcome.dir]), digests()
    for k in abstained:
        premise, hypothesis = pair_of[entries[k]["asked"]]
        shown = viewer.unit(0, "tower", "nli", k)["judged"]
        assert shown == {"premise": premise, "hypothesis": hypothesis}
    assert all("values" not in e for e in entries if e["kept"] is not None)  # by digest only
    labels = [
        {"id": "tower", "stage": "nli", "key": k, "label": "neutral", "annotator": "p"}
        | {"judge": None, "source": "view"}
        for k in abstained
    ]
    append_labels(outcome.dir, labels)
    again, _ = run(tmp_path / "cascaded", nli_model=model, cascade=cal)
    (record,) = again.results
    assert record.status == "ok" and record.score is not None
    kept = [e["kept"] for e in record.details["cascade"]]
    assert sorted(kept, key=str) == sorted([1] * 10 + ["people"] * 10, key=str)


def test_another_nli_model_or_none_is_refused(tmp_path, checkpoints):
    model, other = checkpoints
    cal = calibration(tmp_path / "cal.json", model, [0.5, 1.0])
    with pytest.raises(UserError, match="its tier 1 is the NLI model sha256:"):
        run(tmp_path / "other", nli_model=other, cascade=cal)
    with pytest.raises(UserError, match="scores no pair with one"):
        run(tmp_path / "llm", cascade=cal)


def test_an_nli_tier_is_tier_1_with_its_one_model_and_the_nli_confidence(tmp_path, checkpoints):
    """A calibration whose NLI model is not tier 1, or whose stage gives tier 1 another kind of
    confidence, is refused in one line naming the field."""
    from groundcover.pipelines.runtime.contract.cascade import read_cascade

    model, _ = checkpoints
    made = json.loads(calibration(tmp_path / "cal.json", model, [0.5, 1.0]).read_text())
    cascade = read_cascade(tmp_path / "cal.json")
    assert cascade.tier_numbers() == [[], [1]] and cascade.kinds("nli") == ("nli", "share")
    assert cascade.identity()["nli_model"] == model_digest(model)

    def refused(changed, field):
        write_digested(tmp_path / "bad.json", changed)
        with pytest.raises(UserError, match=rf"bad.json: record: field '{field}'"):
            read_cascade(tmp_path / "bad.json")

    second = json.loads(json.dumps(made))
    second["tiers"].reverse()
    refused(second, r"tiers\[1\]")
    share = json.loads(json.dumps(made))
    share["stages"]["nli"]["confidence"] = ["share", "share"]
    refused(share, r"stages\.nli\.confidence")
