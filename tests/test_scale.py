"""Scale-out on Ray: cross-encoder NLI on a pool of Ray actors gives the local scorer's labels
and probabilities on the same pairs (tiny DeBERTa-v2, two CPU actors, real Ray)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from groundcover.retrieval.nli import CANONICAL, NliScorer

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
    """Ray installed: each ``RayNliScorer`` starts its own local Ray in its driver process."""
    return pytest.importorskip("ray")


def test_nli_on_ray_actors_equals_the_local_scorer_and_loads_once(tiny_nli, ray_local):
    from groundcover.retrieval.nli_ray import RayNliScorer

    premises, hypotheses = sentences(40, 1), sentences(40, 2)
    pairs = [(premises[i], hypotheses[(i * 7) % 40]) for i in range(40)]
    pairs += pairs[:9]  # repeated pairs: scored once, answered in place
    local = NliScorer(tiny_nli, batch_size=4).probabilities(pairs)
    scorer = RayNliScorer(tiny_nli, actors=2, batch_size=4)  # 10 batches, 1 per actor call
    assert len(scorer.started) == 2  # both actors up, their models loaded, before any call
    remote = scorer.probabilities(pairs)
    assert remote.shape == (len(pairs), len(CANONICAL))
    assert [CANONICAL[i] for i in remote.argmax(1)] == [CANONICAL[i] for i in local.argmax(1)]
    np.testing.assert_allclose(remote, local, rtol=0, atol=1e-6)
    assert scorer.workers == scorer.started  # both actors scored batches
    assert scorer.probabilities([]).shape == (0, 3)
    here = NliScorer(tiny_nli, batch_size=8)  # the same decisions through the same API
    assert scorer.labels(pairs[:12]) == here.labels(pairs[:12])
    claim, passages = hypotheses[0], premises[:6]
    for threshold in (None, 0.2, 0.5):
        assert scorer.supported(claim, passages, threshold) == here.supported(
            claim, passages, threshold
        )
        # every call is answered by the actors started with the scorer: loaded once, not per call
        assert scorer.workers <= scorer.started
    assert scorer.executions == 5


# ---- opt-in candidate pruning of the pairwise NLI stage ---------------------------------------


@pytest.fixture(scope="module")
def pruner_model():
    from groundcover.pipelines.comprehensiveness.pruning import Pruner

    return Pruner(0.0)  # the shipped all-MiniLM-L6-v2; thresholds set per test


async def judged_with(threshold: float | None, pruner) -> tuple[dict, int]:
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import evaluate_item
    from groundcover.pipelines.comprehensiveness.nli_method import LlmNli
    from groundcover.pipelines.comprehensiveness.pruning import PrunedJudge
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
    from groundcover.pipelines.comprehensiveness.pruning import edge_recall
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
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions

    with pytest.raises(ValueError, match="pruning is off in the paper protocol"):
        ComprehensivenessOptions(method="nli", prune_below=0.3)


def test_comprehensiveness_cross_encoder_on_ray_actors_equals_local(tiny_nli, ray_local, tmp_path):
    """Four items through the runtime: their NLI pairs pooled across items, scored here or on
    two Ray actors -- the same relations (labels and probabilities) and scores."""
    import json

    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, NLI_SCRIPTS
    from tests.test_runtime import run

    data = tmp_path / "items.jsonl"
    data.write_text(
        "".join(json.dumps(ITEM.model_dump() | {"id": f"t{k}"}) + "\n" for k in range(4))
    )
    scripts = {k: v for k, v in NLI_SCRIPTS.items() if k != "nli"}
    outcomes = {}
    for actors in (0, 2):
        options = ComprehensivenessOptions(
            input=data,
            method="nli",
            protocol="spec",
            nli_backend="cross-encoder",
            nli_model=tiny_nli,
            nli_actors=actors,
            export_graphs=False,
        )
        client = ScriptedClient(scripts)
        outcomes[actors] = run(COMPREHENSIVENESS, options, client, tmp_path / f"a{actors}")[""]
    local, remote = ({r.id: r for r in outcomes[a].results} for a in (0, 2))
    assert set(local) == set(remote) == {f"t{k}" for k in range(4)}
    for item_id, record in local.items():
        here, there = record.details["relations"], remote[item_id].details["relations"]
        assert [r["label"] for r in here] == [r["label"] for r in there]
        assert [r["probability"] for r in here] == pytest.approx(
            [r["probability"] for r in there], abs=1e-6
        )
        assert (record.status, record.score) == (remote[item_id].status, remote[item_id].score)


# ---- faults on Ray ------------------------------------------------------------------------------


def test_an_nli_actor_killed_mid_batch_costs_nothing(tiny_nli, ray_local):
    """Ray restarts a SIGKILLed actor and runs its unfinished call again: every pair is scored,
    and the probabilities are still the local scorer's."""
    import os
    import signal
    import threading
    import time

    import psutil

    from groundcover.retrieval.nli_ray import RayNliScorer

    premises, hypotheses = sentences(600, 3), sentences(600, 4)
    pairs = [(premises[i] * 4, hypotheses[(i * 11) % 600]) for i in range(600)]  # long premises
    local = NliScorer(tiny_nli, batch_size=32).probabilities(pairs)
    scorer, outcome = RayNliScorer(tiny_nli, actors=2, batch_size=32), {}
    work = threading.Thread(target=lambda: outcome.update(probs=scorer.probabilities(pairs)))
    work.start()
    victim = None
    while work.is_alive() and victim is None:
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            title = (proc.info["cmdline"] or [""])[0]
            if "_BatchScorer.score" in title and proc.pid in scorer.started:
                victim = proc.pid  # one of the scorer's actors, in the middle of a call
                break
        time.sleep(0.05)
    assert victim is not None and work.is_alive(), "the scoring ended before an actor was killed"
    os.kill(victim, signal.SIGKILL)
    work.join(300)
    assert not work.is_alive()
    np.testing.assert_allclose(outcome["probs"], local, rtol=0, atol=1e-6)
    # the call it was scoring was run again by its restarted process (a pid it did not start with)
    assert scorer.workers - scorer.started


def test_the_cluster_gone_mid_run_ends_with_one_error_and_resumes(tiny_nli, tmp_path):
    """A run whose NLI is on a Ray cluster that dies mid-run: one `error:` line and exit 1 well
    before Ray's own silent exit (60 s), whole records only, and the same run resumed without Ray
    ends with every item once."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.support.ray_head import ray_head, wait_for_records
    from tests.test_exact_scores import ITEM

    root = Path(__file__).resolve().parents[1]
    items, run_dir = tmp_path / "items.jsonl", tmp_path / "run"
    # enough items that the kill after the first records lands mid-run: the actors, loaded once,
    # score an item's pairs in milliseconds
    ids = [f"t{k:04d}" for k in range(2000)]
    items.write_text("".join(json.dumps(ITEM.model_dump() | {"id": i}) + "\n" for i in ids))
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [sys.executable, "-m", "tests.support.ray_gone", str(items), str(run_dir), tiny_nli]
    results = run_dir / "results.jsonl"
    with ray_head(num_cpus=2) as head:
        run = subprocess.Popen(
            [*command, f"127.0.0.1:{head.port}"],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for_records(results, 8, run, timeout=300)
        os.killpg(head.pid, signal.SIGKILL)  # the head: GCS, raylet, and the actors with them
        killed = time.monotonic()
        out, err = run.communicate(timeout=180)
        assert run.returncode == 1, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Ray cluster" in errors[0] and "gone" in errors[0], err[-3000:]
        assert time.monotonic() - killed < 55  # ours, not Ray's exit after 60 s
        done = [json.loads(line) for line in results.read_text().splitlines()]
        assert 0 < len(done) < len(ids)
    resumed = subprocess.run(
        [*command, "local"], env=env, text=True, capture_output=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ids  # every item, none twice
    # the same item 2000 times: one status and score, whether its NLI ran on Ray or here
    assert len({(r["status"], r["score"]) for r in records}) == 1


def test_a_run_submitted_as_a_ray_job_scores_on_the_cluster(tiny_nli, tmp_path):
    """`ray job submit` as the README shows it: the run is the job's entrypoint on the head,
    joins the cluster with `--ray-address auto`, scores its NLI pairs on the cluster's actors,
    and records what the same run records here without Ray."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.support.ray_head import ray_head
    from tests.test_exact_scores import ITEM

    root = Path(__file__).resolve().parents[1]
    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(json.dumps(ITEM.model_dump() | {"id": f"t{k}"}) + "\n" for k in range(6))
    )
    run = [sys.executable, "-m", "tests.support.ray_gone", str(items)]
    ray = str(Path(sys.executable).with_name("ray"))
    # Ray 2.60's job CLI sends the token `ray start` saved only in token mode
    env = dict(os.environ, PYTHONPATH=str(root), RAY_AUTH_MODE="token")
    with ray_head(num_cpus=4, dashboard=True) as head:
        entrypoint = [f"PYTHONPATH={root}", *run, str(tmp_path / "job"), tiny_nli, "auto"]
        submit = [ray, "job", "submit", "--address", head.dashboard, "--", *entrypoint]
        deadline = time.monotonic() + 240
        while True:  # the head's job agent registers a while after the dashboard listens
            done = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=900)
            said = done.stdout + done.stderr
            if "No available agent" not in said or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert done.returncode == 0 and "succeeded" in said, said[-4000:]
        listed = subprocess.run(
            [
                ray,
                "list",
                "actors",
                "--address",
                head.dashboard,
                "--format",
                "json",
                "--limit",
                "1000",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        classes = [a["class_name"] for a in json.loads(listed.stdout)]
        assert any("_BatchScorer" in c for c in classes), classes  # the NLI ran on the cluster
    here = subprocess.run(
        [*run, str(tmp_path / "here"), tiny_nli, "local"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert here.returncode == 0, here.stderr[-3000:]

    def records(run_dir: str) -> dict[str, tuple]:
        lines = (tmp_path / run_dir / "results.jsonl").read_text().splitlines()
        return {
            r["id"]: (r["status"], r["score"], [x["label"] for x in r["details"]["relations"]])
            for r in map(json.loads, lines)
        }

    assert records("job") == records("here") and len(records("job")) == 6
