"""People's labels of a run: which items to label (`agreement --sample`: seeded, stratified by
the judge's verdict, with inclusion weights and the interval to expect), Label Studio and CSV out
and back in (the exact layouts Label Studio documents), labels kept apart from the records, two
writers at once, and the prediction-powered mean weighted by the draw."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
from groundcover.pipelines.reports.people.labels import (
    allocate,
    append_labels,
    draw,
    read_queue,
    run_labels,
    write_queue,
)
from groundcover.pipelines.runtime.contract.config import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult
from tests.support.scripted import ScriptedClient, field_of
from tests.test_runtime import run

# twelve items whose e2e coverage is 1.0, 0.5 or 0.0 by k % 3 (both, one, none of two covered)
COVERAGE = {
    0: "x\n[Covered statements]\n- A [1]\n- B [2]\n[Uncovered statements]\n",
    1: "x\n[Covered statements]\n- A [1]\n[Uncovered statements]\n- B [2]\n",
    2: "x\n[Covered statements]\n[Uncovered statements]\n- A [1]\n- B [2]\n",
}


def e2e_run(root, items: list[dict], coverage) -> Path:
    """A comprehensiveness run (e2e method) of ``items`` judged by ``coverage(prompt)``, in
    ``root / "run"``."""
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    options = ComprehensivenessOptions(
        input=data, method="e2e", summarise=False, export_graphs=False
    )
    client = ScriptedClient({"coverage": coverage}, check_constraints=False)
    run(COMPREHENSIVENESS, options, client, root / "run")
    return root / "run"


def judged_run(root):
    """Twelve comprehensiveness items judged by a scripted judge: i00, i03, ... score 1.0,
    i01, i04, ... 0.5, i02, i05, ... 0.0 (run directory ``root / "run"``)."""
    items = [
        {
            "id": f"i{k:02d}",
            "query": f"Question {k}?",
            "response": f"Answer {k}.",
            "contexts": ["c1.", "c2."],
        }
        for k in range(12)
    ]

    def coverage(prompt):
        k = int(field_of(prompt, "Answer").split()[1].rstrip("."))
        return COVERAGE[k % 3]

    return e2e_run(root, items, coverage)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    return judged_run(tmp_path_factory.mktemp("labels"))


def records(scores: dict[str, float | None]) -> list[ItemResult]:
    return [
        ItemResult(id=i, status="ok" if s is not None else "undefined", score=s, explanation="x")
        for i, s in scores.items()
    ]


def test_allocations_by_hand():
    sizes = {"0": 2, "1": 10}
    # proportional: 4 * 10/12 = 3.33 -> 3, 4 * 2/12 = 0.67 -> at least 1
    assert allocate(sizes, 4, "stratified") == {"0": 1, "1": 3}
    # balanced: as equal as the strata allow
    assert allocate(sizes, 4, "balanced") == {"0": 2, "1": 2}
    assert allocate(sizes, 7, "balanced") == {"0": 2, "1": 5}  # the small stratum is used up
    assert sum(allocate({"a": 5, "b": 5, "c": 5}, 4, "stratified").values()) == 4


def test_a_draw_is_seeded_stratified_and_weighted():
    scores = {f"a{k}": 1.0 for k in range(10)} | {"b0": 0.0, "b1": 0.0, "c": None}
    balanced = draw(records(scores), 4, "balanced", seed=3)
    by_stratum = {d.stratum: d.weight for d in balanced.items}
    assert by_stratum == {"1": 5.0, "0": 1.0}  # 10 items / 2 drawn, 2 / 2
    assert {d.id for d in balanced.items if d.stratum == "0"} == {"b0", "b1"}
    assert "c" not in {d.id for d in balanced.items}  # no score: nothing to compare a label to
    assert balanced.strata == {"0": {"items": 2, "drawn": 2}, "1": {"items": 10, "drawn": 2}}
    again = draw(records(scores), 4, "balanced", seed=3)
    assert [d.id for d in again.items] == [d.id for d in balanced.items]  # seeded
    # a simple random sample: every inclusion probability 4/12, every weight 3 (equal)
    assert {d.weight for d in draw(records(scores), 4, "random").items} == {3.0}
    # Kish's effective size of weights 5, 5, 1, 1: 12^2 / 52; half-width 1.96 s / sqrt(that)
    expect = balanced.expected_half_width(0.5)
    assert expect["effective"] == pytest.approx(144 / 52)
    assert expect["half_width"] == pytest.approx(1.959963984540054 * 0.5 / np.sqrt(144 / 52))
    many = {f"x{k}": k / 20 for k in range(20)}  # more than six values: quintile bands
    assert {d.stratum for d in draw(records(many), 10, "stratified").items} == {
        "q1",
        "q2",
        "q3",
        "q4",
        "q5",
    }
    with pytest.raises(UserError, match="--strategy must be one of random, stratified"):
        draw(records(scores), 4, "cluster")


def test_sample_writes_the_queue_once_and_says_the_interval_to_expect(judged):
    runner = CliRunner()
    done = runner.invoke(app, ["agreement", str(judged), "--sample", "6", "--seed", "1"])
    assert done.exit_code == 0, done.output
    assert "6 items (stratified, seed 1); 0: 2 of 4, 0.5: 2 of 4, 1: 2 of 4" in done.output
    assert "expected 95% interval at 6 labels" in done.output
    weights = read_queue(judged)
    assert weights is not None and len(weights) == 6 and set(weights.values()) == {2.0}
    again = runner.invoke(app, ["agreement", str(judged), "--sample", "6"])
    assert again.exit_code == 2 and "queue.jsonl exists" in again.output
    assert (judged / "results.jsonl").read_text().count("\n") == 12  # records untouched


def label_studio_export(tasks: list[dict], scores: dict[str, float]) -> list[dict]:
    """Label Studio's JSON export of those tasks as annotated: per task its id, data and
    annotations (result regions from the Number and TextArea controls, completed_by, times)."""
    out = []
    for n, task in enumerate(tasks, start=1):
        item = task["data"]["id"]
        annotations = []
        if item in scores:
            result = [
                {
                    "id": f"n{n}",
                    "from_name": "score",
                    "to_name": "answer",
                    "type": "number",
                    "origin": "manual",
                    "value": {"number": scores[item]},
                },
                {
                    "id": f"t{n}",
                    "from_name": "note",
                    "to_name": "answer",
                    "type": "textarea",
                    "origin": "manual",
                    "value": {"text": [f"checked {item}"]},
                },
            ]
            annotations.append(
                {
                    "id": 100 + n,
                    "completed_by": 7,
                    "result": result,
                    "was_cancelled": False,
                    "ground_truth": False,
                    "created_at": "2026-11-27T06:40:00.000000Z",
                    "updated_at": "2026-11-27T06:40:00.000000Z",
                    "lead_time": 4.2,
                    "task": n,
                }
            )
        # a skipped annotation: Label Studio keeps it, marked cancelled, with no result
        annotations.append({"id": 900 + n, "completed_by": 8, "result": [], "was_cancelled": True})
        out.append(
            {
                "id": n,
                "data": task["data"],
                "annotations": annotations,
                "predictions": [],
                "created_at": "2026-11-27T06:30:00.000000Z",
                "updated_at": "2026-11-27T06:40:00.000000Z",
                "project": 1,
            }
        )
    return out


def test_label_studio_out_and_back_and_the_weighted_mean(judged, tmp_path):
    runner = CliRunner()
    if read_queue(judged) is None:
        write_queue(judged, draw(list(_records(judged)), 6, "stratified", seed=1))
    tasks_file = tmp_path / "tasks.json"
    out = runner.invoke(app, ["labels", "export", str(judged), str(tasks_file)])
    assert out.exit_code == 0, out.output
    tasks = json.loads(tasks_file.read_text())
    assert [t["data"]["id"] for t in tasks] == list(read_queue(judged) or {})  # queue order
    first = tasks[0]["data"]
    assert set(first) == {"id", "input", "answer", "reference", "run"}  # blind: no verdict
    k = int(first["id"][1:])
    assert (first["input"], first["answer"]) == (f"Question {k}?", f"Answer {k}.")
    config = (tmp_path / "tasks.label-config.xml").read_text()
    assert '<Number name="score" toName="answer" min="0" max="1"' in config
    assert '<Text name="answer" value="$answer"/>' in config
    # four of the six labelled: the humans say 1.0 where the judge said 1.0 or 0.5, 0 else
    judge = {r.id: r.score for r in _records(judged)}
    chosen = [t["data"]["id"] for t in tasks][:4]
    human = {i: 1.0 if judge[i] >= 0.5 else 0.0 for i in chosen}
    export = tmp_path / "project-1-at-2026-11-27-06-41.json"
    export.write_text(json.dumps(label_studio_export(tasks, human)))
    back = runner.invoke(app, ["labels", "import", str(judged), str(export)])
    assert back.exit_code == 0 and "labels: 4 added" in back.output, back.output
    lines = [json.loads(x) for x in (judged / "labels" / "labels.jsonl").read_text().splitlines()]
    assert {(x["id"], x["label"], x["annotator"], x["note"]) for x in lines} == {
        (i, v, "7", f"checked {i}") for i, v in human.items()
    }
    assert all(x["judge"] == judge[x["id"]] for x in lines)  # the verdict beside each label
    found = json.loads(runner.invoke(app, ["agreement", str(judged), "--json"]).output)
    score = found["runs"][0]["score"]
    assert score["labelled"] == 4 and score["weighted"] is True
    import ppi_py

    weights = read_queue(judged) or {}
    rest = [judge[i] for i in sorted(judge) if i not in human]
    y = np.array([human[i] for i in chosen])
    f = np.array([judge[i] for i in chosen])
    w = np.array([weights[i] for i in chosen])
    expected = float(ppi_py.ppi_mean_pointestimate(y, f, np.array(rest), w=w).reshape(-1)[0])
    assert score["ppi"][0] == pytest.approx(expected)


def _records(run_dir):
    from groundcover.pipelines.runtime.store.run_dir import RESULTS, results_by_id

    return results_by_id(run_dir / RESULTS)


def test_a_csv_of_labels_and_its_one_line_errors(judged, tmp_path):
    runner = CliRunner()
    sheet = tmp_path / "labels.csv"
    done = runner.invoke(app, ["labels", "export", str(judged), str(sheet)])
    assert done.exit_code == 0, done.output
    lines = sheet.read_text().splitlines()
    assert lines[0] == "id,input,answer,reference,score,note,annotator"
    labelled = {unit[0] for unit in run_labels(judged)}  # by an earlier test of this run
    rows = [line.split(",") for line in lines[1:] if line.split(",")[0] not in labelled]
    header, first, second = lines[0], rows[0], rows[1]
    first[4], first[6] = "0.25", "ana"
    filled = tmp_path / "filled.csv"
    filled.write_text("\n".join([header, ",".join(first), ",".join(second)]) + "\n")
    before = len(run_labels(judged))
    back = runner.invoke(app, ["labels", "import", str(judged), str(filled)])
    assert back.exit_code == 0 and "labels: 1 added" in back.output  # the unlabelled row: none
    assert (
        run_labels(judged)[(first[0], "score", 0)] == 0.25 and len(run_labels(judged)) == before + 1
    )
    second[4] = "1.5"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([header, ",".join(second)]) + "\n")
    refused = runner.invoke(app, ["labels", "import", str(judged), str(bad)])
    assert refused.exit_code == 2
    assert (
        f"{bad}:2: record {second[0]!r}: field score: '1.5' is outside the score's 0-1 scale"
        in (refused.output)
    )


def test_two_writers_at_once_keep_every_label_and_annotators_combine(tmp_path):
    (tmp_path / "labels").mkdir()

    def write(who: str) -> None:
        for k in range(200):
            append_labels(
                tmp_path, [{"id": f"i{k}", "stage": "score", "label": 1.0, "annotator": who}]
            )

    writers = [threading.Thread(target=write, args=(who,)) for who in ("ana", "bo")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    lines = (tmp_path / "labels" / "labels.jsonl").read_text().splitlines()
    assert len(lines) == 400 and all(json.loads(x)["label"] == 1.0 for x in lines)
    # each annotator's latest label counts; two annotators' scores are averaged
    append_labels(tmp_path, [{"id": "i0", "stage": "score", "label": 0.0, "annotator": "bo"}])
    assert run_labels(tmp_path)[("i0", "score", 0)] == 0.5
    append_labels(tmp_path, [{"id": "j", "stage": "judge", "label": "B", "annotator": "ana"}])
    append_labels(tmp_path, [{"id": "j", "stage": "judge", "label": "C", "annotator": "bo"}])
    assert run_labels(tmp_path)[("j", "judge", 0)] == "B"  # a tie: the earliest given


def test_an_override_is_a_layer_shown_apart_and_reversible(judged, tmp_path):
    import shutil

    run_a, run_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(judged, run_a)
    shutil.copytree(judged, run_b)
    runner = CliRunner()
    before = (run_a / "results.jsonl").read_bytes()
    refused = runner.invoke(app, ["labels", "override", str(run_a), "i00", "--score", "0"])
    assert refused.exit_code == 2 and "an override needs a reason" in refused.output
    done = runner.invoke(
        app,
        ["labels", "override", str(run_a), "i00", "--score", "0", "--reason", "misses both"]
        + ["--annotator", "ana"],
    )
    assert done.exit_code == 0, done.output
    assert (run_a / "results.jsonl").read_bytes() == before  # a layer, never a rewrite
    # the judge: 4 x 1.0, 4 x 0.5, 4 x 0.0 -> 0.5; i00 (1.0) overridden to 0 -> 5/12
    shown = json.loads(runner.invoke(app, ["report", str(run_a), "--json"]).output)
    assert shown["summary"]["mean_score"] == pytest.approx(0.5)
    assert shown["overrides"] == {
        "overrides": 1,
        "judge_mean": pytest.approx(0.5),
        "overridden_mean": pytest.approx(5 / 12),
        "overridden_scored": 12,
    }
    text = runner.invoke(app, ["report", str(run_a)], env={"COLUMNS": "200"}).output
    assert "overridden by people: 1 items; judge's mean 0.5000, with the overrides 0.4167" in text
    from groundcover.pipelines.reports.pages.report_html import render

    assert "overridden by people: <b>1</b> items" in render([run_a])
    compared = runner.invoke(app, ["compare", str(run_a), str(run_b)], env={"COLUMNS": "200"})
    assert compared.exit_code == 0, compared.output
    assert "A: overridden by people: 1 items" in compared.output
    assert "B: overridden" not in compared.output
    back = runner.invoke(app, ["labels", "override", str(run_a), "i00", "--withdraw"])
    assert back.exit_code == 0, back.output
    assert "overrides" not in json.loads(
        runner.invoke(app, ["report", str(run_a), "--json"]).output
    )
    history = (run_a / "labels" / "overrides.jsonl").read_text().splitlines()
    assert len(history) == 2  # the override and its withdrawal: the history stays


def test_the_length_audit_by_hand(tmp_path):
    # nine answers of 1..9 words; the judge covers none of the shortest three, one of two of
    # the middle three and both of the longest three: scores 0, 0.5, 1 by length
    items = [
        {
            "id": f"n{k}",
            "query": "Q?",
            "response": " ".join(["w"] * (k + 1)),
            "contexts": ["c1.", "c2."],
        }
        for k in range(9)
    ]

    def coverage(prompt):
        size = len(field_of(prompt, "Answer").split())
        return COVERAGE[2 if size <= 3 else 1 if size <= 6 else 0]

    e2e_run(tmp_path, items, coverage)
    # humans say 0.5 for n0, n4, n8: the judge's error -0.5, 0, +0.5 grows with length too
    human = tmp_path / "human.jsonl"
    human.write_text(
        "".join(
            json.dumps({"id": i, "stage": "score", "label": 0.5}) + "\n" for i in ("n0", "n4", "n8")
        )
    )
    done = CliRunner().invoke(
        app, ["agreement", str(tmp_path / "run"), "--bias", "--human", str(human), "--json"]
    )
    assert done.exit_code == 0, done.output
    (audit,) = json.loads(done.output)["bias"]
    # Spearman = Pearson of ranks: scores ranked [2,2,2,5,5,5,8,8,8] against 1..9:
    # cov 54, sums of squares 54 and 60 -> rho = 54 / sqrt(54 * 60) = sqrt(0.9)
    assert audit["score"]["spearman"] == pytest.approx(0.9**0.5)
    assert (audit["score"]["shortest_third"], audit["score"]["longest_third"]) == (0.0, 1.0)
    assert audit["score"]["units"] == 9 and audit["error"]["spearman"] == pytest.approx(1.0)
    shown = CliRunner().invoke(app, ["agreement", str(tmp_path / "run"), "--bias"])
    assert "score: Spearman rho with length +0.949" in shown.output
    assert "shortest third 0.0000, longest third 1.0000" in shown.output


def test_a_judge_of_the_answering_models_family_is_said():
    from groundcover.pipelines.reports.audits.bias import family, same_family

    assert family("meta-llama/Llama-3.1-8B-Instruct") == "llama"
    assert family("Qwen2.5-72B-Instruct") == "qwen"
    roles = {
        "answer": {"request_model": "Qwen2.5-7B-Instruct"},
        "judge": {"request_model": "Qwen/Qwen2.5-72B-Instruct"},
        "judge#2": {"request_model": "gpt-oss-20b"},
    }
    assert same_family(roles) == [
        {"system": "Qwen2.5-7B-Instruct", "judge": "Qwen/Qwen2.5-72B-Instruct", "role": "judge"}
        | {"family": "qwen"}
    ]
