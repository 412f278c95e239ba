"""The Slurm launcher's plan (``scripts/slurm/launch.py --dry-run``), worked out by hand for the
allocations a judge of each size meets, and the Ray Serve LLM configuration the plan turns into
(captured here: no GPU can run it). The job itself, on two Slurm nodes: tests/test_cluster_recipes.

Replicas = Σ over nodes ⌊(GPUs of the node − its NLI GPU) / the judge's tensor parallelism⌋,
the preset's parallelism unless ``--gpus-per-replica``; NLI replicas one per node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "scripts" / "slurm" / "launch.py"
NLI = "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli"


def dry_run(*argv: str) -> subprocess.CompletedProcess:
    """The launcher as a user runs it on a login node: outside any job."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(LAUNCH), "--dry-run", *argv, "--", "groundcover", "eval", "x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def planned(*argv: str) -> dict:
    done = dry_run("--json", *argv)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_gpt_oss_120b_on_two_nodes_of_four_gpus_beside_the_nli_app():
    """Tensor parallelism 2 (the preset's); an NLI GPU on each node leaves 3: one replica of 2
    GPUs per node (3 // 2), two in all -- not the 7 a pooled count of single GPUs gave."""
    plan = planned("--allocation", "gpu01:4,gpu02:4", "--judge", "gpt-oss-120b", "--nli", NLI)
    assert plan["tensor_parallel"] == 2 and plan["tensor_parallel_from"] == "preset"
    assert plan["replicas"] == 2
    assert plan["replicas_per_node"] == {"gpu01": 1, "gpu02": 1}
    assert plan["nli_replicas_per_node"] == {"gpu01": 1, "gpu02": 1}
    assert plan["drivers_per_node"] == {"gpu01": 1, "gpu02": 1}
    assert plan["bundles_per_replica"] == [{"GPU": 1, "CPU": 1}] * 2
    assert plan["placement_strategy"] == "STRICT_PACK" and plan["judge_device"] == "cuda"
    assert plan["port_block"] == [10000, 10399]  # job 0 outside Slurm: the first block
    # without the NLI app: two replicas on each node
    alone = planned("--allocation", "2x4", "--judge", "gpt-oss-120b")
    assert alone["replicas"] == 4 and alone["replicas_per_node"] == {"node1": 2, "node2": 2}
    assert alone["nli_replicas_per_node"] == {"node1": 0, "node2": 0}


def test_a_70b_judge_on_two_nodes_of_eight_gpus():
    """Tensor parallelism 4: 8 // 4 = 2 replicas per node alone; beside an NLI GPU 7 // 4 = 1."""
    plan = planned("--allocation", "a:8,b:8", "--judge", "Llama-3.3-70B-Instruct")
    assert (plan["tensor_parallel"], plan["replicas"]) == (4, 4)
    assert plan["replicas_per_node"] == {"a": 2, "b": 2}
    beside = planned("--allocation", "a:8,b:8", "--judge", "Llama-3.3-70B-Instruct", "--nli", NLI)
    assert beside["replicas"] == 2 and beside["replicas_per_node"] == {"a": 1, "b": 1}
    assert beside["nli_replicas_per_node"] == {"a": 1, "b": 1}
    # two drivers per node, and a parallelism given by hand
    two = planned(
        *["--allocation", "a:8,b:8", "--judge", "Llama-3.3-70B-Instruct"],
        *["--gpus-per-replica", "8", "--drivers-per-node", "2"],
    )
    assert (two["tensor_parallel"], two["tensor_parallel_from"], two["replicas"]) == (8, "flag", 2)
    assert two["drivers"] == 4 and two["drivers_per_node"] == {"a": 2, "b": 2}


def test_an_8b_judge_on_one_gpu():
    plan = planned("--allocation", "gpu7:1", "--judge", "Llama-3.1-8B-Instruct")
    assert (plan["tensor_parallel"], plan["replicas"], plan["replicas_per_node"]) == (
        1,
        1,
        {"gpu7": 1},
    )
    assert plan["bundles_per_replica"] == [{"GPU": 1, "CPU": 1}]
    text = dry_run("--allocation", "gpu7:1", "--judge", "Llama-3.1-8B-Instruct")
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0] == "plan for job 0: 1 node(s); GPUs: gpu7 1"
    assert any("1 replica(s) of tensor parallelism 1 (preset)" in line for line in lines)
    assert any("at most 3 time(s)" in line for line in lines)


def test_a_model_that_fits_no_node_is_refused_in_one_line():
    """A 4-GPU replica on 3-GPU nodes would wait forever (or span nodes): refused."""
    done = dry_run("--allocation", "a:3,b:3", "--judge", "Llama-3.3-70B-Instruct")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "launch: Llama-3.3-70B-Instruct needs 4 GPUs on one node (tensor parallelism 4, preset) "
        "and no node has that many free: the most is 3 on a; ask for nodes with 4+ GPUs, fewer "
        "NLI replicas, or a smaller --gpus-per-replica"
    ]
    # 4-GPU nodes with the NLI app beside: the NLI GPU is said
    beside = dry_run("--allocation", "2x4", "--judge", "Llama-3.3-70B-Instruct", "--nli", NLI)
    assert beside.returncode == 1 and "(1 of its 4 for the NLI app)" in beside.stderr
    # more replicas than fit, more NLI replicas than nodes, no allocation outside a job
    many = dry_run("--allocation", "2x4", "--judge", "gpt-oss-120b", "--replicas", "5")
    assert "launch: --replicas 5: 4 replica(s) of 2 GPU(s) fit" in many.stderr
    nli = dry_run("--allocation", "2x4", "--nli", NLI, "--nli-replicas", "3")
    assert "one NLI replica per node, and the job has 2 node(s)" in nli.stderr
    outside = dry_run("--judge", "gpt-oss-120b")
    assert "outside a job needs --allocation" in outside.stderr and outside.returncode == 1
    bad = dry_run("--allocation", "a:four")
    assert bad.stderr.strip() == "launch: --allocation 'a:four': 'a:four' is not NODE:GPUS"


def test_cpu_replicas_and_the_job_env_of_a_real_allocation(monkeypatch):
    """On CPU nodes (the two-node test's) replicas are given, one bundle of one CPU each; in a
    job, the plan reads Slurm's variables (GPUs per node, restarts, the job's block)."""
    launch = load_script("scripts/slurm/launch.py", "slurm_launch")
    args = launch.parser().parse_args(["--judge", "/models/tiny", "--replicas", "1", "--", "x"])
    args.port_base = None
    plan = launch.plan_for(args, "57", {"n1": 0, "n2": 0}, 0)
    assert (plan.judge_device, plan.replicas, plan.bundles()) == ("cpu", 1, [{"CPU": 1}])
    assert plan.tensor_parallel_from == "default" and plan.served_name == "tiny"
    assert plan.ports["port"] == 10000 + 57 % 56 * 400
    auto = launch.parser().parse_args(["--judge", "/models/tiny", "--", "x"])
    auto.port_base = None
    with pytest.raises(SystemExit, match="--replicas auto counts GPUs"):
        launch.plan_for(auto, "57", {"n1": 0}, 0)
    monkeypatch.setattr(launch, "expand_nodes", lambda text: ["g1", "g2"])
    env = {"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "g[1-2]", "SLURM_GPUS_PER_NODE": "h100:4"}
    alloc = launch.Allocation(env | {"SLURM_RESTART_COUNT": "1"})
    judge = launch.parser().parse_args(["--judge", "gpt-oss-120b", "--", "x"])
    judge.port_base = None
    plan = launch.plan_for(judge, alloc.job, alloc.node_gpus, alloc.restarts)
    assert plan.replicas == 4 and plan.restarts == 1
    assert plan.lines()[-1].endswith("at most 3 time(s) (1 so far)")


def test_the_serve_llm_configuration_packs_each_replica_on_one_node():
    """What ``groundcover serve MODEL --replicas R`` hands Ray Serve LLM on GPU nodes: R
    replicas, a bundle of one GPU (and a CPU) per unit of tensor parallelism, STRICT_PACK so a
    replica never spans nodes, the parallelism in the engine's arguments."""
    from groundcover.serving.cluster.serve_app import llm_config
    from groundcover.serving.launch.server import ServerSpec

    config = llm_config(ServerSpec(model="gpt-oss-120b"), 2, "cuda")
    assert config.placement_group_config == {
        "bundles": [{"GPU": 1, "CPU": 1}] * 2,
        "strategy": "STRICT_PACK",
    }
    assert config.deployment_config["num_replicas"] == 2
    assert config.engine_kwargs["tensor_parallel_size"] == 2
    given = llm_config(
        ServerSpec(model="Llama-3.3-70B-Instruct", tensor_parallel_size=8), 1, "cuda"
    )
    assert given.placement_group_config["bundles"] == [{"GPU": 1, "CPU": 1}] * 8
    assert given.engine_kwargs["tensor_parallel_size"] == 8
    cpu = llm_config(ServerSpec(model="Llama-3.1-8B-Instruct"), 3, "cpu")
    assert cpu.placement_group_config == {"bundles": [{"CPU": 1}], "strategy": "STRICT_PACK"}


def test_prefetch_on_the_login_node_and_the_offline_check_on_a_compute_node(tmp_path):
    """``--prefetch`` with the job's arguments fetches the judge (without the checkpoint copies
    vLLM never reads), gpt-oss's tiktoken files, the NLI checkpoint and the datasets the command
    names, from a hub on loopback; a gated judge needs the user's token. ``--check-offline``
    with ``HF_HUB_OFFLINE=1`` names each thing missing before, and nothing after."""
    from tests.support.fake_hub import FakeHub

    adapter = tmp_path / "adapter"
    with FakeHub() as hub:
        hub.repo("acme/gpt-oss-mini").commit(
            {"config.json": b"{}", "model.safetensors": b"w" * 64, "original/model.bin": b"o"}
        )
        hub.repo("acme/nli-small").commit({"config.json": b"{}", "model.safetensors": b"n"})
        hub.repo("acme/gated-judge").commit({"config.json": b"{}"})
        hub.repo("acme/gated-judge").token = "hf_user"
        for name in ("o200k_base.tiktoken", "cl100k_base.tiktoken"):
            hub.static[f"/encodings/{name}"] = f"{name} ranks".encode()
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "HF_HOME": str(tmp_path / "hf"),
            "GROUNDCOVER_HOME": str(tmp_path / "gc"),
            "HF_ENDPOINT": hub.url,
            "GC_TIKTOKEN_URL": f"{hub.url}/encodings/",
        }
        job = [
            *["--judge", "acme/gpt-oss-mini", "--nli", "acme/nli-small"],
            *["--lora", f"claims={adapter}", "--", "groundcover", "eval", "fanoutqa"],
            *["--data", "fanoutqa-dev"],
        ]

        def launch(*argv: str, **more: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, str(LAUNCH), *argv],
                capture_output=True,
                text=True,
                env=env | more,
                timeout=300,
            )

        before = launch("--check-offline", *job, HF_HUB_OFFLINE="1")
        missing = sorted(
            line.split(": ", 2)[2].split(":")[0]
            for line in before.stderr.splitlines()
            if line.startswith("prefetch: missing")
        )
        assert before.returncode == 1, before.stderr
        assert missing == sorted(
            [
                "judge",
                "gpt-oss tokenizer file o200k_base.tiktoken",
                "gpt-oss tokenizer file cl100k_base.tiktoken",
                "NLI checkpoint",
                "adapter claims",
                "dataset fanoutqa-dev",
            ]
        ), before.stderr
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        fetched = launch("--prefetch", *job)
        assert fetched.returncode == 0, fetched.stderr
        asked = [path for _, path, _ in hub.log]
        assert any(p.endswith("/model.safetensors") for p in asked)
        assert not any("original/" in p for p in asked)  # a copy the engine never reads
        folder = tmp_path / "hf" / "tiktoken-encodings"
        assert (folder / "o200k_base.tiktoken").read_bytes() == b"o200k_base.tiktoken ranks"
        after = launch("--check-offline", *job, HF_HUB_OFFLINE="1")
        assert after.returncode == 0, after.stderr
        assert "missing" not in after.stderr and after.stderr.count("prefetch: present") == 6

        gated = ["--judge", "acme/gated-judge", "--", "groundcover", "eval", "x"]
        refused = launch("--prefetch", *gated)
        assert refused.returncode == 1
        assert "acme/gated-judge is gated: accept its licence" in refused.stderr
        assert launch("--prefetch", *gated, HF_TOKEN="hf_user").returncode == 0


def test_the_recipes_judge_serves_lora_adapters_and_the_command_names_them(monkeypatch):
    """``--lora NAME=PATH`` goes to every replica (``groundcover serve --lora``, Serve's
    multiplexing) and the command gets ``--adapter-prefix MODEL:`` (ICAT's claim extractor
    through the recipe); the judge's one start timeout is the server's too."""
    launch = load_script("scripts/slurm/launch.py", "slurm_launch")
    argv = ["--judge", "Llama-3.1-8B-Instruct", "--lora", "claims=/shared/adapters/icat"]
    args = launch.parser().parse_args([*argv, "--judge-start-timeout", "2400", "--", "x"])
    args.port_base = None
    plan = launch.plan_for(args, "7", {"g1": 2}, 0)
    alloc = launch.Allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "g1"})
    cluster = launch.Cluster(alloc, plan, "ray", launch.Stopping(), head="10.0.0.1")
    serve = launch.judge_serve_command(args, plan, cluster)
    assert "--lora=claims=/shared/adapters/icat" in serve
    assert serve[serve.index("--timeout") + 1] == "2400"
    assert serve[serve.index("--replicas") + 1] == "2"  # two GPUs, parallelism 1
    assert serve[serve.index("--tensor-parallel-size") + 1] == "1"
    url = "http://10.0.0.1:12819/v1"
    given = launch.judge_arguments(url, "Llama-3.1-8B-Instruct", plan, "abc123")
    assert given == [
        *["--endpoint", url, "--model", "Llama-3.1-8B-Instruct"],
        *["--api-key-env", "GROUNDCOVER_SERVE_API_KEY"],
        *["--adapter-prefix", "Llama-3.1-8B-Instruct:", "--model-revision", "abc123"],
    ]
    assert any("adapters claims" in line for line in plan.lines())
    no_judge = launch.parser().parse_args(["--lora", "claims=/x", "--", "x"])
    no_judge.port_base = None
    with pytest.raises(SystemExit, match="--lora is for the judge's replicas"):
        launch.plan_for(no_judge, "7", {"g1": 2}, 0)
