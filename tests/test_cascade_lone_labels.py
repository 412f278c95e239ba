"""Every kind of confidence is labelled where labels are given: a lone judge run with
``--confidence logprobs`` has its judgements as units of ``labels export --stage`` (CSV and
Label Studio), ``labels import`` and ``view``'s labelling page, as a panel's are, and what people
give there is what ``cascade calibrate`` calibrates that judge on."""

from __future__ import annotations

import csv
import json

from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.audits.cascade import read_tier
from groundcover.pipelines.reports.pages.viewer import Viewer
from groundcover.pipelines.reports.people.labels import run_labels
from tests.test_cascade_confidence import lone_run
from tests.test_label_studio_judgements import export, imported, label_studio_export, region


def test_a_lone_judges_judgements_are_exported_imported_and_labelled_in_view(tmp_path):
    """The strong judge alone says B for f1 (0.95) and C for f2 (0.7); f3 has no answer. Its
    two judgements are the units of stage judge: exported blind as a CSV (what it was asked,
    the labels A-F; not its verdict), labelled B and D and imported; in Label Studio, a Choices
    control of A-F, f2 labelled E by a second person; in view, f1 labelled A by a third. The
    calibration reads each person's label onto the judgement it labels."""
    run = lone_run(tmp_path / "alone", 0.7)
    viewer = Viewer([run.dir])
    assert viewer.units(0, "judge") == [("f1", 0, "B"), ("f2", 0, "C")]
    assert viewer.choices(0, "judge")["kind"] == "labels"
    sheet = tmp_path / "judged.csv"
    made = CliRunner().invoke(
        app, ["labels", "export", str(run.dir), str(sheet), "--stage", "judge"]
    )
    assert made.exit_code == 0, made.output
    with open(sheet, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["id"], r["stage"], r["key"]) for r in rows] == [
        ("f1", "judge", "0"),
        ("f2", "judge", "0"),
    ]
    assert "Marseille" in rows[0]["asked"] and rows[0]["label"] == ""
    assert "one of: A, B, C, D, E, F" in rows[0]["choose"]
    assert "judge" not in rows[0] and "value" not in rows[0]  # blind: no verdict in it
    rows[0]["label"], rows[1]["label"] = "B", "D"
    with open(sheet, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert imported(run.dir, sheet).exit_code == 0
    assert run_labels(run.dir) == {("f1", "judge", 0): "B", ("f2", "judge", 0): "D"}

    tasks, config = export(run.dir, tmp_path / "tasks.json", "judge")
    assert [t["data"]["id"] for t in tasks] == ["f1", "f2"]
    choices = config.find("Choices")
    assert choices is not None and choices.get("name") == "label"
    assert [c.get("value") for c in choices.findall("Choice")] == list("ABCDEF")
    studio = tmp_path / "studio.json"
    studio.write_text(
        json.dumps(label_studio_export(tasks, {1: [region("choices", {"choices": ["E"]})]}))
    )
    assert imported(run.dir, studio).exit_code == 0
    body = {"id": "f1", "stage": "judge", "key": 0, "label": "A", "annotator": "third"}
    assert viewer.add_label(0, body) == {"id": "f1", "key": 0, "label": "A", "judge": "B"}
    queue = viewer.queue(0, "third", "judge")
    assert queue["items"][0] == {"id": "f1", "key": 0, "label": "A", "judge": "B"}
    assert "label" not in queue["items"][1]  # blind until this annotator labels it
    people = run_labels(run.dir)
    assert people[("f2", "judge", 0)] == "D"  # D and E, one each: the earliest given
    tier = read_tier(run.dir, None)
    asked = {r.id: r.details["confidence"][0]["asked"] for r in run.results if r.id != "f3"}
    assert tier.labels == {
        ("f1", "judge", asked["f1"]): people[("f1", "judge", 0)],
        ("f2", "judge", asked["f2"]): "D",
    }
