"""The GPU paths on a real CUDA device (marked ``gpu``: skipped with the reason where torch sees
none), and ``scripts/gpu_check.py``'s own logic on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402

SENTENCES = [
    "The river city has a tower that is old and tall.",
    "Water and energy come from the river north of the city.",
    "The family history of the city starts with a tower.",
    "Science and music are taught in the city near the water.",
    "The population of the country was ten million in that year.",
    "The temperature in Paris reached forty degrees celsius.",
    "London is a city on a river with many bridges.",
    "Berlin has a report on energy from the study of water.",
]


def pairs(n: int) -> list[tuple[str, str]]:
    return [(SENTENCES[i % 8], SENTENCES[(3 * i + 1) % 8] + f" {i}") for i in range(n)]


@pytest.fixture(scope="module")
def wide_nli(tmp_path_factory) -> str:
    """The tiny DeBERTa with gpu_check's wide init and calibrated head: labels differ by pair."""
    from tests.support.tiny import build_tiny_classifier

    path = build_tiny_classifier(
        tmp_path_factory.mktemp("gpu") / "nli", shape={"initializer_range": gpu_check.INIT_RANGE}
    )
    gpu_check.calibrate_head(path, pairs(24))
    return str(path)


# ---- on a GPU -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nli_scorer_on_cuda_gives_the_cpu_probabilities(wide_nli, dtype):
    from groundcover.retrieval.nli import NliScorer

    sample = pairs(96)
    cpu = NliScorer(wide_nli).probabilities(sample)
    gpu = NliScorer(wide_nli, device="cuda", dtype=None if dtype == "float32" else dtype)
    found = gpu_check.compare_probabilities(
        cpu, gpu.probabilities(sample), gpu_check.TOLERANCES[dtype]
    )
    assert found["ok"], found
    # labels were compared on many pairs (fewer are decisive at a half type's wider tolerance)
    assert found["decisive"] > (48 if dtype == "float32" else 16)
    assert gpu.model.device.type == "cuda" and gpu.model.dtype == getattr(
        __import__("torch"), dtype
    )


@pytest.mark.gpu
def test_index_encoder_on_cuda_gives_the_cpu_vectors(tmp_path):
    from groundcover.index_build.build import embed_texts, load_encoder
    from tests.support.tiny import build_tiny_encoder

    path = str(build_tiny_encoder(tmp_path / "enc"))
    texts = [" ".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(8)] * 8
    cpu = embed_texts(load_encoder(path, "cpu"), texts, 16)
    gpu = embed_texts(load_encoder(path, "cuda"), texts, 16)
    assert gpu.dtype == np.float32 and gpu.shape == cpu.shape
    assert np.abs(gpu - cpu).max() <= gpu_check.TOLERANCES["float32"]


def write_examples(path: Path) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": SENTENCES[i]},
                {"role": "assistant", "content": SENTENCES[(i + 1) % 8]},
            ]
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.gpu
@pytest.mark.parametrize("qlora", [False, True], ids=["lora", "qlora"])
def test_claims_training_on_cuda(tiny_model, tmp_path, qlora):
    """`finetune claims train` on the GPU: bf16 (or 4-bit) base, the adapter written, and the
    first loss (before any update) the CPU's within bf16 rounding."""
    if qlora:
        pytest.importorskip("bitsandbytes", reason="QLoRA needs bitsandbytes")
    from groundcover.pipelines.finetune.train import TrainOptions, train

    data = write_examples(tmp_path / "train.jsonl")
    cards = {}
    for device in ("cpu", "cuda"):
        options = TrainOptions(
            data=data,
            base=str(tiny_model),
            out=tmp_path / device,
            device=device,
            max_steps=2,
            batch_size=4,
            micro_batch=4,
            qlora=qlora and device == "cuda",
        )
        cards[device] = train(options, progress=False)
    assert cards["cuda"]["device"] == "cuda"
    assert (tmp_path / "cuda" / "adapter_model.safetensors").is_file()
    assert all(np.isfinite(cards["cuda"]["losses"]))
    first_cpu, first_gpu = cards["cpu"]["first_loss"], cards["cuda"]["first_loss"]
    limit = 0.05 if qlora else gpu_check.TOLERANCES["bfloat16"]  # 4-bit weights round further
    assert abs(first_gpu - first_cpu) / first_cpu <= limit


# ---- the check's own logic, on the CPU ----------------------------------------------------------


def test_compare_probabilities_counts_only_decisive_labels():
    reference = np.array([[0.90, 0.05, 0.05], [0.40, 0.39, 0.21], [0.10, 0.80, 0.10]])
    close_call_flips = np.array([[0.90, 0.05, 0.05], [0.39, 0.40, 0.21], [0.10, 0.80, 0.10]])
    found = gpu_check.compare_probabilities(reference, close_call_flips, tolerance=0.02)
    # row 2's margin 0.01 is under 2 x 0.02: its flip is rounding, not disagreement
    assert found == {
        "max_abs": pytest.approx(0.01),
        "decisive": 2,
        "agree": 2,
        "all_agree": 2,
        "ok": True,
    }
    decisive_flip = reference[[0, 1, 0]]
    found = gpu_check.compare_probabilities(reference, decisive_flip, tolerance=1.0)
    assert found["decisive"] == 0 and found["ok"]  # nothing is decisive at tolerance 1
    found = gpu_check.compare_probabilities(reference, decisive_flip, tolerance=0.01)
    assert not found["ok"] and found["agree"] == 1  # row 3 flips though the CPU was sure


def test_calibrated_head_gives_every_label(wide_nli):
    from groundcover.retrieval.nli import NliScorer

    labels = NliScorer(wide_nli).probabilities(pairs(48)).argmax(1)
    assert set(labels.tolist()) == {0, 1, 2}


def test_gpu_check_runs_its_gpu_side_on_the_cpu(tmp_path):
    """--self-check runs every section's device code with the CPU as the device: one row per
    measurement, all agreeing, JSON written, exit 0."""
    out = tmp_path / "check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/gpu_check.py"),
            "--self-check",
            "--out",
            str(out),
            "--nli-batches",
            "32",
            "--lora-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["ok"] and not found["errors"]
    sections = {(r["section"], r["dtype"]) for r in found["rows"]}
    assert {
        ("nli", "float32"),
        ("nli", "float16"),
        ("nli", "bfloat16"),
        ("embed", "float32"),
        ("embed", "float16"),
        ("lora", "float32"),
    } <= sections
    assert "| nli | tiny, sentence pairs | cpu | float16 |" in done.stdout


def test_gpu_check_refuses_cuda_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/gpu_check.py"),
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "x.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: --device cuda")
    assert not (tmp_path / "x.json").exists()
