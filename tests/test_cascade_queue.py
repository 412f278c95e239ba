"""Labels where they count for a cascade's thresholds (``labels queue --for-calibration``): the
floor worked out by hand, the next judgements drawn at random from the band at or above it and
recorded with their band and seed, walked first by ``view``'s labelling page, which says what
the labels give the tier now; ``cascade calibrate`` tests no threshold below the floor, and a
simulation of labels drawn that way keeps the guarantee."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy.stats import beta as beta_dist
from scipy.stats import binom
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.fanoutqa.framework import FANOUTQA, FanoutOptions
from groundcover.pipelines.reports.audits.cascade import Guarantee, calibrate
from groundcover.pipelines.reports.audits.cascade_queue import keepable_floor
from groundcover.pipelines.reports.pages.viewer import Viewer
from groundcover.pipelines.reports.people.labels import append_labels
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_role_options
from groundcover.pipelines.runtime.execution.execute import execute
from tests.support.scripted import Reply, ScriptedClient
from tests.test_runtime import closing_client

URL = "http://127.0.0.1:9/v1"
N = 30


def confidence_of(i: int) -> float:
    """Question i's judgement: B with probability 0.5 + i / 60 (0.5 to 0.983)."""
    return 0.5 + i / 60


def many_judged(where):
    """FanOutQA's judge alone with --confidence logprobs over 30 questions, each answered, the
    judge saying B with confidence 0.5 + i / 60 for question i."""
    where.mkdir(parents=True, exist_ok=True)
    data = where / "dev.json"
    items = [
        {"id": f"q{i:02d}", "question": f"What is thing {i}?", "answer": f"x{i}"} for i in range(N)
    ]
    data.write_text(json.dumps(items))

    def number(prompt):
        return int(re.search(r"thing (\d+)", prompt).group(1))

    def judge(prompt):
        p = confidence_of(number(prompt))
        tokens = [{"token": "Reasoning.\n", "logprob": 0.0}, {"token": "B", "logprob": math.log(p)}]
        return Reply("Reasoning.\nB", tokens)

    answers = ScriptedClient({"answer-closed-book": lambda p: f"It is x{number(p)}."})
    judges = ScriptedClient({"judge": judge}, model="strong")
    clients = {"ans": answers, "strong": judges}
    roles = parse_role_options([f"judge=strong@{URL}"])
    request = RunRequest(
        EvaluatorConfig(model="ans", endpoint=URL),
        RunConfig(run_dir=where / "run", cache=None, confidence="logprobs"),
        FanoutOptions(input=data, judge=True),
        {role: RoleSpec.model_validate(spec) for role, spec in roles.items()},
    )
    opened = lambda ev, run_dir: closing_client(clients[ev.model])  # noqa: E731
    return execute(FANOUTQA, request, quiet=True, open_client=opened)["closed-book"]


def test_the_floor_worked_out_by_hand():
    """alpha = delta = 0.1. Labelled: 0.9 (agrees), 0.8 (agrees), 0.7 (disagrees), 0.6 and 0.5
    (disagree). From the top: 0.9 keeps 1, 0 errors; 0.8 keeps 2, 0; 0.7 keeps 3, 1 error:
    Clopper-Pearson's lower 90% bound Beta(0.1; 1, 3) = 0.0345, not above 0.1; 0.6 keeps 4, 2:
    Beta(0.1; 2, 3) = 0.1426 > 0.1, shown to disagree too much. The floor is 0.7, the level
    just above it."""
    guarantee = Guarantee(0.1, 0.1)
    found = keepable_floor([0.5, 0.9, 0.6, 0.8, 0.7], [False, True, False, True, False], guarantee)
    assert found == 0.7
    assert beta_dist.ppf(0.1, 1, 3) == pytest.approx(0.0345, abs=1e-4)
    assert beta_dist.ppf(0.1, 2, 3) == pytest.approx(0.1426, abs=1e-4)
    assert keepable_floor([0.9, 0.8], [True, False], guarantee) is None  # nothing shown yet
    assert keepable_floor([], [], guarantee) is None
    top = keepable_floor([0.9, 0.9, 0.9], [False, False, False], guarantee)
    assert top is not None and 0.9 < top < 0.9 + 1e-12  # even the top: nothing at all


def test_the_queue_draws_from_the_band_records_it_and_the_page_counts_down(tmp_path):
    """Questions 0-9 are labelled (confidences 0.5 to 0.65): 0-7 disagree (A), 8 and 9 agree.
    From the top: 0.65 and 0.633 agree, 0.617 keeps 3 with 1 error (bound 0.0345), 0.6 keeps 4
    with 2 (0.1426 > 0.1): the floor is 0.617 (question 7), and the band the 20 unlabelled
    judgements above it. Five are drawn (seed 3), recorded with the band, first on the page; the
    page says 35 agreeing labels in the band are needed (3 there, 1 disagreeing: P[Bin(38, 0.1)
    <= 1] = 0.095 is the first to pass), 30 once the five drawn are labelled B."""
    run = many_judged(tmp_path / "many")
    people = [
        {"id": f"q{i:02d}", "stage": "judge", "key": 0, "label": "A" if i < 8 else "B"}
        | {"annotator": "p", "judge": "B"}
        for i in range(10)
    ]
    append_labels(run.dir, people)
    argv = ["labels", "queue", "--for-calibration", str(run.dir), "--size", "5", "--seed", "3"]
    made = CliRunner().invoke(app, argv)
    assert made.exit_code == 0, made.output
    (line,) = (run.dir / "labels" / "calibration-draws.jsonl").read_text().splitlines()
    recorded = json.loads(line)
    draw = recorded["draw"]
    assert draw["floor"] == pytest.approx(confidence_of(7))
    assert (draw["reaching"], draw["band"], draw["drawn"]) == (30, 20, 5)
    assert draw["inclusion"] == 0.25 and draw["seed"] == 3 and draw["tier"] == 1
    assert (draw["alpha"], draw["delta"]) == (0.1, 0.1)
    drawn = [u["id"] for u in recorded["units"]]
    assert len(set(drawn)) == 5 and all(int(i[1:]) >= 10 for i in drawn)
    assert [u["confidence"] for u in recorded["units"]] == [
        pytest.approx(confidence_of(int(i[1:]))) for i in drawn
    ]
    assert "20 unlabelled judgements at confidence >= 0.6167" in " ".join(made.output.split())

    viewer = Viewer([run.dir])
    assert [item for item, _, _ in viewer.units(0, "judge")[:5]] == drawn  # walked first
    before = viewer.queue(0, "p", "judge")["calibration"]
    assert before["labelled"] == 10 and not before["attainable"]
    assert before["floor"] == pytest.approx(confidence_of(7))
    assert before["labels_needed"] == 35
    assert binom.cdf(1, 38, 0.1) <= 0.1 < binom.cdf(1, 37, 0.1)
    for item in drawn:
        viewer.add_label(
            0, {"id": item, "stage": "judge", "key": 0, "label": "B", "annotator": "p"}
        )
    after = viewer.calibration(0, "judge")
    assert after["labelled"] == 15 and after["labels_needed"] == 30
    # the page asks the server for it after each label
    import threading
    import urllib.request

    from groundcover.pipelines.reports.pages.viewer import make_server
    from tests.test_view_labels import get

    server = make_server(viewer, "127.0.0.1", 0, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(f"{base}/api/calibration?run=0&stage=judge") == {"calibration": after}
        with urllib.request.urlopen(f"{base}/label?run=0&stage=judge", timeout=30) as response:
            page = response.read().decode()
        assert 'id="needed"' in page and "/api/calibration?run=" in page
    finally:
        server.shutdown()
        server.server_close()

    # calibrating: no threshold below the floor is tested
    cal = CliRunner().invoke(
        app, ["cascade", "calibrate", str(run.dir), "--check-share", "0", "--json"]
    )
    assert cal.exit_code == 0, cal.output
    stage = json.loads(cal.output)["stages"]["judge"]
    assert stage["floors"] == [pytest.approx(confidence_of(7))]
    assert all(
        t["threshold"] >= confidence_of(7) for t in stage["calibration"]["tiers"][0]["tested"]
    )


def test_labels_drawn_from_the_band_keep_the_guarantee():
    """A judge of known calibration (c ~ U(1/6, 1), agreeing with probability c). 150 labels at
    random, the floor from them, then 350 drawn at random from the band at or above it;
    calibrated on all 500 with the floor: over 1,000 seeded draws the chosen threshold's true
    disagreement ((1 - t) / 2) is above alpha in at most delta of them."""
    alpha = delta = 0.1
    guarantee = Guarantee(alpha, delta)
    failed = found = 0
    draws = 1000
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        pool = 1 / 6 + 5 / 6 * rng.random(5_000)
        first = pool[:150]
        agrees = rng.random(150) < first
        floor = keepable_floor(first.tolist(), agrees.tolist(), guarantee)
        band = pool[150:] if floor is None else pool[150:][pool[150:] >= floor]
        more = band[:350]
        more_agree = rng.random(len(more)) < more
        confidences = np.concatenate([first, more]).tolist()
        agreeing = np.concatenate([agrees, more_agree]).tolist()
        chosen = calibrate(confidences, agreeing, guarantee, floor=floor).threshold
        if chosen is not None:
            found += 1
            failed += (1 - chosen) / 2 > alpha
    assert failed <= draws * delta
    assert found > draws / 2  # the band's labels find thresholds


def test_a_calibration_draws_per_tier_from_what_reaches_it(tmp_path):
    """A calibration of two tiers (both the 30-item run, for the test), tier 1 trusted at 0.9:
    tier 1 is reached by all 30 judgements, tier 2 only by the 24 below 0.9 (questions 0-23);
    with no label yet each band is all of them. Three drawn per tier, each recorded with delta
    / 2 and its tier."""
    from tests.support.cascades import write_digested

    run = many_judged(tmp_path / "many")
    made = {
        "kind": "groundcover-cascade-calibration",
        "version": 1,
        "alpha": 0.1,
        "delta": 0.1,
        "tiers": [
            {"run": str(run.dir), "task": "", "members": ["judge"], "models": ["strong"]}
            for _ in range(2)
        ],
        "stages": {"judge": {"thresholds": [0.9, None], "confidence": ["logprobs"] * 2}},
        "skipped": {},
    }
    cal = write_digested(tmp_path / "cal.json", made)
    argv = ["labels", "queue", "--for-calibration", str(cal), "--size", "3", "--seed", "1"]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, done.output
    lines = (run.dir / "labels" / "calibration-draws.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert (first["draw"]["tier"], first["draw"]["reaching"], first["draw"]["band"]) == (1, 30, 30)
    assert (second["draw"]["tier"], second["draw"]["reaching"]) == (2, 24)
    assert first["draw"]["delta"] == second["draw"]["delta"] == 0.05
    assert first["draw"]["floor"] is None and second["draw"]["inclusion"] == 3 / 24
    assert all(u["confidence"] < 0.9 for u in second["units"]) and len(second["units"]) == 3
