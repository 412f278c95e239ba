"""Trust or escalate (``reports.audits.cascade``): the threshold by fixed-sequence testing worked
out by hand, and judges of known calibration simulated over 1,000 seeded calibration draws, where
the guarantee fails in at most delta of them and the coverage is what the calibration predicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from groundcover.pipelines.reports.audits.cascade import (
    EVERY,
    Guarantee,
    TierUnits,
    binomial_p_value,
    calibrate,
    calibrate_cascade,
    clopper_pearson_upper,
    route,
)


def test_the_threshold_worked_out_by_hand():
    """Every distinct confidence tested (``--grid every``). 30 judgements at confidence 0.95,
    all agreeing with people; 10 at 0.8 (7 agreeing); 10 at 0.6 (5). alpha = delta = 0.1. At
    0.95: n = 30, 0 errors, p = 0.9^30 = 0.0424 <= 0.1, rejected. At 0.8: n = 40, 3 errors,
    p = P[Bin(40, 0.1) <= 3] = 0.4231 > 0.1: the test stops. The threshold is 0.95, keeping 30
    of 50 (coverage 0.6)."""
    confidences = [0.95] * 30 + [0.8] * 10 + [0.6] * 10
    agrees = [True] * 30 + [True] * 7 + [False] * 3 + [True] * 5 + [False] * 5
    found = calibrate(confidences, agrees, Guarantee(0.1, 0.1), EVERY)
    assert found.threshold == 0.95 and (found.kept, found.errors) == (30, 0)
    assert found.coverage == pytest.approx(0.6)
    assert found.p_value == pytest.approx(0.9**30)
    by_hand = sum(math.comb(40, e) * 0.1**e * 0.9 ** (40 - e) for e in range(4))
    assert found.tested[1]["p_value"] == pytest.approx(by_hand) == pytest.approx(0.4231, abs=1e-4)
    assert len(found.tested) == 2  # the sequence stopped at the first failure
    # Clopper-Pearson's upper bound with no error: 1 - delta^(1/n)
    assert found.upper_bound == pytest.approx(1 - 0.1 ** (1 / 30))
    assert found.attainable and found.labels_needed == 0
    # looser alpha: 0.8 holds too (p = P[Bin(40, 0.2) <= 3] = 0.0285), 0.6 not (8 of 50)
    loose = calibrate(confidences, agrees, Guarantee(0.2, 0.1), EVERY)
    assert loose.threshold == 0.8 and loose.kept == 40


def test_too_few_labels_say_how_many_more_would_do():
    """ln(0.1) / ln(0.9) = 21.85: 22 agreeing labels are the fewest. With 15 at the top, all
    agreeing, 7 more would do (0.9^22 = 0.098 <= 0.1 < 0.9^21 = 0.109)."""
    guarantee = Guarantee(0.1, 0.1)
    assert guarantee.fewest_labels() == 22
    found = calibrate([0.9] * 15 + [0.5] * 5, [True] * 15 + [False] * 5, guarantee)
    assert found.threshold is None and not found.attainable and found.coverage == 0
    assert found.labels_needed == 7
    assert binomial_p_value(0, 22, 0.1) <= 0.1 < binomial_p_value(0, 21, 0.1)
    with pytest.raises(ValueError, match="alpha 1.5"):
        Guarantee(1.5, 0.1)


def test_the_bound_and_the_test_agree():
    """p <= delta exactly when the Clopper-Pearson upper bound is below alpha."""
    for kept in (10, 40, 200):
        for errors in range(0, kept // 3):
            for alpha in (0.05, 0.1, 0.2):
                p = binomial_p_value(errors, kept, alpha)
                upper = clopper_pearson_upper(errors, kept, 0.1)
                assert (p <= 0.1) == (upper <= alpha + 1e-12), (kept, errors, alpha)


def known_judge(rng: np.random.Generator, n: int, low: float) -> tuple[np.ndarray, np.ndarray]:
    """A perfectly calibrated judge: confidence c ~ U(low, 1), right with probability c."""
    confidence = rng.uniform(low, 1.0, n)
    return confidence, rng.random(n) < confidence


def predicted_coverage(n: int, alpha: float, delta: float) -> float:
    """What the known calibration predicts for n labels: the largest coverage 2 (1 - t) at
    which the expected errors of the kept judgements ((1 - t) / 2 of them) pass the exact
    test."""
    best = 0.0
    for coverage in np.linspace(0.001, 1.0, 2000):
        kept = int(n * coverage)
        errors = math.floor(coverage / 4 * kept)
        if kept and binomial_p_value(errors, kept, alpha) <= delta:
            best = float(coverage)
    return best


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_the_guarantee_holds_in_all_but_delta_of_1000_calibration_draws(alpha):
    """Confidence U(0.5, 1), right with probability equal to it: above a threshold t the true
    disagreement is (1 - t) / 2 and the coverage 2 (1 - t), so the oracle's threshold is
    1 - 2 alpha, covering 4 alpha. Over 1,000 calibration sets of 500 the chosen threshold's
    true disagreement exceeds alpha in at most delta of them (plus a 3-sigma binomial margin).
    With 5,000 labels the mean coverage is what the calibration predicts (within 0.05), and
    never above the oracle's."""
    delta, draws, n = 0.1, 1000, 500
    failed = 0
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        confidence, right = known_judge(rng, n, 0.5)
        found = calibrate(confidence.tolist(), right.tolist(), Guarantee(alpha, delta))
        failed += found.threshold is not None and (1 - found.threshold) / 2 > alpha
    margin = 3 * math.sqrt(draws * delta * (1 - delta))
    assert failed <= draws * delta + margin, failed
    coverage = []
    for seed in range(60):
        confidence, right = known_judge(np.random.default_rng(seed), 5000, 0.5)
        found = calibrate(confidence.tolist(), right.tolist(), Guarantee(alpha, delta))
        coverage.append(0.0 if found.threshold is None else 2 * (1 - found.threshold))
    expected = predicted_coverage(5000, alpha, delta)
    assert expected - 0.05 < float(np.mean(coverage)) <= min(expected + 0.02, 4 * alpha)


def test_a_two_tier_cascade_keeps_the_guarantee_and_escalates_only_what_tier_one_cannot():
    """A weak judge (confidence U(0.5, 1)) first, a strong one (U(0.7, 1)) second, both
    perfectly calibrated, at delta / 2 each: over 300 draws the kept judgements' true
    disagreement stays under alpha in all but delta of them, the strong tier sees only the
    units below the weak tier's threshold, and the cascade covers more than the weak judge."""
    alpha, delta, draws, n = 0.1, 0.1, 300, 600
    failed, alone, together = 0, [], []
    for seed in range(draws):
        rng = np.random.default_rng(10_000 + seed)
        weak_c, weak_r = known_judge(rng, n, 0.5)
        strong_c, strong_r = known_judge(rng, n, 0.7)
        tiers = [
            TierUnits("weak", weak_c.tolist(), weak_r.tolist()),
            TierUnits("strong", strong_c.tolist(), strong_r.tolist()),
        ]
        found = calibrate_cascade(tiers, Guarantee(alpha, delta))
        weak, strong = found["tiers"]
        assert weak["reached"] == n and found["delta_per_tier"] == delta / 2
        if weak["threshold"] is not None:
            # the strong tier is asked exactly for what the weak one did not keep
            assert strong["reached"] == int((weak_c < weak["threshold"]).sum())
        # the cascade's true disagreement, from the known calibrations (independent judges):
        # the weak tier keeps c1 >= t1 (probability (1 - t1) / 0.5, disagreement (1 - t1) / 2),
        # the strong one c1 < t1 and c2 >= t2 ((1 - t2) / 0.3 of those, (1 - t2) / 2)
        t1, t2 = weak["threshold"], strong["threshold"]
        p1 = (1 - t1) / 0.5 if t1 is not None else 0.0
        p2 = (1 - p1) * (1 - t2) / 0.3 if t2 is not None else 0.0
        if p1 + p2 > 0:
            risk = (p1 * (1 - (t1 or 1)) / 2 + p2 * (1 - (t2 or 1)) / 2) / (p1 + p2)
            failed += risk > alpha
        alone.append(weak["coverage"])
        together.append(found["coverage"])
    assert failed <= draws * delta
    assert np.mean(together) > np.mean(alone) + 0.1
    assert route([0.9, 0.99], [0.95, 0.9]) == 1
    assert route([0.97, None], [0.95, 0.9]) == 0
    assert route([0.5, 0.6], [0.95, None]) is None  # abstained


def test_a_cascade_calibrated_from_two_recorded_panel_runs_by_hand(tmp_path):
    """Tier 1: a panel of three judges (FanOutQA, items f1 and f2): f1 B, B, A -> B, confidence
    2/3; f2 C, D, E -> the declared tie D, 1/3. Tier 2: j1 asked three times: f1 B, f2 C,
    confidence 1 each. People say f1 B, f2 C. alpha = delta = 0.5, so each tier is tested at
    0.25 and needs 2 kept labels (0.5^2 <= 0.25). Tier 1: 2 kept, 1 wrong: p = P[Bin(2, 0.5) <= 1]
    = 0.75, not attainable, 1 more label at its top would do (0.5^2). Tier 2 gets both: 2 kept, 0
    wrong, p = 0.25: threshold 1.0. Every judgement then asks both tiers: 12 calls against 6."""
    import json

    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app
    from tests.test_panels import panel_run

    panel_run(tmp_path / "weak", ["j1", "j2", "j3"])
    url = "http://127.0.0.1:9/v1"  # the three samples of j1 told apart by a revision label
    samples = {
        role: {"model": "j1", "endpoint": url, "revision": f"sample-{k}"}
        for k, role in enumerate(("judge", "judge#2", "judge#3"))
    }
    panel_run(tmp_path / "strong", [], yaml_roles=samples)
    weak, strong = (tmp_path / n / "run" / "closed-book" for n in ("weak", "strong"))
    human = tmp_path / "human.jsonl"
    rows = [
        {"id": "f1", "stage": "judge", "label": "B"},
        {"id": "f2", "stage": "judge", "label": "C"},
    ]
    human.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["cascade", "calibrate", str(weak), str(strong), "--human", str(human)]
    argv += ["--alpha", "0.5", "--delta", "0.5", "--check-share", "0", "--json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    stage = made["stages"]["judge"]
    first, second = stage["calibration"]["tiers"]
    assert (first["reached"], first["kept"], first["threshold"], first["attainable"]) == (
        2,
        0,
        None,
        False,
    )
    assert first["tested"][0]["p_value"] == pytest.approx(0.75) and first["labels_needed"] == 1
    assert (second["reached"], second["kept"], second["threshold"]) == (2, 2, 1.0)
    assert second["p_value"] == pytest.approx(0.25)
    assert stage["thresholds"] == [None, 1.0]
    assert stage["confidence"] == ["share", "share"]  # both tiers panels: their vote shares
    assert stage["routing"] | {} == {
        "judgements": 2,
        "asked": [2, 2],
        "kept": [0, 2],
        "abstained": 0,
        "calls": 12,
        "calls_strongest_alone": 6,
        "strongest_calls_saved": 0.0,
    }
    assert stage["check_units"] == [] and len(stage["calibration_units"]) == 2
    # known by content: the file is named by the digest of what it holds
    from pathlib import Path

    written = json.loads(Path(made["file"]).read_text())
    assert written["sha256"] == made["sha256"] and made["sha256"][:12] in made["file"]
    from groundcover.pipelines.reports.audits.cascade import content_digest

    assert content_digest(written) == written["sha256"]
    # labels kept apart: with half the items checked, what calibrates and what checks differ
    half = CliRunner().invoke(app, argv[:-3] + ["--check-share", "0.5", "--seed", "3", "--json"])
    apart = json.loads(half.output)["stages"]["judge"]
    calibrating = {tuple(u) for u in apart["calibration_units"]}
    assert not calibrating & {tuple(u) for u in apart["check_units"]}
    shown = CliRunner().invoke(app, argv[:-1])
    assert shown.exit_code == 0 and "not attainable" in shown.output, shown.output
    # the grid tested is recorded, so a calibration made with another is another by content
    assert made["grid"] == {"name": "steps", "start_errors": 1, "start_share": 0.1}
    every = json.loads(CliRunner().invoke(app, [*argv, "--grid", "every"]).output)
    assert every["grid"] == {"name": "every"} and every["sha256"] != made["sha256"]
    assert every["stages"]["judge"]["thresholds"] == [None, 1.0]
    nope = CliRunner().invoke(app, [*argv[:-1], "--grid", "nope"])
    assert nope.exit_code != 0 and "--grid nope: want one of steps, every" in nope.output
    bad = CliRunner().invoke(app, [*argv[:-1], "--alpha", "1.5"])
    assert bad.exit_code != 0 and "--alpha 1.5: want a number strictly between 0 and 1" in (
        bad.output
    )


def test_the_trust_reports_import_one_another_in_one_direction():
    """No import circle among ``reports/audits``'s modules, counting the imports made inside
    functions: what agreement and cascade share is read in ``units`` below both."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "pipelines" / "reports" / "audits"
    modules = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in modules:
                found.add(node.module)
        imports[name] = found
    assert "agreement" not in imports["cascade"] and "units" in imports["cascade"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        ahead = imports[start] - seen
        return any(nxt == goal or reaches(nxt, goal, seen | {nxt}) for nxt in ahead)

    circles = [name for name in modules if reaches(name, name, set())]
    assert not circles, imports


def test_the_steps_grid_worked_out_by_hand_where_one_disagreement_at_the_top_ends_every():
    """alpha = delta = 0.1. The exact test first lets e disagreements pass at k_e kept
    judgements: k_0 = 22, k_1 = 38 (P[Bin(38, 0.1) <= 1] = 0.0953 <= 0.1 < P[Bin(37, 0.1) <= 1]
    = 0.1036), k_2 = 52, k_3 = 65. With 380 labelled the steps grid starts at k_1 (38, a tenth
    of them: one disagreement cannot end it) and keeps 38, 52, 65, ..., all 380; with 60 it
    starts at k_0 (38 would be more than a tenth). Labels: 22 at 0.99 (one disagreeing), 18 at
    0.9 (none), 15 at 0.8 (one), 325 at 0.6 (100). Every distinct confidence: 0.99 first (22
    kept, 1 error, p = 0.9^22 + 22 * 0.1 * 0.9^21 = 0.339): the sequence ends there, no
    threshold. Steps: 38 lands on 0.9 (40 kept, 1 error, p = 0.0805), 52 on 0.8 (55 kept, 2
    errors, p = 0.0774), 65 on 0.6 (380 kept, 102 errors): 0.8 keeps 55."""
    from scipy.stats import binom

    from groundcover.pipelines.reports.audits.cascade import GRIDS, STEPS

    guarantee = Guarantee(0.1, 0.1)
    assert STEPS.counts(380, guarantee)[:4] == [38, 52, 65, 78]
    assert STEPS.counts(380, guarantee)[-1] == 380
    assert binom.cdf(1, 38, 0.1) <= 0.1 < binom.cdf(1, 37, 0.1)
    assert binom.cdf(2, 52, 0.1) <= 0.1 < binom.cdf(2, 51, 0.1)
    assert STEPS.counts(60, guarantee) == [22, 38, 52, 60]
    assert STEPS.counts(20, guarantee) == [20]  # too few for any step: all of them, once
    confidences = [0.99] * 22 + [0.9] * 18 + [0.8] * 15 + [0.6] * 325
    agrees = [False] + [True] * 21 + [True] * 18 + [False] + [True] * 14
    agrees += [False] * 100 + [True] * 225
    every = calibrate(confidences, agrees, guarantee, EVERY)
    assert every.threshold is None and len(every.tested) == 1
    assert every.tested[0]["p_value"] == pytest.approx(0.9**22 + 22 * 0.1 * 0.9**21)
    assert every.tested[0]["p_value"] == pytest.approx(0.339, abs=1e-3)
    found = calibrate(confidences, agrees, guarantee)  # steps, the default
    assert [(t["threshold"], t["kept"], t["errors"]) for t in found.tested] == [
        (0.9, 40, 1),
        (0.8, 55, 2),
        (0.6, 380, 102),
    ]
    assert found.tested[0]["p_value"] == pytest.approx(0.9**40 + 40 * 0.1 * 0.9**39)
    assert found.tested[1]["p_value"] == pytest.approx(binom.cdf(2, 55, 0.1))
    assert found.threshold == 0.8 and found.kept == 55
    assert found.coverage == pytest.approx(55 / 380)
    assert GRIDS == {"steps": STEPS, "every": EVERY}
    made = calibrate_cascade([TierUnits("one", confidences, agrees)], guarantee)
    assert made["grid"] == {"name": "steps", "start_errors": 1, "start_share": 0.1}
    assert calibrate_cascade([TierUnits("one", confidences, agrees)], guarantee, EVERY)["grid"] == {
        "name": "every"
    }
