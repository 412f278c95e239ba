"""NLI on a Ray Serve app: a warm deployment the run calls through a handle.

Real Ray, real Serve, a tiny DeBERTa-v2 built here. The scores equal the local scorer's; a named
app outlives the runs that use it; and on a two-node cluster (a head and a second `ray start` on
this machine, told apart by custom resources) replicas are pinned by resource, recorded by node,
and a run survives the loss of the node one of its replicas lived on (`-m multinode`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from groundcover.retrieval.nli import CANONICAL, NliBatcher, NliScorer
from tests.test_scale import sentences

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_nli(tmp_path_factory):
    pytest.importorskip("ray.serve")
    from tests.support.tiny import build_tiny_classifier

    return str(build_tiny_classifier(tmp_path_factory.mktemp("nli") / "tiny-deberta"))


def some_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    premises, hypotheses = sentences(n, seed), sentences(n, seed + 1)
    return [(premises[i], hypotheses[(i * 7) % n]) for i in range(n)]


def test_a_serve_app_scores_as_the_local_scorer(tiny_nli):
    """Two replicas on a local Ray: the local scorer's probabilities for one call, for pairs
    pooled from concurrent callers, and for the decisions built on them; both replicas answer,
    and the app the scorer deployed goes with it."""
    import asyncio

    from groundcover.retrieval.nli_serve import ServeNliScorer

    pairs = some_pairs(120, 11)
    pairs += pairs[:7]  # repeated pairs: scored once, answered in place
    local = NliScorer(tiny_nli, batch_size=4).probabilities(pairs)
    # "CPU" is Ray's own key (num_cpus): Ray refuses it among custom resources
    scorer = ServeNliScorer(tiny_nli, replicas=2, batch_size=4, resources={"CPU": 1})
    try:
        assert len(scorer.placed) == 2 and len({r["pid"] for r in scorer.placed}) == 2
        remote = scorer.probabilities(pairs)
        assert remote.shape == (len(pairs), len(CANONICAL))
        np.testing.assert_allclose(remote, local, rtol=0, atol=1e-6)
        assert scorer.probabilities([]).shape == (0, 3)
        answered = scorer.placement()["answered"]
        assert len(answered) == 2  # 30 chunks of 4 spread over both replicas
        assert sum(r["pairs"] for r in answered.values()) == 120  # the unique pairs, once
        here = NliScorer(tiny_nli, batch_size=8)
        assert scorer.labels(pairs[:12]) == here.labels(pairs[:12])
        claim, passages = pairs[0][1], [p for p, _ in pairs[:6]]
        for threshold in (None, 0.2, 0.5):
            assert scorer.supported(claim, passages, threshold) == here.supported(
                claim, passages, threshold
            )

        async def items_in_flight() -> list[np.ndarray]:  # 12 items, 10 pairs each, pooled
            batcher = NliBatcher(scorer)
            try:
                return await asyncio.gather(
                    *(batcher.rows(pairs[k : k + 10]) for k in range(0, 120, 10))
                )
            finally:
                batcher.close()

        pooled = np.concatenate(asyncio.run(items_in_flight()))
        np.testing.assert_allclose(pooled, local[:120], rtol=0, atol=1e-6)
        # every replica's own count: what this scorer sent, no request lost or counted twice
        served = {r["pid"]: r["pairs"] for r in scorer.replicas()}
        assert sum(served.values()) == sum(r["pairs"] for r in answered.values())
    finally:
        scorer.close()
    assert not scorer.child.alive()


def test_placement_options_are_checked_in_one_line():
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.runtime.execution.nli_placement import parse_resources

    base = {"nli_backend": "cross-encoder", "nli_model": "m", "method": "nli"}
    old = ComprehensivenessOptions(**base, nli_actors=3)  # the option before Serve
    assert (old.nli_replicas, old.nli_bulk) == (3, True)
    assert ComprehensivenessOptions(**base, nli_replicas=2).nli_on_ray
    for bad, said in [
        ({"nli_app": "a", "nli_replicas": 2}, "a running app has its replicas"),
        ({"nli_bulk": True}, "how many Ray actors"),
        ({"nli_resources": '{"nli": 1}'}, "for the replicas nli_replicas deploys"),
        ({"nli_replicas": 2, "nli_resources": "[1]"}, "want {"),
        ({"nli_replicas": 2, "nli_resources": '{"nli": 0}'}, "AMOUNT > 0"),
        ({"nli_replicas": 1, "nli_bulk": True, "nli_resources": '{"x": 1}'}, "not the bulk actors"),
    ]:
        with pytest.raises(ValueError, match=said.replace("{", r"\{")):
            ComprehensivenessOptions(**base, **bad)
    with pytest.raises(ValueError, match="Ray runs the cross-encoder"):
        ComprehensivenessOptions(method="nli", nli_replicas=2)
    assert parse_resources('{"GPU": 1, "nli": 0.5}') == {"GPU": 1.0, "nli": 0.5}


# ---- two nodes on this machine -----------------------------------------------------------------


def cluster_state(address: str) -> dict:
    """Nodes (id, custom resources, alive), Serve apps and live NLI replica actors, asked from a
    driver of its own."""
    probe = f"""
import json, ray
from ray import serve
from groundcover.serving.cluster.join import connect
connect({address!r})
nodes = [{{"id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]}}
         for n in ray.nodes()]
try:
    apps = sorted(serve.status().applications)
except Exception:
    apps = []
replicas = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if "NliReplica" in a["name"]]
print(json.dumps({{"nodes": nodes, "apps": apps, "replicas": replicas}}))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def node_with(state: dict, resource: str) -> str:
    return next(n["id"] for n in state["nodes"] if n["alive"] and resource in n["resources"])


@pytest.mark.multinode
def test_two_nodes_a_named_app_pinned_warm_and_a_lost_node(tiny_nli, tmp_path):
    """A head and a worker node. (1) `serve --nli` deploys a named app pinned to the worker by a
    custom resource and returns; two runs in turn find it warm (the same replica process, its
    request count carried over); `--stop` deletes it. (2) A run whose replica is pinned to the
    worker loses it mid-run: no replica can come back, so after --nli-wait it stops with one
    error line, whole records only and no app or replica left; the same command resumes on the
    head to every item once, scored as a run without Ray scores it."""
    from groundcover.retrieval.nli_serve import NliAppError, ServeNliScorer
    from tests.support.ray_head import ray_head, ray_worker, wait_for_records
    from tests.test_exact_scores import ITEM

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "groundcover"]
    with ray_head(num_cpus=3, resources={"nli": 1}) as head:
        address = f"127.0.0.1:{head.port}"
        with ray_worker(head, num_cpus=2, resources={"nli": 1, "worker": 1}) as worker:
            state = cluster_state(address)
            assert sum(n["alive"] for n in state["nodes"]) == 2
            worker_node = node_with(state, "worker")

            # (1) a named app on the worker, found warm by two runs in turn
            deploy = [
                *cli,
                "serve",
                "--nli",
                tiny_nli,
                "--nli-app",
                "warm",
                "--ray-address",
                address,
                "--nli-resources",
                '{"worker": 1}',
            ]
            done = subprocess.run(deploy, capture_output=True, text=True, timeout=600, env=env)
            assert done.returncode == 0, done.stderr[-3000:]
            assert "warm is running" in done.stderr and worker_node[:12] in done.stderr
            pairs = some_pairs(40, 5)
            local = NliScorer(tiny_nli).probabilities(pairs)
            seen = []
            for _ in range(2):
                scorer = ServeNliScorer(tiny_nli, app="warm", address=address)
                np.testing.assert_allclose(scorer.probabilities(pairs), local, atol=1e-6)
                seen.append(scorer.replicas())
                scorer.close()  # a run ends; the app it did not deploy stays
            (first,), (second,) = seen
            assert first["node"] == second["node"] == worker_node  # pinned by resource
            assert first["pid"] == second["pid"]  # the same process: loaded once, warm
            assert second["pairs"] == 2 * first["pairs"] == 80
            with pytest.raises(NliAppError, match="serves .* not "):  # another model's name
                ServeNliScorer(tiny_nli + "/", app="warm", address=address)
            stop = [*cli, "serve", "--nli-app", "warm", "--stop", "--ray-address", address]
            done = subprocess.run(stop, capture_output=True, text=True, timeout=300, env=env)
            assert done.returncode == 0 and "deleted the NLI app warm" in done.stderr
            with pytest.raises(NliAppError, match="no running NLI app warm"):
                ServeNliScorer(tiny_nli, app="warm", address=address)

            # (2) the run's one replica lives on the worker, which is lost mid-run
            items, run_dir = tmp_path / "items.jsonl", tmp_path / "run"
            ids = [f"t{k:04d}" for k in range(800)]  # ~15 s of work: the loss lands mid-run
            items.write_text("".join(json.dumps(ITEM.model_dump() | {"id": i}) + "\n" for i in ids))
            command = [sys.executable, "-m", "tests.support.ray_gone", str(items)]
            on_worker = {"nli_replicas": 1, "nli_resources": '{"worker": 1}', "nli_wait": 10}
            run = subprocess.Popen(
                [*command, str(run_dir), tiny_nli, address, json.dumps(on_worker)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            results = run_dir / "results.jsonl"
            wait_for_records(results, 10, run, timeout=600)
            assert run.poll() is None, run.communicate()[1][-3000:]
            os.killpg(worker.pid, signal.SIGKILL)  # its raylet and the replica on it
            lost = time.monotonic()
            out, err = run.communicate(timeout=600)
        assert run.returncode == 1, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "no live NLI replica answered for 10s" in errors[0], err
        assert time.monotonic() - lost < 120
        done = [json.loads(line) for line in results.read_text().splitlines()]
        assert 10 <= len(done) < len(ids)  # whole records only
        after = cluster_state(address)
        assert not [a for a in after["apps"] if a.startswith("groundcover-nli")], after
        assert not after["replicas"], after  # no replica left behind, pending or live

        # the same command resumes, its replicas now on the head
        resumed = subprocess.run(
            [*command, str(run_dir), tiny_nli, address, json.dumps({"nli_replicas": 2})],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        records = [json.loads(line) for line in results.read_text().splitlines()]
        assert sorted(r["id"] for r in records) == ids  # every item, none twice
        summary = json.loads((run_dir / "summary.json").read_text())
        where = summary["nli_placement_this_invocation"]
        head_node = next(n["id"] for n in state["nodes"] if "worker" not in n["resources"])
        assert [r["node"] for r in where["replicas_at_start"]] == [head_node, head_node]
        assert sum(r["pairs"] for r in where["answered"].values()) > 0
        assert not cluster_state(address)["apps"]  # the resumed run's app went with it
    few = tmp_path / "few.jsonl"  # the same item: a few scored without Ray say how it scores
    few.write_text(
        "".join(json.dumps(ITEM.model_dump() | {"id": f"h{k}"}) + "\n" for k in range(3))
    )
    here = [*command[:-1], str(few), str(tmp_path / "here"), tiny_nli, "local"]
    done = subprocess.run(here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the same item 800 times: one status and score, on the lost node's run as here
    lines = (tmp_path / "here" / "results.jsonl").read_text().splitlines()
    local_records = [json.loads(line) for line in lines]
    assert {(r["status"], r["score"]) for r in records} == {
        (r["status"], r["score"]) for r in local_records
    }
    assert len({(r["status"], r["score"]) for r in records}) == 1
