"""The cluster job's plan (``groundcover cluster plan``), worked out by hand for the allocations a
judge of each size meets, and the Ray Serve LLM configuration the plan turns into (captured
here: no GPU can run it). The job itself, on two Slurm nodes: tests/test_cluster_recipes.

Each model is sized from its own config.json (the published configs' numbers, written into a
Hugging Face cache or a model folder here): weights = parameters × bytes per parameter (bf16 2;
gpt-oss's MXFP4 experts 4.25 bits), plus one sequence's KV cache at the context length
(2 × KV heads × head dim × 2 bytes per token and layer; gpt-oss's sliding layers keep 128
tokens). vLLM uses 0.9 of an 80 GiB GPU: 72 GiB, or 0.8 (64 GiB) where an NLI replica takes
0.1 of it. The parallelism is the smallest that divides the heads and holds a replica.

- gpt-oss-120b: 116.8e9 parameters; 114.7e9 in MXFP4 experts (60.9e9 bytes) + 2.13e9 in bf16
  → weights 60.7 GiB; KV 18 full layers × 2 × 8 × 64 × 2 B × 131,072 = 4.5 GiB: 65.2 GiB ≤ 72
  → TP 1 (> 64: TP 2 beside an NLI share).
- Llama-3.3-70B: 70.55e9 × 2 = 131.4 GiB; KV 80 × 2 × 8 × 128 × 2 B × 131,072 (its config's
  context) = 40 GiB: 171.4 GiB; TP 2 → 85.7 > 72, TP 4 → 42.9 (≤ 64 too).
- Llama-3.1-8B at the preset's 32,768: 15.0 + 4.0 = 19 GiB → TP 1.
- Qwen2.5-72B at 32,768: 72.7e9 × 2 = 135.4 GiB + KV 10 GiB = 145.4; TP 2 → 72.7 > 72 → TP 4.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from groundcover.serving.cluster import plan as cluster_plan
from groundcover.serving.cluster.plan import JudgeAsk, PlanAsk, PlanError, plan_for
from groundcover.serving.cluster.sizing import GIB

ROOT = Path(__file__).resolve().parents[1]
NLI = "MoritzLaurer/DeBERTa-v3-large-mnli-fever-anli-ling-wanli"
FANOUTQA = ["groundcover", "eval", "fanoutqa", "--data", "fanoutqa-dev", "--setting"]
FANOUTQA += ["closed-book", "--judge"]

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "hidden_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "intermediate_size": 2880,
    "num_local_experts": 128,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
}
LLAMA_70B = {
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
LLAMA_8B = LLAMA_70B | {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 14336,
}
QWEN_72B = LLAMA_70B | {"intermediate_size": 29568, "vocab_size": 152064}
QWEN_72B |= {"max_position_embeddings": 32768, "sliding_window": 131072}
CONFIGS = {
    "openai/gpt-oss-120b": GPT_OSS_120B,
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA_8B,
    "Qwen/Qwen2.5-72B-Instruct": QWEN_72B,
    "meta-llama/Llama-3.3-70B-Instruct": LLAMA_70B,
}


def cache_configs(home: Path, configs: dict[str, dict]) -> None:
    """Each repository's config.json in a Hugging Face cache, as a download leaves it."""
    for repo, config in configs.items():
        folder = home / "hub" / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text("0" * 40)
        snapshot = folder / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    """The presets' configs in this test's Hugging Face cache, offline; a local 70B folder."""
    home = tmp_path / "hf"
    cache_configs(home, CONFIGS)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "models" / "Llama-3.3-70B-Instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    return folder


def planned(nodes: dict[str, int], judge: str | None = None, **given) -> cluster_plan.Plan:
    judge_options = {k: given.pop(k) for k in ("gpus_per_replica", "replicas") if k in given}
    ask = PlanAsk(
        judge=JudgeAsk(judge, **judge_options) if judge else None,
        gpu_memory_gib=given.pop("gpu_memory_gib", 80.0),
        **given,
    )
    return plan_for(ask, "0", nodes, 0)


def per_node(plan: cluster_plan.Plan, what: str) -> dict[str, int]:
    return {n.name: getattr(n, what) for n in plan.nodes}


def test_gpt_oss_120b_on_two_nodes_of_four_80gb_gpus_with_and_without_the_nli_app(models):
    """65.2 GiB fits one GPU: alone, 4 replicas of TP 1 a node (8 in all, not the preset's 2 ×
    TP 2); beside an NLI app on a GPU of its own, 3 a node (6, every GPU used -- the old plan,
    2 × TP 2, left 2 idle); with the NLI app on 0.1 of a judge's GPU (64 GiB left) TP 2, 2 a
    node, each judge's bundle 0.9 of a GPU."""
    alone = planned({"gpu01": 4, "gpu02": 4}, "gpt-oss-120b")
    assert (alone.tensor_parallel, alone.tensor_parallel_from, alone.replicas) == (1, "memory", 8)
    assert per_node(alone, "judge_replicas") == {"gpu01": 4, "gpu02": 4}
    assert alone.size is not None and round(alone.size.needed / GIB, 1) == 65.2
    assert round(alone.size.weight_bytes / GIB, 1) == 60.7 and alone.size.quantisation == "MXFP4"
    assert alone.max_model_len == 131072  # the preset's
    beside = planned({"gpu01": 4, "gpu02": 4}, "gpt-oss-120b", nli=NLI)
    assert (beside.tensor_parallel, beside.replicas) == (1, 6)
    assert per_node(beside, "judge_replicas") == {"gpu01": 3, "gpu02": 3}
    assert per_node(beside, "nli_replicas") == {"gpu01": 1, "gpu02": 1}
    assert per_node(beside, "idle_gpus") == {"gpu01": 0, "gpu02": 0}
    assert beside.bundles() == [{"GPU": 1.0, "CPU": 1}]
    shared = planned({"gpu01": 4, "gpu02": 4}, "gpt-oss-120b", nli=NLI, nli_gpu_fraction=0.1)
    assert (shared.tensor_parallel, shared.replicas, shared.utilisation) == (2, 4, 0.8)
    assert per_node(shared, "judge_replicas") == {"gpu01": 2, "gpu02": 2}
    assert shared.bundles() == [{"GPU": 0.9, "CPU": 1}] * 2
    assert shared.nli_resources("groundcover_nli") == {"groundcover_nli": 1, "GPU": 0.1}
    assert per_node(shared, "idle_gpus") == {"gpu01": 0, "gpu02": 0}


def test_a_local_70b_folder_on_two_nodes_of_eight_beside_the_nli_app(models):
    """A folder is sized from its own config (171.4 GiB at its 131,072 tokens: TP 4), never
    planned as 16 × TP 1. Beside an NLI GPU, 7 // 4 = 1 replica a node and 3 GPUs idle -- the
    plan says so, and that a 0.1 share would fit 2; with it, 2 a node and none idle."""
    whole = planned({"a": 8, "b": 8}, str(models), nli=NLI)
    assert (whole.served_name, whole.tensor_parallel, whole.replicas) == (
        "Llama-3.3-70B-Instruct",
        4,
        2,
    )
    assert whole.max_model_len == 131072 and round(whole.size.needed / GIB, 1) == 171.4
    assert per_node(whole, "idle_gpus") == {"a": 3, "b": 3}
    why = whole.nodes[0].idle_why
    assert why.startswith("a replica needs 4 GPU(s) (tensor parallelism 4) and 3 are left")
    assert "--nli-gpu-fraction 0.1 puts the NLI app beside a judge and fits 2" in why
    assert "plan: 3 GPU(s) idle on a: a replica needs 4" in "\n".join(whole.lines())
    shared = planned({"a": 8, "b": 8}, str(models), nli=NLI, nli_gpu_fraction=0.1)
    assert (shared.tensor_parallel, shared.replicas) == (4, 4)
    assert per_node(shared, "judge_replicas") == {"a": 2, "b": 2}
    assert per_node(shared, "idle_gpus") == {"a": 0, "b": 0}
    # a parallelism given by hand wins, and two drivers per node
    given = planned({"a": 8, "b": 8}, str(models), gpus_per_replica=8, drivers_per_node=2)
    assert (given.tensor_parallel, given.tensor_parallel_from, given.replicas) == (
        8,
        "--gpus-per-replica",
        2,
    )
    assert given.drivers == 4


def test_an_8b_judge_on_one_gpu_and_a_72b_on_eight(models):
    small = planned({"gpu7": 1}, "Llama-3.1-8B-Instruct")
    assert (small.tensor_parallel, small.replicas, small.max_model_len) == (1, 1, 32768)
    assert round(small.size.needed / GIB) == 19
    large = planned({"n1": 8}, "Qwen2.5-72B-Instruct")
    assert (large.tensor_parallel, large.replicas) == (4, 2)  # TP 2: 72.7 GiB a GPU > 72
    assert round(large.size.needed / GIB, 1) == 145.4


def test_uneven_nodes_each_get_what_fits_on_them(models):
    """n1 with 8 GPUs and n2 with 4 (``--gpus=12``): TP 4 is 2 replicas on n1 and 1 on n2 --
    not 2 × 2 on nodes taken to be alike."""
    plan = planned({"n1": 8, "n2": 4}, str(models))
    assert per_node(plan, "judge_replicas") == {"n1": 2, "n2": 1} and plan.replicas == 3


def test_gpus_of_different_sizes_size_the_judge_for_the_smallest_node(models):
    """Each node's ``job ports`` task reads its own GPUs (nvidia-smi, MiB). n1's 4 × 80 GB
    (81,559 MiB = 79.6 GiB) beside n2's 4 × 40 GB (40,960 MiB = 40 GiB): a replica may land on
    either, so 40 sizes it. gpt-oss-120b (65.2 GiB) at 0.9 of 40 = 36 GiB: TP 1 holds 65.2 >
    36 - 3.5, TP 2 32.6 > 36 - 5, TP 4 16.3 <= 31 -> TP 4, one replica a node (sized from the
    head's 80 it would be 8 × TP 1, and n2's four would run out of memory)."""
    nodes = {"n1": 4, "n2": 4, "cpu0": 0}
    reported = {"n1": [81559.0] * 4, "n2": [40960.0] * 4, "cpu0": []}
    memory = cluster_plan.smallest_gpu_memory(reported, nodes)
    assert memory == (
        40.0,
        "nvidia-smi on each node, the smallest: n2's; n1 79.6 GiB",
        {
            "n1": 79.6,
            "n2": 40.0,
        },
    )
    gib, where, each = memory
    plan = plan_for(PlanAsk(judge=JudgeAsk("gpt-oss-120b")), "0", nodes, 0, (gib, where), each)
    assert (plan.tensor_parallel, plan.replicas) == (4, 2)
    assert per_node(plan, "judge_replicas") == {"n1": 1, "n2": 1, "cpu0": 0}
    assert "GPUs of 40 GiB (nvidia-smi on each node, the smallest: n2's; n1 79.6 GiB)" in (
        "\n".join(plan.lines())
    )
    assert plan.as_json()["gpu_memory_gib_per_node"] == {"n1": 79.6, "n2": 40.0}
    # alike nodes say so; a node with GPUs that read none is named; nothing read: None
    alike = cluster_plan.smallest_gpu_memory({"n1": [81559.0], "n2": [81559.0]}, {"n1": 1, "n2": 1})
    assert alike == (79.6, "nvidia-smi on each of 2 node(s)", {"n1": 79.6, "n2": 79.6})
    unread = cluster_plan.smallest_gpu_memory({"n1": [40960.0]}, {"n1": 1, "n2": 1})
    assert unread is not None and unread[1] == "nvidia-smi on each of 1 node(s); not read on n2"
    assert cluster_plan.smallest_gpu_memory({"n1": []}, {"n1": 1}) is None


def test_an_nli_share_that_raises_the_parallelism_says_so(models):
    """gpt-oss-120b on 2 × 4 with --nli-gpu-fraction 0.1: vLLM keeps 0.8 of each GPU (64 GiB,
    less 3.5 < 65.2), so TP 2 and 4 replicas, where the NLI app on a GPU of its own leaves
    3 × TP 1 a node, 6: the plan says it in one line. A share that costs nothing (the 70B's TP
    4 either way) says nothing."""
    shared = planned({"gpu01": 4, "gpu02": 4}, "gpt-oss-120b", nli=NLI, nli_gpu_fraction=0.1)
    why = (
        "--nli-gpu-fraction 0.1 leaves vLLM 0.8 of each GPU, too little for a replica on 1 "
        "GPU(s) (65.2 GiB): tensor parallelism 2, 4 replica(s); without the share (the NLI app "
        "on a GPU of its own) 1, 6 replica(s)"
    )
    assert shared.tensor_parallel_why == why and f"plan: {why}" in shared.lines()
    assert shared.as_json()["tensor_parallel_why"] == why
    large = planned({"a": 8, "b": 8}, str(models), nli=NLI, nli_gpu_fraction=0.1)
    assert large.tensor_parallel == 4 and large.tensor_parallel_why is None


def test_a_model_that_fits_no_node_is_refused_in_one_line(models):
    """A 70B on 3-GPU nodes: TP 3 does not divide its 64 heads and TP 2 holds 85.7 GiB a GPU;
    by hand, TP 4 cannot be placed on 3 GPUs. Refused, never a replica that waits forever."""
    with pytest.raises(PlanError) as refused:
        planned({"a": 3, "b": 3, "c": 3}, str(models))
    assert str(refused.value).startswith(
        "Llama-3.3-70B-Instruct fits no node: one replica needs 171.4 GiB: weights 131.4 "
        "(bfloat16) + KV cache 40.0 at 131072 tokens, and a node has at most 3 GPU(s) of 80 GiB"
    )
    with pytest.raises(PlanError, match="needs 4 GPUs on one node .* the most is 3 on a;"):
        planned({"a": 3, "b": 3, "c": 3}, str(models), gpus_per_replica=4)
    with pytest.raises(PlanError, match="--replicas 5: 4 replica.s. of 4 GPU.s. fit"):
        planned({"a": 8, "b": 8}, str(models), replicas="5")
    with pytest.raises(PlanError, match="one NLI replica per node, and the job has 2 node"):
        planned({"a": 4, "b": 4}, nli=NLI, nli_replicas="3")
    with pytest.raises(PlanError, match="is not NODE:GPUS"):
        cluster_plan.parse_allocation("a:four")
    assert cluster_plan.parse_allocation("2x4") == {"node1": 4, "node2": 4}


def test_a_model_without_a_config_is_not_sized_by_guess(tmp_path, monkeypatch):
    """No config.json anywhere: a preset keeps its own parallelism and the plan says why; any
    other model is refused (never tensor parallelism 1 by default)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    preset = planned({"a": 8}, "Llama-3.3-70B-Instruct")
    assert preset.tensor_parallel == 4 and preset.tensor_parallel_from.startswith("preset: no")
    with pytest.raises(PlanError, match="no config.json found to size it from"):
        planned({"a": 8}, "acme/unknown-model")


def test_cpu_replicas_and_the_job_read_from_slurm(tmp_path, monkeypatch):
    """On CPU nodes (the two-node test's) replicas are given, one bundle of one CPU each. In a
    job, each node's GPUs are Slurm's per-node GRES (``scontrol show job -d``, a heterogeneous
    job's components too), not the head's count everywhere."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    cpu = plan_for(PlanAsk(judge=JudgeAsk(str(folder), replicas="1")), "57", {"n1": 0, "n2": 0})
    assert (cpu.judge_device, cpu.replicas, cpu.bundles()) == ("cpu", 1, [{"CPU": 1}])
    assert cpu.served_name == "tiny" and cpu.ports["port"] == 10000 + 57 % 56 * 400
    with pytest.raises(PlanError, match="--replicas auto counts GPUs"):
        plan_for(PlanAsk(judge=JudgeAsk(str(folder))), "57", {"n1": 0})
    detail = (
        "JobId=99 JobName=groundcover\n   NumNodes=2 NumCPUs=24\n"
        "     Nodes=n1 CPU_IDs=0-15 Mem=0 GRES=gpu:h100:8(IDX:0-7)\n"
        "     Nodes=n2 CPU_IDs=0-7 Mem=0 GRES=gpu:h100:4(IDX:0-3)\n"
    )
    monkeypatch.setattr(cluster_plan, "expand_nodes", lambda text: text.split(","))
    env = {"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "n1,n2", "SLURM_GPUS_ON_NODE": "8"}
    alloc = cluster_plan.Allocation.from_slurm(env | {"SLURM_RESTART_COUNT": "1"}, detail)
    assert alloc.node_gpus == {"n1": 8, "n2": 4} and alloc.restarts == 1
    assert alloc.gpus_from == "scontrol"
    het = {"SLURM_JOB_ID": "5", "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "a"}
    het |= {"SLURM_JOB_NODELIST_HET_GROUP_1": "b,c"}
    het_detail = (
        "JobId=5 HetJobId=5 HetJobOffset=0\n     Nodes=a CPU_IDs=0-3 Mem=0 GRES=\n"
        "JobId=6 HetJobId=5 HetJobOffset=1\n     Nodes=b CPU_IDs=0-63 Mem=0 GRES=gpu:4(IDX:0-3)\n"
        "     Nodes=c CPU_IDs=0-63 Mem=0 GRES=gpu:a100:2(IDX:0-1),gpu:h100:2(IDX:2-3)\n"
    )
    found = cluster_plan.Allocation.from_slurm(het, het_detail)
    assert found.nodes == ["a", "b", "c"] and found.node_gpus == {"a": 0, "b": 4, "c": 4}
    # without the detail, the job's per-node request, else this node's count
    alone = cluster_plan.Allocation.from_slurm(env | {"SLURM_GPUS_PER_NODE": "h100:4"}, "")
    assert alone.node_gpus == {"n1": 4, "n2": 4} and alone.gpus_from == "SLURM_GPUS_PER_NODE"


def test_the_serve_llm_configuration_packs_each_replica_on_one_node():
    """What ``groundcover serve MODEL --replicas R`` hands Ray Serve LLM on GPU nodes: R
    replicas, a bundle of one GPU (or the share an NLI replica leaves) and a CPU per unit of
    tensor parallelism, STRICT_PACK so a replica never spans nodes."""
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
        ServerSpec(model="Llama-3.3-70B-Instruct", tensor_parallel_size=4, gpu_share=0.9), 1, "cuda"
    )
    assert given.placement_group_config["bundles"] == [{"GPU": 0.9, "CPU": 1}] * 4
    assert given.runtime_env["env_vars"]["VLLM_RAY_PER_WORKER_GPUS"] == "0.9"
    cpu = llm_config(ServerSpec(model="Llama-3.1-8B-Instruct"), 3, "cpu")
    assert cpu.placement_group_config == {"bundles": [{"CPU": 1}], "strategy": "STRICT_PACK"}


# ---- the command line: the inner command checked by the same CLI ---------------------------------


def cluster(*argv: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    """``groundcover cluster ...`` as a user runs it on a login node: outside any job, its
    homes under ``home``."""
    given = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    given |= {"HOME": str(home), "HF_HOME": str(home / "hf")} | env
    given["GROUNDCOVER_HOME"] = str(home / "gc-home")
    return subprocess.run(
        [sys.executable, "-m", "groundcover", "cluster", *argv],
        capture_output=True,
        text=True,
        env=given,
        timeout=120,
    )


@dataclass
class Said:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def plan_here(tmp_path, monkeypatch) -> Callable[..., Said]:
    return planner(tmp_path, monkeypatch)


def planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Said]:
    """``groundcover cluster plan ...`` in this process (the CLI as a user calls it, without a
    new interpreter each time), its homes under the test's folder, the presets' configs in its
    Hugging Face cache, offline."""
    from typer.testing import CliRunner

    from groundcover.pipelines.cli.main import app

    cache_configs(tmp_path / "hf", CONFIGS)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "gc-home"))
    for name in ("SLURM_JOB_ID", "GC_GRID", "GC_RAY_PORT_BASE"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    def plan(*argv: str) -> Said:
        done = runner.invoke(app, ["cluster", "plan", *argv])
        return Said(done.exit_code, done.stdout, done.stderr)

    return plan


def test_the_plan_checks_the_command_with_the_flags_the_job_adds(tmp_path, plan_here):
    """The NLI app only where the command takes --nli-app (and its options allow it); an
    unknown option, or a command that is not ours, refused in one line before anything starts;
    ``--json`` lists what the command reads under ``inputs``, its default dataset included."""
    base = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b"]
    fanout = plan_here(*base, "--nli", NLI, "--", *FANOUTQA)
    assert fanout.returncode == 2 and fanout.stdout == ""
    assert fanout.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` takes no --nli-app, which the job adds: it hands "
        "the command the NLI app of --nli: drop --nli, or run a command that scores NLI on Ray "
        "(eval icat; eval comprehensiveness --method nli --nli-backend cross-encoder "
        "--nli-model M)"
    ]
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    comp = ["groundcover", "eval", "comprehensiveness", str(items)]
    no_backend = plan_here(*base, "--nli", NLI, "--", *comp)
    assert no_backend.returncode == 2 and len(no_backend.stderr.splitlines()) == 1
    assert no_backend.stderr.startswith(
        "error: cluster plan: `eval comprehensiveness` with the flags the job adds (--ray-address "
        "--drivers --nli-app --endpoint"
    )
    assert "Ray runs the cross-encoder (--nli-backend)" in no_backend.stderr
    typo = plan_here(*base, "--", *FANOUTQA, "--dat", "x")
    assert typo.returncode == 2 and typo.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa`: No such option: --dat (Possible options: "
        "--adapter, --data)"
    ]
    other = plan_here(*base, "--", "python", "-c", "print(1)")
    assert other.returncode == 2 and "must be a groundcover command" in other.stderr
    # the command's own --driver-resources is checked as given (the job's is added in the job,
    # only where the command places none), so a bad one stops the plan, not the job
    placed = plan_here(*base, "--", *FANOUTQA, "--driver-resources", "notjson")
    assert placed.returncode == 2 and len(placed.stderr.splitlines()) == 1, placed.stderr
    assert "driver_resources" in placed.stderr and "not JSON" in placed.stderr
    done = plan_here(*base, "--json", "--", "groundcover", "meta-eval", "wikicontradict")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (plan["replicas"], plan["tensor_parallel"]) == (8, 1)
    assert plan["replicas_per_node"] == {"node1": 4, "node2": 4}
    assert plan["nli_replicas_per_node"] == {"node1": 0, "node2": 0}
    inputs = plan["inputs"]
    assert [d["name"] for d in inputs["datasets"]] == ["wikicontradict-humaneval"]
    assert {"kind": "hub", "for": "judge", "name": "openai/gpt-oss-120b"} in inputs["models"]
    assert sorted(t["name"] for t in inputs["tokenizers"]) == [
        "cl100k_base.tiktoken",
        "o200k_base.tiktoken",
    ]


def test_a_command_that_places_its_drivers_keeps_its_placement(tmp_path):
    """The job adds its --driver-resources only where the command gives none: a flag of its
    own (either form) or ``run.driver_resources`` in its --config (a flag would win over it)."""
    from groundcover.pipelines.cli.cluster import check_command, own_driver_placement

    ask = PlanAsk()
    assert not own_driver_placement(check_command(FANOUTQA, ask, None))
    flag = check_command([*FANOUTQA, "--driver-resources={}"], ask, None)
    assert own_driver_placement(flag)
    config = tmp_path / "run.yaml"
    config.write_text('run:\n  driver_resources: [{"CPU": 2}]\n')
    assert own_driver_placement(check_command([*FANOUTQA, "--config", str(config)], ask, None))


def test_the_deprecated_launcher_warns_and_hands_over_to_cluster_plan(tmp_path):
    """``scripts/slurm/launch.py --dry-run`` is ``groundcover cluster plan``: a warning, then the
    same plan."""
    cache_configs(tmp_path / "hf", CONFIGS)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    env |= {"HF_HUB_OFFLINE": "1", "GROUNDCOVER_HOME": str(tmp_path / "gc")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/slurm/launch.py"), "--dry-run", "--json"]
        + ["--allocation", "gpu7:1", "--judge", "Llama-3.1-8B-Instruct", "--", *FANOUTQA],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "launch.py is deprecated: run `groundcover cluster plan ...`" in done.stderr
    assert json.loads(done.stdout)["replicas_per_node"] == {"gpu7": 1}
    # run by a Python without groundcover (the environment not activated): one line, no
    # traceback, non-zero
    (bare := tmp_path / "bare").mkdir()
    alone = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "scripts/slurm/launch.py"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=bare,
        timeout=60,
    )
    assert alone.returncode == 1 and "Traceback" not in alone.stderr
    assert alone.stderr.strip().splitlines() == [
        f"launch.py: groundcover is not installed for {sys.executable}: activate the "
        "environment ./setup.sh made (docs/clusters.md, Slurm), then `groundcover cluster`"
    ]


def test_prefetch_on_the_login_node_and_the_offline_check_on_a_compute_node(tmp_path):
    """``cluster prefetch`` with the job's arguments fetches what the command's own request
    reads -- the judge (without the checkpoint copies vLLM never reads), gpt-oss's tiktoken
    files, the NLI checkpoint the command names, ``--dataset`` -- from a hub on loopback; a
    gated judge needs the user's token. ``cluster check-offline`` with ``HF_HUB_OFFLINE=1``
    names each thing missing before, and nothing after; a command's default dataset is on
    its list though the command names none."""
    from tests.support.fake_hub import FakeHub

    adapter = tmp_path / "adapter"
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    with FakeHub() as hub:
        hub.repo("acme/gpt-oss-mini").commit(
            {"config.json": b"{}", "model.safetensors": b"w" * 64, "original/model.bin": b"o"}
        )
        hub.repo("acme/nli-small").commit({"config.json": b"{}", "model.safetensors": b"n"})
        hub.repo("acme/gated-judge").commit({"config.json": b"{}"})
        hub.repo("acme/gated-judge").token = "hf_user"
        for name in ("o200k_base.tiktoken", "cl100k_base.tiktoken"):
            hub.static[f"/encodings/{name}"] = f"{name} ranks".encode()
        env = {"HF_ENDPOINT": hub.url, "GC_TIKTOKEN_URL": f"{hub.url}/encodings/"}
        nli = ["--method", "nli", "--nli-backend", "cross-encoder", "--nli-model"]
        job = [
            *["--judge", "acme/gpt-oss-mini", "--nli", "acme/nli-small"],
            *["--lora", f"claims={adapter}", "--dataset", "fanoutqa-dev", "--"],
            *["groundcover", "eval", "comprehensiveness", str(items), *nli, "acme/nli-small"],
        ]
        before = cluster("check-offline", *job, home=tmp_path, **env)
        missing = sorted(
            line.split(": ", 2)[2].split(":")[0]
            for line in before.stderr.splitlines()
            if line.startswith("cluster: missing")
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
        assert f"cluster: present: option input: {items}" in before.stderr
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        fetched = cluster("prefetch", *job, home=tmp_path, HF_HUB_OFFLINE="0", **env)
        assert fetched.returncode == 0, fetched.stderr
        asked = [path for _, path, _ in hub.log]
        assert any(p.endswith("/model.safetensors") for p in asked)
        assert not any("original/" in p for p in asked)  # a copy the engine never reads
        folder = tmp_path / "hf" / "tiktoken-encodings"
        assert (folder / "o200k_base.tiktoken").read_bytes() == b"o200k_base.tiktoken ranks"
        after = cluster("check-offline", *job, home=tmp_path, **env)
        assert after.returncode == 0, after.stderr
        assert "missing" not in after.stderr and "present: dataset fanoutqa-dev" in after.stderr

        # a default dataset: meta-eval wikicontradict reads wikicontradict-humaneval unasked
        wiki = ["--", "groundcover", "meta-eval", "wikicontradict"]
        default = cluster("check-offline", *wiki, home=tmp_path / "fresh")
        assert default.returncode == 1
        assert "missing: dataset wikicontradict-humaneval" in default.stderr

        gated = ["--judge", "acme/gated-judge", "--", *FANOUTQA]
        refused = cluster("prefetch", *gated, home=tmp_path, HF_HUB_OFFLINE="0", **env)
        assert refused.returncode == 1
        assert "acme/gated-judge is gated: accept its licence" in refused.stderr
        token = {"HF_TOKEN": "hf_user", "HF_HUB_OFFLINE": "0"}
        assert cluster("prefetch", *gated, home=tmp_path, **env, **token).returncode == 0


def test_the_plan_dry_runs_the_command_where_what_it_reads_is_here(tmp_path, plan_here):
    """With everything the command reads on this node (a judge folder, its items), the plan
    runs the command's own dry run: an items file with a bad record is refused now, in one
    line naming file, record and field -- not after a judge has loaded. Where something is
    missing, the job runs it first."""
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    job = ["--allocation", "1x1", "--gpu-memory", "80", "--judge", str(folder), "--json", "--"]
    comp = ["groundcover", "eval", "comprehensiveness"]
    done = plan_here(*job, *comp, str(items))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["command_dry_run"].startswith("passed")
    assert "dry run: inputs checked" in done.stderr  # the command's own, on stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(items.read_text().splitlines()[0] + '\n{"id": "x2"}\n')
    refused = plan_here(*job, *comp, str(bad))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"error: cluster plan: {bad}:2: record 'x2': field query: Field required (+2 more)"
    ]
    waits = plan_here(*job[:-1], "--nli", NLI, "--", *comp, str(items), "--method", "nli")
    assert waits.returncode == 2  # no cross-encoder: refused by the command's options
    later = plan_here(*job, *FANOUTQA)  # fanoutqa-dev is not fetched here
    assert json.loads(later.stdout)["command_dry_run"].startswith("in the job, first")
