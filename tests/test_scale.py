"""Scale-out on Ray: cross-encoder NLI over a Ray Data actor pool gives the local scorer's labels
and probabilities on the same pairs (tiny DeBERTa-v2, two CPU actors, real Ray)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from retrieval.nli import CANONICAL, NliScorer

WORDS = "the tower stands in paris and was built by eiffel for the fair of 1889 it is tall".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_nli(tmp_path_factory):
    from tests.support.tiny import build_tiny_classifier

    return str(build_tiny_classifier(tmp_path_factory.mktemp("nli") / "tiny-deberta"))


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from retrieval.nli_ray import connect

    connect(num_cpus=4)
    yield ray
    ray.shutdown()


def test_ray_data_nli_equals_the_local_scorer(tiny_nli, ray_local):
    from retrieval.nli_ray import RayNliScorer

    premises, hypotheses = sentences(40, 1), sentences(40, 2)
    pairs = [(premises[i], hypotheses[(i * 7) % 40]) for i in range(40)]
    pairs += pairs[:9]  # repeated pairs: scored once, answered in place
    local = NliScorer(tiny_nli, batch_size=8).probabilities(pairs)
    scorer = RayNliScorer(tiny_nli, actors=2, batch_size=8)
    remote = scorer.probabilities(pairs)
    assert remote.shape == (len(pairs), len(CANONICAL))
    assert [CANONICAL[i] for i in remote.argmax(1)] == [CANONICAL[i] for i in local.argmax(1)]
    np.testing.assert_allclose(remote, local, rtol=0, atol=1e-6)
    assert len(scorer.workers) == 2  # both actors scored batches
    assert scorer.probabilities([]).shape == (0, 3)


# ---- opt-in candidate pruning of the pairwise NLI stage ---------------------------------------


@pytest.fixture(scope="module")
def pruner_model():
    from pipelines.comprehensiveness.pruning import Pruner

    return Pruner(0.0)  # the shipped all-MiniLM-L6-v2; thresholds set per test


async def judged_with(threshold: float | None, pruner) -> tuple[dict, int]:
    from pipelines.comprehensiveness import ComprehensivenessOptions, evaluate_item
    from pipelines.comprehensiveness.nli_method import LlmNli
    from pipelines.comprehensiveness.pruning import PrunedJudge
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, NLI_SCRIPTS

    judge = LlmNli()
    if threshold is not None:
        pruner.threshold = threshold
        judge = PrunedJudge(judge, pruner)
    options = ComprehensivenessOptions(protocol="spec", method="nli", prune_below=threshold)
    async with ScriptedClient(NLI_SCRIPTS) as client:
        result = await evaluate_item(client, ITEM, options, nli_judge=judge)
    return result.model_dump(mode="json"), len(client.stage_calls("nli"))


async def test_pruning_skips_far_pairs_and_reports_recall(pruner_model):
    from pipelines.comprehensiveness.pruning import edge_recall
    from tests.test_exact_scores import C1, C2, R1

    # The item of the exact NLI test: 20 ordered pairs; entailments r1<->c1.a1 and c1.a1->c2.a2.
    exhaustive, calls = await judged_with(None, pruner_model)
    assert (exhaustive["score"], calls) == (0.5, 20)
    paraphrase, implied = pruner_model.similarities([(R1, C1[0]), (C1[0], C2[1])])
    unrelated = pruner_model.similarities([(C1[2], R1), (C1[1], C2[0])])
    assert paraphrase > implied > max(unrelated)  # what the real embedder says about them

    # Threshold at the weakest entailing pair: every edge kept, the unrelated pairs skipped.
    kept_all, calls = await judged_with(float(implied) - 1e-4, pruner_model)
    pruning = kept_all["details"]["pruning"]
    assert pruning["judged"] + pruning["skipped"] == 20 and pruning["skipped"] > 0
    assert calls == pruning["judged"]  # the judge saw only the kept pairs
    assert kept_all["score"] == 0.5
    assert edge_recall([exhaustive], [kept_all])["recall"] == 1.0

    # Above it: c1.a1 -> c2.a2 is never judged, c2.a2 is uncovered: S = 1/4, recall 2/3.
    lost_one, _ = await judged_with(float(implied) + 1e-4, pruner_model)
    assert lost_one["score"] == 0.25
    recall = edge_recall([exhaustive], [lost_one])
    assert (recall["edges"], recall["kept"]) == (3, 2) and recall["recall"] == pytest.approx(2 / 3)
    assert recall["pairs_exhaustive"] == 20
    assert recall["pairs_judged"] + recall["pairs_skipped"] == 20


def test_pruning_is_refused_in_the_paper_protocol():
    from pipelines.comprehensiveness import ComprehensivenessOptions

    with pytest.raises(ValueError, match="pruning is off in the paper protocol"):
        ComprehensivenessOptions(method="nli", prune_below=0.3)


def test_comprehensiveness_cross_encoder_on_ray_actors_equals_local(tiny_nli, ray_local, tmp_path):
    """Four items through the runtime: their NLI pairs pooled across items, scored here or on
    two Ray Data actors -- the same relations (labels and probabilities) and scores."""
    import json

    from pipelines.comprehensiveness import ComprehensivenessOptions
    from pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, NLI_SCRIPTS
    from tests.test_runtime import run

    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(ITEM.model_dump() | {"id": f"t{k}"}) + "\n"
                            for k in range(4)))  # fmt: skip
    scripts = {k: v for k, v in NLI_SCRIPTS.items() if k != "nli"}
    outcomes = {}
    for actors in (0, 2):
        options = ComprehensivenessOptions(input=data, method="nli", protocol="spec",
                                           nli_backend="cross-encoder", nli_model=tiny_nli,
                                           nli_actors=actors, export_graphs=False)  # fmt: skip
        client = ScriptedClient(scripts)
        outcomes[actors] = run(COMPREHENSIVENESS, options, client, tmp_path / f"a{actors}")[""]
    local, remote = ({r.id: r for r in outcomes[a].results} for a in (0, 2))
    assert set(local) == set(remote) == {f"t{k}" for k in range(4)}
    for item_id, record in local.items():
        here, there = record.details["relations"], remote[item_id].details["relations"]
        assert [r["label"] for r in here] == [r["label"] for r in there]
        assert [r["probability"] for r in here] == pytest.approx(
            [r["probability"] for r in there], abs=1e-6)  # fmt: skip
        assert (record.status, record.score) == (remote[item_id].status, remote[item_id].score)
