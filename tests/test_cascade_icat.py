"""ICAT's alignments as verdicts: the set of aspects a response's grounded claims cover. A panel
covers an aspect where a strict majority of its members do (``Cover``); a cascade keeps an
alignment where a tier agrees on the whole set and escalates it elsewhere; one no tier keeps
leaves the response unjudged until a person gives the covered aspects in ``view``.

The inputs are test_icat's (ICAT-S): response A:q1 has one grounded claim (C1) and q1's three
subtopics (2, 5, 7) as aspects 1-3; A:q2 has one grounded claim (C4) and q2's one aspect. The
cheap three align A:q1 as {3}, {3}, {1, 3} (the panel's set {3}: 2 of 3 gave it) and A:q2 as
{1} unanimously. The strong judge aligns A:q1 as {1, 3}."""

from __future__ import annotations

import csv

import pytest

from groundcover.pipelines.icat.scoring import Alignment
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.panels import (
    Cover,
    cover_items,
    cover_label,
    verdict_of,
)
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.cascades import write_calibration
from tests.support.scripted import ScriptedClient, field_of
from tests.test_icat import (
    C1,
    P_ENTAIL,
    SCRIPTS,
    StandInIcat,
    inputs_options,
    write_inputs,
)
from tests.test_runtime import closing_client

URL = "http://127.0.0.1:9/v1"
LINE = '{{"topic_id": {}, "evidence": [1]}}\n'
ALIGNS = {  # member -> query -> the aspects it finds covered (each by grounded claim 1)
    "c1": {"eiffel tower": [3], "big ben": [1]},
    "c2": {"eiffel tower": [3], "big ben": [1]},
    "c3": {"eiffel tower": [1, 3], "big ben": [1]},
    "strong": {"eiffel tower": [1, 3], "big ben": [1]},
}
CHEAP, STRONG = ["c1", "c2", "c3"], "strong"


def calibration(path, thresholds):
    tiers = [(["judge", "judge#2", "judge#3"], CHEAP), (["judge"], [STRONG])]
    return write_calibration(path, tiers, {"align_s": {"thresholds": thresholds}})


def aligned(where, cascade=None, judges=(*CHEAP, STRONG), samples=0, simulated=False):
    """ICAT-S over test_icat's inputs, the claims from a scripted extractor, each judge aligning
    from its table (the stage is the member's own: align_s#2 for judge#2); ``samples``: that
    many more members, each the last judge told apart by a revision label."""
    where.mkdir(parents=True, exist_ok=True)
    options = inputs_options(write_inputs(where), variants=["s"])
    clients = {"extractor": ScriptedClient(SCRIPTS, adapter="claims-lora")}
    for name in judges:

        def script(prompt, found=ALIGNS[name]):
            return "".join(LINE.format(n) for n in found[field_of(prompt, "Query")])

        stages = [f"align_s#{k}" for k in range(2, len(judges) + samples + 1)]
        clients[name] = ScriptedClient({s: script for s in ["align_s", *stages]}, model=name)
    roles = {"extract": RoleSpec(adapter="claims-lora")}
    parsed = parse_role_options([f"judge={j}@{URL}" for j in judges])
    roles |= {role: RoleSpec.model_validate(spec) for role, spec in parsed.items()}
    for k in range(len(judges) + 1, len(judges) + samples + 1):
        spec = {"model": judges[-1], "endpoint": URL, "revision": f"sample-{k}"}
        roles[f"judge#{k}"] = RoleSpec.model_validate(spec)
    request = RunRequest(
        EvaluatorConfig(model=judges[-1], endpoint=URL),
        RunConfig(
            run_dir=where / "run", cache=None, cascade=cascade, simulated_annotators=simulated
        ),
        options,
        roles,
    )

    def opened(ev, run_dir):
        return closing_client(clients["extractor" if ev.adapter else ev.model])

    framework = StandInIcat(P_ENTAIL)
    (outcome,) = execute(framework, request, quiet=True, open_client=opened).values()
    return outcome, clients


def test_a_panel_covers_an_aspect_a_strict_majority_of_its_members_cover():
    """Three members: aspect 1 named by two (kept, its evidence theirs in member order), 2 by
    one, 3 by one. Four with one unanswered: aspects named by two of four are ties, left out."""
    rule = Cover(kind=Alignment)
    three = [
        Alignment.from_covers({2: [1], 1: [1]}),
        Alignment.from_covers({1: [2]}),
        Alignment.from_covers({3: [1]}),
    ]
    combined, tie = rule.combine(three)
    assert (combined.covered, combined.evidence, tie) == ([1], {1: [1, 2]}, False)
    assert rule.label(combined) == "1" and [rule.label(a) for a in three] == ["1, 2", "1", "3"]
    four = [Alignment.from_covers({1: [1]}), Alignment.from_covers({1: [2], 2: [1]})]
    four += [Alignment.from_covers({2: [1]}), None]
    combined, tie = rule.combine(four)
    assert (combined.covered, tie, rule.label(combined)) == ([], True, "none")
    assert rule.combine([None, None]) == (None, False)
    assert rule.answer("3, 1").covers() == {1: [], 3: []}
    assert verdict_of(rule) == "set"
    assert cover_label([3, 1, 3]) == "1, 3" and cover_label([]) == "none"
    assert cover_items(" 3,1 ") == [1, 3] and cover_items("None") == [] and cover_items([2]) == [2]
    for bad in ("0", "1, x", "1 3", True, 2, [True]):
        with pytest.raises(ValueError, match="a set such as"):
            cover_items(bad)


def test_an_icat_panel_aligns_by_majority_and_is_a_calibratable_tier(tmp_path):
    """No cascade: the three cheap judges are one panel. A:q1's set is {3} (subtopic 7): S_cov
    1/3, S_fact 1/3, ICAT_1 1/3; the entry keeps each member's set as its label. ``cascade
    calibrate`` reads the run as a tier: A:q1's confidence 2/3, A:q2's 1; a person's set written
    "3,1" is read as "1, 3"."""
    from groundcover.pipelines.reports.audits.cascade import read_tier

    outcome, clients = aligned(tmp_path, judges=tuple(CHEAP))
    records = {r.id: r for r in outcome.results}
    a1 = records["A:q1"]
    assert a1.status == "ok", a1.failure
    s = a1.details["variants"]["s"]
    assert s["covered"] == ["7"] and s["evidence"] == {"7": [C1]}
    assert s["s_cov"] == pytest.approx(1 / 3) and a1.score == pytest.approx(1 / 3)
    (entry,) = a1.details["panel"]
    assert entry["stage"] == "align_s"
    assert (entry["members"], entry["value"]) == (["3", "3", "1, 3"], "3")
    assert records["A:q2"].details["variants"]["s"]["s_cov"] == 1.0
    assert [len(clients[c].calls) for c in CHEAP] == [2, 2, 2]  # A:q1 and A:q2 each

    tier = read_tier(outcome.dir, {("A:q1", "align_s", 0): "3,1"})
    shares = sorted(share for _, share in tier.units["align_s"].values())
    assert shares == pytest.approx([2 / 3, 1.0])
    assert list(tier.labels.values()) == ["1, 3"]


def test_the_strong_judge_aligns_only_what_the_cheap_panel_splits_on(tmp_path):
    """Tier 1 kept only where unanimous (threshold 1.0): A:q2's {1} is kept; A:q1's {3} (2 of
    3) goes to the strong judge, whose {1, 3} is kept: subtopics 2 and 7, S_cov 2/3, ICAT_1
    2·(1/3)(2/3)/(1/3 + 2/3) = 4/9, where the cheap panel's set would have given 1/3."""
    cal = calibration(tmp_path / "cal.json", [1.0, 0.5])
    outcome, clients = aligned(tmp_path, cal)
    records = {r.id: r for r in outcome.results}
    a1, a2 = records["A:q1"], records["A:q2"]
    assert a1.status == "ok", a1.failure
    (asked,) = clients[STRONG].calls
    assert asked.stage == "align_s#4" and field_of(asked.prompt, "Query") == "eiffel tower"
    assert [len(clients[c].calls) for c in CHEAP] == [2, 2, 2]
    (entry,) = a1.details["cascade"]
    assert [t["members"] for t in entry["tiers"]] == [["3", "3", "1, 3"], ["1, 3"]]
    assert [t["confidence"] for t in entry["tiers"]] == pytest.approx([2 / 3, 1.0])
    assert (entry["kept"], entry["value"]) == (2, "1, 3")
    s = a1.details["variants"]["s"]
    assert s["covered"] == ["2", "7"] and s["evidence"] == {"2": [C1], "7": [C1]}
    assert s["s_cov"] == pytest.approx(2 / 3) and a1.score == pytest.approx(4 / 9)
    (entry,) = a2.details["cascade"]
    assert (entry["kept"], entry["value"], len(entry["tiers"])) == (1, "1", 1)
    assert a2.score == 1.0


def test_the_report_says_what_the_alignment_cascade_kept_saved_and_abstained(tmp_path):
    """The run above: tier 1 asked both alignments (3 calls each), kept A:q2's; tier 2 asked
    and kept A:q1's: 7 calls against 2 for the strong judge alone. A person in ``view`` gives
    A:q1 the covered aspects "3, 1": the kept {1, 3} agrees."""
    import json

    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.pages.viewer import Viewer

    cal = calibration(tmp_path / "cal.json", [1.0, 0.5])
    outcome, _ = aligned(tmp_path, cal)
    body = {"id": "A:q1", "stage": "align_s", "key": 0, "annotator": "p", "label": "3, 1"}
    viewer = Viewer([outcome.dir])
    assert viewer.add_label(0, body)["judge"] == "1, 3"
    # a kept alignment shows what it was asked (found again by the framework's judgements)
    assert viewer.unit(0, "A:q1", "align_s", 0)["judged"]["claims"] == f"[1] {C1}"
    shown = CliRunner().invoke(app, ["report", str(outcome.dir), "--json"])
    assert shown.exit_code == 0, shown.output
    stage = json.loads(shown.output.splitlines()[-1])["cascade"]["stages"]["align_s"]
    assert {k: stage[k] for k in ("asked", "kept", "calls")} == {
        "asked": [2, 1],
        "kept": [1, 1],
        "calls": [6, 1],
    }
    assert (stage["judgements"], stage["abstained"], stage["coverage"]) == (2, 0, 1.0)
    assert (stage["calls_total"], stage["calls_strongest_alone"]) == (7, 2)
    assert (stage["labelled"], stage["agreeing"]) == (1, 1)


def test_an_alignment_no_tier_keeps_is_given_by_a_person_in_view(tmp_path):
    """Tier 2 without a threshold: A:q1 is unjudged, its aspects and claims shown numbered as
    the prompt numbered them. A person's "3,1" is kept as "1, 3" (a set of no aspect 0 or
    words is refused); the same command then scores A:q1 with it: S_cov 2/3, ICAT_1 4/9."""
    from groundcover import UserError
    from groundcover.pipelines.reports.pages.viewer import Viewer, label_page

    cal = calibration(tmp_path / "cal.json", [1.0, None])
    outcome, clients = aligned(tmp_path, cal)
    records = {r.id: r for r in outcome.results}
    a1 = records["A:q1"]
    assert (a1.status, a1.score) == ("unjudged", None)
    assert a1.failure is not None and a1.failure.stage == "align_s"
    assert records["A:q2"].status == "ok"
    viewer = Viewer([outcome.dir])
    assert ("A:q1", 0, None) in viewer.units(0, "align_s")
    shown = viewer.unit(0, "A:q1", "align_s", 0)["judged"]
    assert shown["aspects"] == (
        "[1] where the tower is\n[2] how tall the tower is\n[3] when it was built"
    )
    assert shown["claims"] == f"[1] {C1}"
    assert viewer.choices(0, "align_s") == {"kind": "set", "choices": ["none"]}
    assert 'placeholder="covered: 1, 3"' in label_page(viewer, 0, "align_s")
    body = {"id": "A:q1", "stage": "align_s", "key": 0, "annotator": "p"}
    for bad in ("0", "one and three"):
        with pytest.raises(UserError, match="label: a set such as"):
            viewer.add_label(0, body | {"label": bad})
    assert viewer.add_label(0, body | {"label": "3,1"})["label"] == "1, 3"

    again, clients = aligned(tmp_path, cal)
    a1 = {r.id: r for r in again.results}["A:q1"]
    assert a1.status == "ok", a1.failure
    (entry,) = a1.details["cascade"]
    assert (entry["kept"], entry["value"]) == ("people", "1, 3")
    s = a1.details["variants"]["s"]
    assert s["covered"] == ["2", "7"] and s["evidence"] == {"2": [], "7": []}
    assert a1.score == pytest.approx(4 / 9)
    # the tiers were asked again (without a response cache) and still abstained
    assert [t["members"] for t in entry["tiers"]] == [["3", "3", "1, 3"], ["1, 3"]]


def test_an_alignment_is_a_judgement_the_reliability_audits_ask_again(tmp_path):
    """A lone judge (the strong one) aligned A:q1 as {1, 3} and A:q2 as {1}: two recorded
    judgements, asked with the query, the aspects and the grounded claims. Asked again of a
    judge that aligns A:q1 as {3}: one flip of two."""
    import asyncio

    from groundcover.pipelines.reports.audits.reask import reask_audit, recorded_judgements
    from groundcover.pipelines.reports.exports.rows import run_rows

    outcome, _ = aligned(tmp_path, judges=(STRONG,))
    rows = run_rows(outcome.dir)
    found = sorted(recorded_judgements(rows), key=lambda r: r.item)
    assert [(r.item, r.judgement.stage, r.judgement.verdict) for r in found] == [
        ("A:q1", "align_s", "1, 3"),
        ("A:q2", "align_s", "1"),
    ]
    assert found[0].judgement.values == {
        "query": "eiffel tower",
        "aspects": ["where the tower is", "how tall the tower is", "when it was built"],
        "claims": [C1],
    }

    def script(prompt):
        return "".join(LINE.format(n) for n in ALIGNS["c1"][field_of(prompt, "Query")])

    again = ScriptedClient({"align_s": script})
    result = asyncio.run(reask_audit(rows, "rerun", 5, 0, {"judge": again}))
    assert (result["judgements"], result["answered"], result["flips"]) == (2, 2, 1)
    assert {(t["original"], t["again"]) for t in result["table"]} == {("1, 3", "3"), ("1", "1")}


def test_cascade_calibrate_reads_alignment_panels_and_a_persons_sets(tmp_path):
    """Tier 1, the cheap panel: A:q1 {3} (2/3), A:q2 {1} (1). Tier 2, three samples of the
    strong judge: A:q1 {1, 3}, A:q2 {1}, each unanimous. People say A:q1 "3,1" (read as
    "1, 3") and A:q2 "1". alpha = delta = 0.5: each tier is tested at 0.25 and needs 2 kept
    labels, so tier 1 is first tested where it keeps both (2/3): 1 wrong, p = P[Bin(2, 0.5) <= 1]
    = 0.75, not attainable. Tier 2 keeps both, both right: p = 0.25, threshold 1.0 (had "3,1"
    been compared as written, A:q1 would be wrong there too, and p 0.75). A run through that
    calibration asks every alignment of both tiers and keeps tier 2's: A:q1 scores 4/9."""
    import json

    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    cheap, _ = aligned(tmp_path / "cheap", judges=tuple(CHEAP))
    strong, _ = aligned(tmp_path / "strong", judges=(STRONG,), samples=2)
    human = tmp_path / "human.jsonl"
    rows = [
        {"id": "A:q1", "stage": "align_s", "label": "3,1"},
        {"id": "A:q2", "stage": "align_s", "label": "1"},
    ]
    human.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["cascade", "calibrate", str(cheap.dir), str(strong.dir), "--human", str(human)]
    argv += ["--alpha", "0.5", "--delta", "0.5", "--check-share", "0", "--json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    stage = made["stages"]["align_s"]
    first, second = stage["calibration"]["tiers"]
    assert (first["reached"], first["kept"], first["attainable"]) == (2, 0, False)
    assert first["tested"][0]["p_value"] == pytest.approx(0.75)
    assert (second["reached"], second["kept"], second["threshold"]) == (2, 2, 1.0)
    assert stage["thresholds"] == [None, 1.0]

    outcome, clients = aligned(tmp_path / "run", made["file"], judges=(*CHEAP, STRONG), samples=2)
    a1 = {r.id: r for r in outcome.results}["A:q1"]
    assert a1.status == "ok", a1.failure
    assert [len(clients[c].calls) for c in (*CHEAP, STRONG)] == [2, 2, 2, 6]
    (entry,) = a1.details["cascade"]
    assert (entry["kept"], entry["value"]) == (2, "1, 3") and a1.score == pytest.approx(4 / 9)


def test_one_judge_is_a_panel_of_three_wordings_of_the_alignment(tmp_path):
    """``--simulated-annotators``: the strong judge three times, member k asking the alignment
    with the (k-1)-th paraphrase (ICAT's two: a checklist, a reader), each with the same
    numbered aspects and claims and answered in the same JSON lines; the panel's set is theirs."""
    outcome, clients = aligned(tmp_path, judges=(STRONG,) * 3, simulated=True)
    a1 = {r.id: r for r in outcome.results}["A:q1"]
    assert a1.status == "ok", a1.failure
    asked = {c.stage: c.prompt for c in clients[STRONG].calls if "eiffel tower" in c.prompt}
    openings = {stage: prompt.split("\n", 1)[0] for stage, prompt in asked.items()}
    assert openings["align_s"].startswith("You are given a query")
    assert openings["align_s#2"].startswith("Go through the aspects of the query")
    assert openings["align_s#3"].startswith("A reader asked the query below")
    for prompt in asked.values():
        assert prompt.rstrip().endswith(f"Claims:\n1. {C1}")
        assert "3. when it was built" in prompt
    (entry,) = a1.details["panel"]
    assert (entry["members"], entry["value"]) == (["1, 3"] * 3, "1, 3")


def test_judgement_labels_imported_from_a_csv_decide_what_the_cascade_abstained_on(tmp_path):
    """`labels export RUN labels.csv --stage align_s` writes the stage's units blind;
    `labels import RUN labels.csv` with the columns id, stage, key, label: each row checked
    as the labelling page checks it. A wrong row (an unknown stage, a set of words, a unit the
    item does not have) stops the import in one line naming the file, line, record and field,
    and nothing of the file is imported; the right file's "3,1" decides A:q1 as in `view`."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.people.labels import run_labels

    cal = calibration(tmp_path / "cal.json", [1.0, None])
    outcome, _ = aligned(tmp_path, cal)
    head = "id,stage,key,label,annotator\n"
    labels = tmp_path / "labels.csv"
    for row, said in [
        ("A:q1,align_x,0,1,p", "labels.csv:3: record 'A:q1': field stage: 'align_x' is not"),
        ('A:q1,align_s,0,"one, three",p', "labels.csv:3: record 'A:q1': field label: a set"),
        ("A:q1,align_s,4,1,p", "labels.csv:3: record 'A:q1': field key: item 'A:q1' has no"),
        ("A:q9,align_s,0,1,p", "labels.csv:3: record 'A:q9': field id: not an item of"),
    ]:
        labels.write_text(head + "A:q2,align_s,0,,p\n" + row + "\n")
        bad = CliRunner().invoke(app, ["labels", "import", str(outcome.dir), str(labels)])
        assert bad.exit_code != 0 and said in " ".join(bad.output.split()), bad.output
        assert not run_labels(outcome.dir)  # nothing of the file was imported
    # the stage's units exported blind (no verdict), A:q1's label filled in, imported back
    argv = ["labels", "export", str(outcome.dir), str(labels), "--stage", "align_s"]
    made = CliRunner().invoke(app, argv)
    assert made.exit_code == 0, made.output
    with open(labels, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["id"], r["key"], r["label"]) for r in rows] == [("A:q1", "0", ""), ("A:q2", "0", "")]
    assert "aspects: [1] where the tower is\n[2] how tall" in rows[0]["asked"]
    assert rows[0]["choose"].startswith("the numbers of the items covered")
    assert not {"verdict", "judge", "value"} & set(rows[0])
    rows[0] |= {"label": "3,1", "annotator": "p"}
    with open(labels, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    done = CliRunner().invoke(app, ["labels", "import", str(outcome.dir), str(labels)])
    assert done.exit_code == 0, done.output
    assert run_labels(outcome.dir) == {("A:q1", "align_s", 0): "1, 3"}
    again, _ = aligned(tmp_path, cal)
    a1 = {r.id: r for r in again.results}["A:q1"]
    assert (a1.status, a1.details["cascade"][0]["kept"]) == ("ok", "people")
    assert a1.score == pytest.approx(4 / 9)
    argv = ["--stage", "align_x"]
    bad = CliRunner().invoke(app, ["labels", "export", str(outcome.dir), str(labels), *argv])
    said = "--stage align_x: not a judging stage of this run (align_s)"
    assert bad.exit_code != 0 and said in bad.output, bad.output


def test_a_set_is_typed_in_label_studio_and_read_in_the_runs_terms(tmp_path):
    """`labels export RUN tasks.json --stage align_s`: Label Studio tasks whose control
    ``label`` is a text area (the covered aspects, as the prompt numbers them); a person's
    "3,1" for A:q1 in Label Studio's export is imported as the run's "1, 3" and decides the
    abstained alignment (4/9, as in view); "one, three" is refused in one line naming the
    task, record and field, and nothing is imported."""
    import json
    import xml.etree.ElementTree as ElementTree

    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from groundcover.pipelines.reports.people.labels import run_labels
    from tests.test_label_studio_judgements import label_studio_export, region

    cal = calibration(tmp_path / "cal.json", [1.0, None])
    outcome, _ = aligned(tmp_path, cal)
    out = tmp_path / "tasks.json"
    argv = ["labels", "export", str(outcome.dir), str(out), "--stage", "align_s"]
    made = CliRunner().invoke(app, argv)
    assert made.exit_code == 0, made.output
    tasks = json.loads(out.read_text())
    assert [(t["data"]["id"], t["data"]["key"]) for t in tasks] == [("A:q1", 0), ("A:q2", 0)]
    assert "aspects: [1] where the tower is\n[2] how tall" in tasks[0]["data"]["asked"]
    config = ElementTree.fromstring((tmp_path / "tasks.label-config.xml").read_text())
    (area,) = [t for t in config.iter("TextArea") if t.get("name") == "label"]
    assert area.get("toName") == "asked" and not list(config.iter("Choices"))
    export = tmp_path / "export.json"
    for typed, ok in [("one, three", False), ("3,1", True)]:
        result = [region("textarea", {"text": [typed]})]
        export.write_text(json.dumps(label_studio_export(tasks, {0: result})))
        done = CliRunner().invoke(app, ["labels", "import", str(outcome.dir), str(export)])
        if not ok:
            said = "task #0: record 'A:q1': field label: a set such as '1, 3'"
            assert done.exit_code != 0 and said in " ".join(done.output.split()), done.output
            assert not run_labels(outcome.dir)
    assert done.exit_code == 0, done.output
    assert run_labels(outcome.dir) == {("A:q1", "align_s", 0): "1, 3"}
    again, _ = aligned(tmp_path, cal)
    a1 = {r.id: r for r in again.results}["A:q1"]
    assert (a1.status, a1.details["cascade"][0]["kept"]) == ("ok", "people")
    assert a1.score == pytest.approx(4 / 9)
