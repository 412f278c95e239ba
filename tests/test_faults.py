"""Adversarial model outputs replayed through every framework's stages with the scripted client
(the real EvalClient minus its network call): every item ends with a defined status and an
explanation, no exception escapes, no NaN, no score out of range, no item missing, and the
summary counts every item. The harness is ``tests/support/faults.py``; `scripts/fault_report.py`
prints the same replays as a table."""

from __future__ import annotations

import pytest

from tests.support.adversarial import FAMILIES, pool
from tests.support.faults import Replay, cases, replay

SEEDS = (1, 2, 3)  # several seeds per case: a case must both break items and let some through


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_every_framework_survives_adversarial_outputs(tmp_path, case):
    total = Replay()
    for seed in SEEDS:
        result = replay(case, seed, tmp_path / str(seed))
        assert result.escaped == [], result.escaped  # `error` or a raised exception: our defect
        assert result.lost == 0
        assert result.problems == [], result.problems
        total.merge(result)
    assert len(total.families) >= 3, total.families  # the pool really reached the stages
    # the adversary broke items (or answers the paper counts 0, recorded inside them) ...
    assert total.statuses["unparseable"] + total.recorded > 0, total.statuses
    broke_through = total.statuses["ok"] + total.statuses["undefined"]
    assert broke_through > 0, total.statuses  # ... and others got through every stage


def test_the_pool_has_every_family_and_over_a_thousand_outputs():
    outputs = pool(0)
    assert len(outputs) >= 1000
    assert {f for f, _ in outputs} == set(FAMILIES)
    assert max(len(t) for _, t in outputs) >= 40_000
