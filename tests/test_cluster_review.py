"""The cluster job read from zero as its docs say (issue 89's review): a job that would fail only
after its judge loaded is refused by the plan or the offline check instead.

- ``--nli A`` with a command whose ``--nli-model`` is B: the run refuses the app (it would record
  one checkpoint and score with another), but only once it starts; the plan refuses it now.
- ``check-offline``: a hub snapshot holding a config alone -- what ``cluster plan`` leaves in the
  Hugging Face cache when it reads a model's config.json to size it -- is not the model.
- A command given a flag the job adds (``--endpoint``/``--model`` with ``--judge``, ``--nli-app``
  with ``--nli``): the job's own value won silently; refused in one line.
- ``--dataset`` with a name the catalogue does not have: refused in one line by ``plan``,
  ``prefetch`` and ``check-offline`` (the offline check ended in a traceback, the plan took it).
- Sizing: vLLM's budget (0.9 of a GPU) holds its runtime too, beside weights and KV cache; a
  70B at 32,768 tokens is 70.7 GiB a GPU at TP 2, which leaves no room for it in 72 GiB.
- A quantised checkpoint sized by the bits its config names (bitsandbytes 8-bit, compressed-
  tensors W4A16, NVFP4), and a gpt-oss folder of any name given its tokenizer files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groundcover.serving.cluster import fetch
from groundcover.serving.cluster.sizing import GIB, runtime_reserve, size_of
from tests.test_cluster_plan import FANOUTQA, LLAMA_70B, NLI, ROOT, planner

OTHER_NLI = "cross-encoder/nli-deberta-v3-small"


def test_the_plan_refuses_a_command_whose_nli_model_is_not_the_apps(tmp_path, monkeypatch):
    plan = planner(tmp_path, monkeypatch)
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--nli", NLI]
    comp = ["groundcover", "eval", "comprehensiveness", str(items), "--method", "nli"]
    comp += ["--nli-backend", "cross-encoder", "--nli-model"]

    other = plan(*job, "--", *comp, OTHER_NLI)
    assert other.returncode == 2 and other.stdout == ""
    assert other.stderr.splitlines() == [
        f"error: cluster plan: `eval comprehensiveness`: --nli-model {OTHER_NLI} is not the NLI "
        f"app's checkpoint (--nli {NLI}): the run would refuse the app after the judge loaded; "
        "give both the same checkpoint"
    ]
    same = plan(*job, "--json", "--", *comp, NLI)
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["nli_replicas"] == 2

    icat = ["groundcover", "eval", "icat", str(items), "--queries", str(items), "--index"]
    refused = plan(*job, "--", *icat, str(tmp_path), "--nli-model", OTHER_NLI)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"error: cluster plan: `eval icat`: --nli-model {OTHER_NLI}")


def cached_snapshot(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A repository in a Hugging Face cache as the hub's client leaves it (no file listing)."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for name, body in files.items():
        (snapshot / name).write_bytes(body)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("c" * 40)
    return snapshot


def test_the_offline_check_finds_a_models_weights_not_only_its_config(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    config = json.dumps(LLAMA_70B).encode()
    cached_snapshot(cache, "acme/sized-only", {"config.json": config})
    index = {"weight_map": {"a.weight": "model-1.safetensors", "b.weight": "model-2.safetensors"}}
    shards = {"config.json": config, "model.safetensors.index.json": json.dumps(index).encode()}
    cached_snapshot(cache, "acme/half", shards | {"model-1.safetensors": b"w"})
    whole = cached_snapshot(cache, "acme/whole", shards | {"model-1.safetensors": b"w"})
    (whole / "model-2.safetensors").write_bytes(b"w")

    def check(repo: str) -> str | None:
        return fetch.check(fetch.Needed("hub", "judge", repo))

    assert check("acme/sized-only") == (
        f"judge: acme/sized-only in the Hugging Face cache ({tmp_path}) holds no weights "
        "(a config alone): groundcover cluster prefetch"
    )
    assert check("acme/half") == (
        f"judge: acme/half in the Hugging Face cache ({tmp_path}) lacks model-2.safetensors of "
        "the weights model.safetensors.index.json names"
    )
    assert check("acme/whole") is None
    absent = f"judge: acme/absent is not in the Hugging Face cache ({tmp_path})"
    assert check("acme/absent") == absent


def test_a_replica_keeps_room_for_vllms_runtime_in_its_budget():
    """Llama-3.3-70B at its preset's 32,768 tokens: weights 70,552,387,584 parameters x 2 bytes
    = 131.4 GiB, KV cache 80 layers x 8 heads x 128 x 2 (K, V) x 2 bytes x 32,768 = 10.0 GiB:
    141.4 GiB, 70.7 a GPU at TP 2 against 80 x 0.9 - 5 = 67 GiB: TP 4 (35.4 <= 67)."""
    size = size_of(LLAMA_70B, "Llama-3.3-70B-Instruct", 32768)
    assert size.parameters == 70_552_387_584
    assert size.needed / GIB == pytest.approx(141.42, abs=0.01)
    assert runtime_reserve(1) == 3.5 * GIB and runtime_reserve(2) == 5 * GIB
    assert not size.fits(2, 80 * GIB, 0.9)  # 70.7 GiB of weights and cache alone: 98% of 72
    assert size.smallest_parallelism(80 * GIB, 0.9, 8) == 4


def test_the_plans_hold_with_vllms_runtime_reserved(tmp_path, monkeypatch):
    """2 x 4 gpt-oss-120b stays 8 x TP 1 (65.2 + 3.5 <= 72 GiB); 3 x 3 a 70B preset is refused
    (TP 2 does not hold it, TP 3 does not divide 64 heads); n1:8,n2:4 holds 2 + 1 of TP 4;
    1 x 8 Qwen2.5-72B 2 x TP 4 (145.4 GiB: 72.7 a GPU at TP 2)."""
    plan = planner(tmp_path, monkeypatch)

    def planned(allocation: str, judge: str) -> dict:
        job = ["--allocation", allocation, "--gpu-memory", "80", "--judge", judge]
        done = plan("--json", *job, "--", *FANOUTQA)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    oss = planned("2x4", "gpt-oss-120b")
    assert (oss["replicas"], oss["tensor_parallel"]) == (8, 1)
    uneven = planned("n1:8,n2:4", "Llama-3.3-70B-Instruct")
    assert uneven["tensor_parallel"] == 4 and uneven["replicas_per_node"] == {"n1": 2, "n2": 1}
    qwen = planned("1x8", "Qwen2.5-72B-Instruct")
    assert (qwen["replicas"], qwen["tensor_parallel"]) == (2, 4)
    big = ["--allocation", "3x3", "--gpu-memory", "80", "--judge", "Llama-3.3-70B-Instruct"]
    refused = plan(*big, "--", *FANOUTQA)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert "Llama-3.3-70B-Instruct fits no node" in refused.stderr


def test_a_dataset_the_catalogue_lacks_is_refused_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli.main import app

    planner(tmp_path, monkeypatch)  # its homes and offline cache
    runner = CliRunner()
    for step in ("plan", "prefetch", "check-offline"):
        job = ["cluster", step, "--dataset", "nosuch", "--", *FANOUTQA]
        done = runner.invoke(app, job)
        assert done.exit_code == 2, (step, done.stderr)
        assert done.stderr.startswith(f"error: cluster {step}: unknown dataset 'nosuch'; known: ")
        assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_a_quantised_checkpoint_is_sized_by_the_bits_its_config_names():
    """Llama-3.3-70B's 70,552,387,584 parameters, of which 2,101,346,304 are the embeddings
    (128,256 x 8,192 x 2, kept at bf16): bitsandbytes ``load_in_8bit`` is 8 bits a weight (it
    was sized as 4: half its real size), compressed-tensors W4A16 is 4 bits with a scale per
    group of 128 (x 1.03; it was sized as 8), its FP8 one byte."""
    embeddings, rest = 2_101_346_304, 70_552_387_584 - 2_101_346_304

    def weights(quant: dict) -> float:
        config = LLAMA_70B | {"quantization_config": quant}
        return size_of(config, "q", 4096).weight_bytes

    expected = {8: embeddings * 2 + rest * 1.03, 4: embeddings * 2 + rest * 0.5 * 1.03}
    bnb8 = {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False}
    bnb4 = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    assert weights(bnb8) == pytest.approx(expected[8], rel=1e-9)
    assert weights(bnb4) == pytest.approx(expected[4], rel=1e-9)
    w4a16 = {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}}
    fp8 = {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}
    compressed = {"quant_method": "compressed-tensors"}
    assert weights(compressed | {"config_groups": w4a16}) == pytest.approx(expected[4], rel=1e-9)
    fp8_bytes = embeddings * 2 + rest * 1.0  # a scale per channel: nothing to count
    assert weights(compressed | {"config_groups": fp8}) == pytest.approx(fp8_bytes, rel=1e-9)
    # NVIDIA's modelopt: NVFP4 is 4.5 bits (an FP8 scale per 16 weights; it was sized as
    # bf16, four times its size, and refused as fitting no node), FP8 one byte
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    assert weights(nvfp4) == pytest.approx(embeddings * 2 + rest * 4.5 / 8, rel=1e-9)
    assert weights(nvfp4 | {"quant_algo": "FP8"}) == pytest.approx(fp8_bytes, rel=1e-9)


def test_a_gpt_oss_judge_in_a_folder_of_any_name_needs_its_tokenizer_files(tmp_path):
    """vLLM speaks harmony (and reads o200k_base / cl100k_base offline) for a config whose
    model_type is gpt_oss, whatever its folder is called; prefetch and check-offline looked
    for "gpt-oss" in the name, so /shared/models/oss-judge went without them."""
    from tests.test_cluster_plan import GPT_OSS_120B

    folder = tmp_path / "oss-judge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT_OSS_120B | {"model_type": "gpt_oss"}))
    needs = fetch.model_needs("judge", str(folder))
    assert [(n.kind, n.what) for n in needs] == [
        ("directory", str(folder)),
        ("tiktoken", "o200k_base.tiktoken"),
        ("tiktoken", "cl100k_base.tiktoken"),
    ]
    llama = tmp_path / "judge"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(LLAMA_70B | {"model_type": "llama"}))
    assert [n.kind for n in fetch.model_needs("judge", str(llama))] == ["directory"]


def test_a_flag_the_job_adds_given_in_the_command_too_is_refused(tmp_path, monkeypatch):
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--"]
    elsewhere = ["--endpoint", "http://10.0.0.9:8000/v1", "--model", "other"]
    done = plan(*job, *FANOUTQA, *elsewhere)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` is given --endpoint, which the job adds (its own "
        "would win): drop it from the command, or drop --judge (and its --lora)"
    ]
    as_one = plan(*job, *FANOUTQA, "--model=other")
    assert as_one.returncode == 2 and "is given --model, which the job adds" in as_one.stderr
    assert plan(*job, *FANOUTQA).returncode == 0


def test_the_commands_own_ray_and_drivers_are_refused_not_replaced(tmp_path, monkeypatch):
    """The job sets ``--ray-address`` (its own Ray) and ``--drivers`` (per node, times
    ``--drivers-per-node``) where the command takes them: a command giving its own had them
    replaced without a word (``--drivers 4`` ran with the plan's 2)."""
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--"]
    done = plan(*job, *FANOUTQA, "--drivers", "4")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` is given --drivers, which the job sets (one per "
        "node times --drivers-per-node: set that option of the job instead): drop it from the "
        "command"
    ]
    address = plan(*job, *FANOUTQA, "--ray-address=10.0.0.9:6379")
    assert address.returncode == 2 and address.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` is given --ray-address, which the job sets (the "
        "head of the Ray it starts on the job's nodes): drop it from the command"
    ]
    per_node = plan("--json", "--drivers-per-node", "2", *job, *FANOUTQA)
    assert per_node.returncode == 0, per_node.stderr
    assert json.loads(per_node.stdout)["drivers"] == 4


def test_what_the_commands_config_sets_of_the_jobs_flags_is_refused_not_replaced(
    tmp_path, monkeypatch
):
    """A flag wins over the command's config, so a config setting what the job's flags set
    (its judge's URL, model, key and revision; its Ray and drivers) had its value replaced
    without a word: now refused in one line naming the file and the key."""
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--"]
    for key, section in [
        ("endpoint: http://myhost:8000/v1", "evaluator.endpoint"),
        ("api_key_env: MY_KEY", "evaluator.api_key_env"),
        ("ray_address: 10.0.0.5:6379", "evaluator.ray_address"),
    ]:
        config = tmp_path / f"{section}.yaml"
        config.write_text(f"evaluator:\n  {key}\n")
        done = plan(*job, *FANOUTQA, "--config", str(config))
        flag = "--" + section.split(".")[1].replace("_", "-")
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.splitlines() == [
            f"error: cluster plan: `eval fanoutqa`'s config {config} sets {section}, which the "
            f"job sets with {flag} (its flag would replace it): remove it from the config"
        ]
    drivers = tmp_path / "drivers.yaml"
    drivers.write_text("run:\n  drivers: 5\n")
    done = plan(*job, *FANOUTQA, f"--config={drivers}")
    assert done.returncode == 2 and "sets run.drivers, which the job sets with --drivers" in (
        done.stderr
    )
    kept = tmp_path / "kept.yaml"  # what the job does not set stays the command's
    kept.write_text("run:\n  driver_resources: {CPU: 0}\nevaluator:\n  concurrency: 7\n")
    assert plan(*job, *FANOUTQA, "--config", str(kept)).returncode == 0


def test_a_role_with_its_own_endpoint_beside_the_jobs_judge_is_refused(tmp_path, monkeypatch):
    """With --judge the job hands the command its judge's key (--api-key-env): a role sent to
    a URL of its own would carry that key to another host while the judge's GPUs idle."""
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--"]
    outside = ["--role", "judge=foo@http://10.9.9.9:1/v1"]
    done = plan(*job, *FANOUTQA, *outside)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` sends role judge to http://10.9.9.9:1/v1 of its "
        "own: the job would send it the key of the judge it serves (--api-key-env) while that "
        "judge went unused; drop the role's URL, or drop --judge"
    ]
    # without --judge the command's own endpoints are its own (and no key of the job's goes)
    without_judge = ["--allocation", "2x4", "--gpu-memory", "80", "--"]
    answers = ["--endpoint", "http://10.9.9.8:1/v1", "--model", "m"]
    assert plan(*without_judge, *FANOUTQA, *answers, *outside).returncode == 0


def test_the_plan_checks_the_command_with_the_jobs_number_of_drivers(tmp_path, monkeypatch):
    """The check stood the command's --drivers in as 1, so a command refusing the job's real
    count (here a list of placements for 2 drivers where the job runs 4) passed the plan and
    failed in the job, after the judge had loaded."""
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b"]
    two = ["--driver-resources", json.dumps([{"CPU": 0}, {"CPU": 0}])]
    assert plan(*job, "--", *FANOUTQA, *two).returncode == 0  # 2 nodes, 1 driver each
    four = plan(*job, "--drivers-per-node", "2", "--", *FANOUTQA, *two)
    assert four.returncode == 2 and four.stdout == ""
    assert len(four.stderr.splitlines()) == 1 and "--drivers 4" in four.stderr, four.stderr


def test_only_groundcover_and_no_help_is_a_jobs_command(tmp_path, monkeypatch):
    plan = planner(tmp_path, monkeypatch)
    job = ["--allocation", "2x4", "--gpu-memory", "80", "--judge", "gpt-oss-120b", "--"]
    other = plan(*job, "python", "-m", "groundcoverx", *FANOUTQA[1:])
    assert other.returncode == 2 and "must be a groundcover command" in other.stderr
    assert plan(*job, "python", "-m", "groundcover.pipelines.cli", *FANOUTQA[1:]).returncode == 0
    helped = plan(*job, *FANOUTQA, "--help")
    assert helped.returncode == 2 and helped.stdout == ""
    assert helped.stderr.splitlines() == [
        "error: cluster plan: `eval fanoutqa` is given --help: the job would print its help and end"
    ]
