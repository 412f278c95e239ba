"""Judgements labelled in Label Studio: ``labels export RUN tasks.json --stage S`` writes a task
per judgement of stage S, blind, with a labelling configuration whose control ``label`` fits the
stage's verdict (Choices of FanOutQA's A-F labels, a Number for CRUX's 0-5 ratings; ICAT's sets
in tests/test_cascade_icat.py); Label Studio's JSON export of those tasks, in the layout Label
Studio documents (``annotations[].result[]``: ``from_name``, ``to_name``, ``type``, ``value``),
comes back through ``labels import`` as judgement labels, each checked as the labelling page
checks it, all or nothing, and decides what a cascade abstained on."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.people.exchange import stage_label_config
from groundcover.pipelines.reports.people.labels import run_labels
from tests.test_cascade_ratings import calibration as rating_calibration
from tests.test_cascade_ratings import rated
from tests.test_cascade_run import calibration, cascade_run


def region(kind: str, value: dict, name: str = "label") -> dict:
    """One region of an annotation's ``result``, as Label Studio exports it."""
    return {
        "id": f"r-{name}",
        "from_name": name,
        "to_name": "asked",
        "type": kind,
        "origin": "manual",
        "value": value,
    }


def label_studio_export(tasks: list[dict], results: dict[int, list[dict]]) -> list[dict]:
    """Label Studio's JSON export of ``tasks`` (our import file): task k annotated by user 7
    with ``results[k]``, and a skipped annotation (cancelled, no result) on every task."""
    out = []
    for n, task in enumerate(tasks):
        annotations = [{"id": 900 + n, "completed_by": 8, "result": [], "was_cancelled": True}]
        if n in results:
            annotations.append(
                {
                    "id": 100 + n,
                    "completed_by": {"id": 7, "email": "p@example.org"},
                    "result": results[n],
                    "was_cancelled": False,
                    "ground_truth": False,
                    "created_at": "2026-12-06T09:00:00.000000Z",
                    "lead_time": 3.5,
                    "task": n,
                }
            )
        out.append({"id": n, "data": task["data"], "annotations": annotations, "project": 2})
    return out


def export(run_dir, out, stage):
    made = CliRunner().invoke(app, ["labels", "export", str(run_dir), str(out), "--stage", stage])
    assert made.exit_code == 0, made.output
    config = out.with_name(f"{out.stem}.label-config.xml")
    return json.loads(out.read_text()), ElementTree.fromstring(config.read_text())


def imported(run_dir, path):
    return CliRunner().invoke(app, ["labels", "import", str(run_dir), str(path)])


def test_fanoutqas_judgements_out_to_label_studio_and_back_decide_the_abstained_one(tmp_path):
    """Tier 2 without a threshold: f2's judgement is abstained (test_cascade_run). Its tasks
    are f1's and f2's judgements, blind, the control a single choice of A-F; a person's "C" for
    f2, exported by Label Studio, is imported and the same command scores f2 with it. A wrong
    annotation (two choices, a label not among A-F, a unit the item lacks) stops the import in
    one line naming the file, task, record and field, and nothing is imported."""
    cal = calibration(tmp_path / "cal.json", [0.6, None])
    whole, _ = cascade_run(tmp_path / "whole", cal)
    tasks, config = export(whole.dir, tmp_path / "tasks.json", "judge")
    data = [t["data"] for t in tasks]
    assert [(d["id"], d["stage"], d["key"]) for d in data] == [
        ("f1", "judge", 0),
        ("f2", "judge", 0),
    ]
    assert not {"verdict", "judge", "label", "value"} & set(data[0])  # blind
    asked = 'question: When did the tower open?\nreference: "1889"\nanswer: It opened in 1889.'
    assert (data[1]["answer"], data[1]["asked"]) == ("It opened in 1889.", asked)
    (choices,) = config.iter("Choices")
    assert (choices.get("name"), choices.get("toName")) == ("label", "asked")
    assert [c.get("value") for c in choices] == ["A", "B", "C", "D", "E", "F"]
    assert {t.get("name") for t in config.iter("Text")} >= {"input", "answer", "asked"}

    path = tmp_path / "project-2-at-2026-12-06.json"
    for result, said in [
        ([region("choices", {"choices": ["B", "C"]})], "task #1: record 'f2': field result"),
        ([region("choices", {"choices": ["Z"]})], "task #1: record 'f2': field label: one of"),
    ]:
        path.write_text(json.dumps(label_studio_export(tasks, {0: [], 1: result})))
        bad = imported(whole.dir, path)
        assert bad.exit_code != 0 and said in " ".join(bad.output.split()), bad.output
        assert not run_labels(whole.dir)
    wrong_key = [t | {"data": t["data"] | {"key": 3}} for t in tasks]
    path.write_text(
        json.dumps(label_studio_export(wrong_key, {1: [region("choices", {"choices": ["C"]})]}))
    )
    bad = imported(whole.dir, path)
    assert bad.exit_code != 0 and "field key: item 'f2' has no unit 3" in bad.output, bad.output
    assert not run_labels(whole.dir)

    note = region("textarea", {"text": ["the tower opened in 1889"]}, name="note")
    chosen = {1: [region("choices", {"choices": ["C"]}), note]}
    path.write_text(json.dumps(label_studio_export(tasks, chosen)))
    done = imported(whole.dir, path)
    assert done.exit_code == 0 and "labels: 1 added" in done.output, done.output
    assert run_labels(whole.dir) == {("f2", "judge", 0): "C"}
    (line,) = [
        json.loads(x) for x in (whole.dir / "labels" / "labels.jsonl").read_text().splitlines()
    ]
    assert (line["annotator"], line["note"], line["judge"]) == (
        "p@example.org",
        "the tower opened in 1889",
        None,  # the cascade kept no verdict for it
    )
    decided, _ = cascade_run(tmp_path / "whole", cal)
    f2 = {r.id: r for r in decided.results}["f2"]
    assert f2.details["judge"] == {"category": "C", "score": 1}
    assert (f2.details["cascade"][0]["kept"], f2.details["cascade"][0]["value"]) == ("people", "C")


def test_a_crux_rating_is_a_number_in_label_studio(tmp_path):
    """CRUX's abstained rating of p4 for Q2 (test_cascade_ratings): the control is a Number
    (whole ratings, no bound the run declares); a person's 4 comes back and scores the topic
    1.0, as rating it 4 in view does. A number given as text in the JSON is refused."""
    cal = rating_calibration(tmp_path / "cal.json", [0.6, None])
    outcome, _ = rated(tmp_path, cal)
    (record,) = outcome.results
    assert record.status == "unjudged"
    (key,) = [k for k, e in enumerate(record.details["cascade"]) if e["kept"] is None]
    tasks, config = export(outcome.dir, tmp_path / "tasks.json", "rate")
    (number,) = config.iter("Number")
    assert (number.get("name"), number.get("step"), number.get("max")) == ("label", None, None)
    (n,) = [n for n, t in enumerate(tasks) if t["data"]["key"] == key]
    assert "Q2?" in tasks[n]["data"]["asked"]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(label_studio_export(tasks, {n: [region("number", {"number": 4})]})))
    done = imported(outcome.dir, path)
    assert done.exit_code == 0, done.output
    assert run_labels(outcome.dir) == {("t1", "rate", key): 4.0}
    again, _ = rated(tmp_path, cal)
    (record,) = again.results
    assert (record.status, record.score) == ("ok", 1.0)


def test_the_configuration_keeps_a_labels_text_as_text():
    """A stage's labels may be what judges wrote (a Vote without declared labels): each is an
    attribute value, never markup, and reads back as written."""
    hostile = ['A"/><HyperText name="x" value="$asked"/><Choice value="', "<script>1</script>"]
    config = ElementTree.fromstring(stage_label_config({"kind": "labels", "choices": hostile}))
    assert [c.get("value") for c in config.iter("Choice")] == hostile
    assert not list(config.iter("HyperText")) and not list(config.iter("script"))


@pytest.mark.parametrize(
    ("how", "step", "low", "high"),
    [
        (
            {"kind": "number", "choices": [0.0, 0.5, 1.0], "low": 0.0, "high": 1.0},
            "any",
            "0.0",
            "1.0",
        ),
        ({"kind": "number", "choices": [1, 3, 5], "low": None, "high": None}, None, None, None),
        ({"kind": "number", "choices": [0.25, 2], "low": None, "high": None}, "any", None, None),
    ],
)
def test_a_numbers_control_takes_the_stages_range_and_steps(how, step, low, high):
    (number,) = ElementTree.fromstring(stage_label_config(how)).iter("Number")
    assert (number.get("step"), number.get("min"), number.get("max")) == (step, low, high)
