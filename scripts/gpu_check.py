"""The GPU paths checked against the CPU: NLI scorer, index encoder, LoRA training step.

Runs on any machine with PyTorch (CPU or CUDA) and no network. On CUDA each GPU result is
compared with the CPU float32 result of the same project code on the same inputs, and the run
exits 1 when one disagrees beyond its tolerance (``TOLERANCES``) or a section fails; on a CPU-only
machine it measures the CPU side alone (the table to set beside a GPU's).

The models are random, seeded and built here in the shapes that set the speed: DeBERTa-v3-large
for NLI (24 layers, width 1,024, relative attention; plus the tests' tiny DeBERTa), MiniLM-L6 for
the index encoder, Llama-3.1-8B for LoRA / QLoRA. Text is real sentences (those
``benchmarks/bench_scale.py`` uses, or ``--sentences``), tokenised by the shipped MiniLM's WordPiece
vocabulary (``--vocab``), so pairs and chunks have real token counts. A random NLI head is
re-drawn wider so labels differ between pairs; labels are compared only where the CPU's top two
probabilities are further apart than twice the tolerance (``decisive``).

    python scripts/gpu_check.py --out gpu_check.json   # every section this machine can run
    python scripts/gpu_check.py --quick                 # tiny shapes, small counts (CPU test)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# Largest |GPU - CPU float32| accepted per dtype: class probabilities for NLI, components of unit
# vectors for embeddings, relative first-step loss for training. float32 differs only by summation
# order; a half type by its rounding through every layer: 32 units in the last place at 1.0.
TOLERANCES = {"float32": 1e-4, "float16": 32 * 2.0**-10, "bfloat16": 32 * 2.0**-7}
# Random weights drawn wider than the usual 0.02, so the features of different pairs differ as a
# trained model's do (at 0.02 a deep random encoder gives nearly one feature vector for every input,
# and any head that tells pairs apart magnifies rounding noise instead).
INIT_RANGE = 0.1

DEBERTA_V3_LARGE = {
    "vocab_size": 128100,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": ["p2c", "c2p"],
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "pad_token_id": 0,
}
MINILM_L6 = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "pad_token_id": 0,
}
LLAMA_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}
LLAMA_TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@dataclass
class Row:
    section: str
    model: str
    device: str
    dtype: str
    batch: int | None = None
    n: int = 0
    rate: float | None = None  # pairs/s, chunks/s or tokens/s
    unit: str = ""
    max_abs: float | None = None  # against the CPU float32 result
    labels_agree: str | None = None  # "decisive agreeing / decisive"
    peak_mib: float | None = None  # GPU memory allocated at the peak
    ok: bool = True
    advisory: bool = False  # reported, not a failure: a half type on random weights (see check_nli)
    note: str = ""


@dataclass
class Report:
    environment: dict[str, Any]
    path: Path | None = None  # rewritten at each row, so a run cut short keeps what it measured
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(row.ok or row.advisory for row in self.rows)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(render_row(row), flush=True)
        self.save()

    def save(self) -> None:
        if self.path is not None:
            found = {
                "environment": self.environment,
                "rows": [asdict(r) for r in self.rows],
                "errors": self.errors,
                "ok": self.ok,
            }
            self.path.write_text(json.dumps(found, indent=1))


def environment(device: str) -> dict[str, Any]:
    import torch

    versions = {}
    for name in (
        "torch",
        "transformers",
        "sentence-transformers",
        "peft",
        "trl",
        "accelerate",
        "bitsandbytes",
        "datasets",
    ):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    env: dict[str, Any] = {
        "device": device,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": props.name,
            "gpu_mib": props.total_memory // 2**20,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
    return env


# ---- inputs -------------------------------------------------------------------------------------


def read_sentences(path: Path | None) -> list[str]:
    if path is not None:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))
    from bench_scale import distinct_sentences  # real sentences: ../shared when here, else examples

    return distinct_sentences()


def pairs_from(sentences: list[str], n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(sentences), size=(n, 2))
    return [(sentences[a], sentences[b]) for a, b in picks]


def chunks_from(sentences: list[str], n: int, words: int = 128) -> list[str]:
    """Chunks of about ``words`` words (the index's default chunk size) made of whole sentences,
    cycling through the sentences until there are ``n`` (each one distinct by its position)."""
    out: list[str] = []
    current: list[str] = []
    k = 0
    while len(out) < n:
        current.append(sentences[k % len(sentences)])
        k += 1
        if sum(len(s.split()) for s in current) >= words:
            out.append(" ".join(current))
            current = []
    return out


def vocab_tokenizer(vocab: Path | None):
    """The WordPiece tokenizer of the shipped MiniLM (or ``--vocab``): real token counts."""
    from transformers import AutoTokenizer

    if vocab is None:
        from groundcover.index_build.build import default_model_path

        vocab = Path(default_model_path())
    return AutoTokenizer.from_pretrained(str(vocab))


# ---- measuring ----------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


@contextlib.contextmanager
def peak_memory(device: str) -> Iterator[list[float]]:
    """Yields a list that holds the peak GPU MiB allocated inside the block when it ends."""
    box: list[float] = []
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    yield box
    if device == "cuda":
        box.append(torch.cuda.max_memory_allocated() / 2**20)


def median_seconds(run: Callable[[], Any], device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def free_gpu() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare_probabilities(reference: np.ndarray, other: np.ndarray, tolerance: float) -> dict:
    """Largest difference, and label agreement on the pairs the CPU decides by more than twice the
    tolerance (closer calls may flip at this precision without anything being wrong)."""
    ordered = np.sort(reference, axis=1)
    decisive = (ordered[:, -1] - ordered[:, -2]) > 2 * tolerance
    agree = reference.argmax(1) == other.argmax(1)
    max_abs = float(np.abs(reference - other).max())
    return {
        "max_abs": max_abs,
        "decisive": int(decisive.sum()),
        "agree": int((agree & decisive).sum()),
        "all_agree": int(agree.sum()),
        "ok": max_abs <= tolerance and bool(agree[decisive].all()),
    }


# ---- 1. NLI -------------------------------------------------------------------------------------


def build_nli(kind: str, tmp: Path, vocab: Path | None, pairs: list[tuple[str, str]]) -> Path:
    from tests.support.tiny import build_tiny_classifier

    wide = {"initializer_range": INIT_RANGE}
    if kind == "tiny":
        path = build_tiny_classifier(tmp / "nli-tiny", shape=wide)
    else:
        labels = ("entailment", "neutral", "contradiction")
        path = build_tiny_classifier(
            tmp / "nli-large",
            labels=labels,
            shape=DEBERTA_V3_LARGE | wide,
            tokenizer=vocab_tokenizer(vocab),
        )
    calibrate_head(path, pairs)
    return path


def calibrate_head(path: Path, pairs: list[tuple[str, str]], spread: float = 3.0) -> None:
    """Re-draw the classifier so that over ``pairs`` each logit has mean 0 and deviation
    ``spread``: a random deep encoder gives every pair nearly the same features, and a plain
    random head the same label, which would make label agreement say nothing."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    seen: list[torch.Tensor] = []
    hook = model.classifier.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0]))
    batch = tokenizer(
        [p for p, _ in pairs],
        [h for _, h in pairs],
        padding=True,
        truncation=True,
        max_length=512,
        return_tensors="pt",
    )
    with torch.inference_mode():
        model(**batch)
    hook.remove()
    features = seen[0].double()
    mean = features.mean(0)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(model.config.num_labels, features.shape[1], generator=generator).double()
    logits = (features - mean) @ weight.T
    weight *= (spread / logits.std(0).clamp_min(1e-12))[:, None]
    with torch.no_grad():
        model.classifier.weight.copy_(weight.float())
        model.classifier.bias.copy_(-(mean @ weight.T).float())
    model.save_pretrained(path)


def check_nli(args, report: Report, tmp: Path, sentences: list[str]) -> None:
    """Per model shape and pair kind: CPU float32 probabilities (the reference, and the CPU's
    pairs/s), then on CUDA each dtype's difference from them and pairs/s per batch size.

    A half type's rows gate the exit status only on a trained checkpoint (``--nli-model``):
    random weights, however drawn, leave a deep encoder's features for different pairs close
    together (24 DeBERTa layers at 0.1 still do), so a head that tells them apart magnifies
    rounding; float32 is gated against the CPU's own batch-to-batch difference either way."""
    passages = chunks_from(sentences, 512)
    models = [("given", args.nli_model)] if args.nli_model else [(k, None) for k in args.nli_shapes]
    for kind, given in models:
        model = given or str(build_nli(kind, tmp, args.vocab, pairs_from(sentences, 48, seed=3)))
        for pairs in args.nli_kinds:
            if pairs == "passage" and (kind == "tiny" or args.quick):
                continue  # the tiny model's speed says nothing about long pairs
            check_nli_pairs(args, report, model, kind, pairs, sentences, passages)


def nli_counts(args, kind: str, pairs: str) -> tuple[int, int]:
    """(pairs compared with the CPU, pairs timed): the CPU reference is the slow part."""
    cuda = args.target == "cuda"
    if args.quick:
        return 256, 256
    if kind == "tiny":
        return 2048, args.nli_pairs if cuda else 2048
    if pairs == "sentence":
        return (256, args.nli_pairs // 8) if cuda else (32, 32)
    return (64, args.nli_pairs // 32) if cuda else (8, 8)


def check_nli_pairs(
    args,
    report: Report,
    model: str,
    kind: str,
    pairs: str,
    sentences: list[str],
    passages: list[str],
) -> None:
    from groundcover.retrieval.nli import NliScorer

    target = args.target
    compare_n, speed_n = nli_counts(args, kind, pairs)

    def make(n: int, seed: int) -> list[tuple[str, str]]:
        if pairs == "sentence":
            return pairs_from(sentences, n, seed)
        rng = np.random.default_rng(seed)  # (retrieved passage, claim): ICAT's and CRUX's pairs
        return [
            (passages[a], sentences[b])
            for a, b in zip(
                rng.integers(0, len(passages), n), rng.integers(0, len(sentences), n), strict=True
            )
        ]

    compare = make(compare_n, 1)
    cpu = NliScorer(model, device="cpu")
    cpu.probabilities(compare[:4])
    started = time.perf_counter()
    reference = cpu.probabilities(compare)
    seconds = time.perf_counter() - started
    # the CPU against itself: each pair alone (no padding, other kernels) vs in batches of 32
    cpu.batch_size, floor_n = 1, min(64, compare_n)
    floor = float(np.abs(cpu.probabilities(compare[:floor_n]) - reference[:floor_n]).max())
    lengths = [
        len(ids)
        for ids in cpu.tokenizer(
            [p for p, _ in compare],
            [h for _, h in compare],
            truncation=True,
            max_length=cpu.max_length,
        )["input_ids"]
    ]
    name = f"{kind}, {pairs} pairs"
    report.add(
        Row(
            "nli",
            name,
            "cpu",
            "float32",
            32,
            compare_n,
            compare_n / seconds,
            "pairs/s",
            note=f"{np.mean(lengths):.0f} tokens per pair; "
            f"{len(set(reference.argmax(1)))} labels seen; CPU alone vs batched {floor:.1e}",
        )
    )
    del cpu
    if target is None:
        return
    speed = make(speed_n, 2)
    for dtype in args.nli_dtypes:
        gpu = NliScorer(model, device=target, dtype=None if dtype == "float32" else dtype)
        gpu.probabilities(speed[:64])  # kernels chosen, memory pooled
        tolerance = max(TOLERANCES[dtype], 4 * floor) if dtype == "float32" else TOLERANCES[dtype]
        found = compare_probabilities(reference, gpu.probabilities(compare), tolerance)
        batches = args.nli_batches or (
            (32, 64, 128, 256) if dtype == "float32" and pairs == "sentence" else (32, 256)
        )
        for batch in batches:
            gpu.batch_size = batch
            with peak_memory(target) as peak:
                seconds = median_seconds(lambda g=gpu: g.probabilities(speed), target, args.repeats)
            host = median_seconds(lambda g=gpu: tokenize_only(g, speed), "cpu", 1)
            report.add(
                Row(
                    "nli",
                    name,
                    target,
                    dtype,
                    batch,
                    speed_n,
                    speed_n / seconds,
                    "pairs/s",
                    max_abs=found["max_abs"],
                    labels_agree=f"{found['agree']}/{found['decisive']}",
                    peak_mib=peak[0] if peak else None,
                    ok=found["ok"],
                    advisory=dtype != "float32" and kind != "given",
                    note=f"{1000 * seconds / -(-speed_n // batch):.1f} ms per batch, of which "
                    f"tokenising {100 * host / seconds:.0f}%",
                )
            )
        del gpu
        free_gpu()


def tokenize_only(scorer, pairs: list[tuple[str, str]]) -> None:
    """The scorer's host-side work alone: tokenising the pairs (once) and padding each batch."""
    from groundcover.retrieval.nli import batch_rows, encode

    unique = list(dict.fromkeys(pairs))
    encoded = encode(scorer.tokenizer, unique, scorer.max_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    for rows in batch_rows(len(unique), scorer.batch_size, lengths):
        width = max(lengths[i] for i in rows)
        padded = np.zeros((len(rows), width), dtype=np.int64)
        for k, i in enumerate(rows):
            padded[k, : lengths[i]] = encoded["input_ids"][i]


# ---- 2. embeddings ------------------------------------------------------------------------------


def check_embeddings(args, report: Report, tmp: Path, sentences: list[str]) -> None:
    from groundcover.index_build.build import embed_texts, load_encoder
    from tests.support.tiny import build_tiny_encoder

    target = args.target
    if args.quick:
        path, name = build_tiny_encoder(tmp / "enc-tiny"), "tiny"
    else:
        tokenizer = vocab_tokenizer(args.vocab)
        path, name = build_tiny_encoder(tmp / "enc-minilm", tokenizer, MINILM_L6), "minilm-l6"
    compare_n = 64 if args.quick else (512 if target == "cuda" else 256)
    compare = chunks_from(sentences, compare_n)
    cpu = load_encoder(str(path), "cpu")
    embed_texts(cpu, compare[:8], 64)
    started = time.perf_counter()
    reference = embed_texts(cpu, compare, 64)
    seconds = time.perf_counter() - started
    report.add(
        Row(
            "embed",
            name,
            "cpu",
            "float32",
            64,
            compare_n,
            compare_n / seconds,
            "chunks/s",
            note="chunks of ~128 words",
        )
    )
    del cpu
    if target is None:
        return
    speed_n = 256 if args.quick else args.chunks
    speed = chunks_from(sentences, speed_n)
    for dtype in ("float32", "float16"):
        gpu = load_encoder(str(path), target)
        if dtype == "float16":
            gpu.half()  # what a half-precision build would do; the builder today runs float32
        embed_texts(gpu, speed[:256], 64)
        other = embed_texts(gpu, compare, 64)
        max_abs = float(np.abs(reference - other).max())
        for batch in (64, 256):
            with peak_memory(target) as peak:
                seconds = median_seconds(
                    lambda g=gpu, b=batch: embed_texts(g, speed, b), target, args.repeats
                )
            report.add(
                Row(
                    "embed",
                    name,
                    target,
                    dtype,
                    batch,
                    speed_n,
                    speed_n / seconds,
                    "chunks/s",
                    max_abs=max_abs,
                    peak_mib=peak[0] if peak else None,
                    ok=max_abs <= TOLERANCES[dtype],
                )
            )
        del gpu
        free_gpu()


# ---- 3. LoRA training ---------------------------------------------------------------------------


def training_examples(tokenizer, sentences: list[str], count: int, tokens: int) -> list[dict]:
    """Chat examples of about ``tokens`` tokens under the chat template: a paragraph of real
    sentences to split into claims, the answer a few of them (about a fifth of the tokens)."""
    examples, k = [], 0
    for _ in range(count):
        paragraph: list[str] = []
        while len(tokenizer(" ".join(paragraph))["input_ids"]) < 0.8 * tokens:
            paragraph.append(sentences[k % len(sentences)])
            k += 1
        claims: list[str] = []
        while len(tokenizer("\n".join(claims))["input_ids"]) < 0.2 * tokens:
            claims.append(sentences[k % len(sentences)])
            k += 1
        examples.append(
            {
                "messages": [
                    {"role": "system", "content": "Split the paragraph into atomic claims."},
                    {"role": "user", "content": " ".join(paragraph)},
                    {"role": "assistant", "content": "\n".join(claims)},
                ]
            }
        )
    return examples


def step_clock(device: str):
    """A trainer callback holding the wall time at the end of each optimizer step."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            self.ends.append(time.perf_counter())

    return StepClock()


def train_steps(options, model, tokenizer, examples, device: str) -> dict[str, Any]:
    """The project's trainer (``pipelines.finetune.train.make_trainer``) run for
    ``options.max_steps``: losses, tokens/s over the steps after the first, peak GPU memory."""
    from groundcover.pipelines.finetune.train import make_trainer

    trainer = make_trainer(options, model, tokenizer, examples, device, progress=False)
    clock = step_clock(device)
    trainer.add_callback(clock)
    with peak_memory(device) as peak:
        trainer.train()
    logs = trainer.state.log_history
    losses = [e["loss"] for e in logs if "loss" in e]
    counts = [float(e["num_tokens"]) for e in logs if "num_tokens" in e and "loss" in e]
    rate = None
    if len(clock.ends) >= 2 and len(counts) == len(clock.ends):
        rate = (counts[-1] - counts[0]) / (clock.ends[-1] - clock.ends[0])
    steps = np.diff(clock.ends)
    result = {
        "losses": losses,
        "rate": rate,
        "peak_mib": peak[0] if peak else None,
        "step_s": float(np.median(steps)) if len(steps) else None,
        "tokens_per_step": (counts[-1] - counts[0]) / max(1, len(counts) - 1)
        if len(counts) >= 2
        else None,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
    }
    del trainer
    return result


def train_options(tmp: Path, base: str, device: str, steps: int, **extra):
    from groundcover.pipelines.finetune.train import TrainOptions

    return TrainOptions(
        data=tmp / "unused.jsonl",
        base=base,
        out=tmp / f"out-{Path(base).name}",
        device=device,
        max_steps=steps,
        save_steps=10_000,
        **extra,
    )


def check_training(args, report: Report, tmp: Path, sentences: list[str]) -> None:
    """The tiny Llama through ``load_base`` on the CPU and the GPU (same weights, same first
    batch: the first loss must agree), then the 8B shape's LoRA and QLoRA steps on the GPU."""
    from groundcover.pipelines.finetune.train import load_base
    from tests.support.tiny import build_tiny_llama, build_tiny_tokenizer

    tiny = str(build_tiny_llama(tmp / "llama-tiny"))
    tokenizer = build_tiny_tokenizer()
    seq = 128 if args.quick else args.seq_len
    examples = [
        {"prompt": e["messages"][:-1], "completion": e["messages"][-1:]}
        for e in training_examples(tokenizer, sentences, 16, seq)
    ]
    first: list[float] = []
    for device in ["cpu"] + ([args.target] if args.target else []):
        options = train_options(tmp, tiny, device, 3, batch_size=8, micro_batch=4)
        model, tok, _ = load_base(options, device)
        done = train_steps(options, model, tok, examples, device)
        first.append(done["losses"][0])
        dtype = "bfloat16" if device == "cuda" else "float32"
        gap = abs(first[-1] - first[0]) / abs(first[0])
        report.add(
            Row(
                "lora",
                "llama-tiny",
                device,
                dtype,
                8,
                3,
                done["rate"],
                "tokens/s",
                max_abs=gap,
                peak_mib=done["peak_mib"],
                ok=gap <= TOLERANCES[dtype],
                note=f"first loss {first[-1]:.4f}; {done['step_s']:.2f} s/step",
            )
        )
        del model
        free_gpu()
    if args.target is None:
        return
    for quantised in (False, True):
        if quantised and ("qlora" not in args.sections or args.target != "cuda"):
            continue  # 4-bit weights need CUDA
        if not quantised and "lora" not in args.sections:
            continue
        report.add(train_large(args, tmp, tokenizer, sentences, quantised))
        free_gpu()


def train_large(args, tmp: Path, tokenizer, sentences: list[str], quantised: bool) -> Row:
    """The Llama-3.1-8B shape (random bf16 weights, built on the GPU) through the project's
    trainer; QLoRA loads it from files in 4-bit as ``finetune claims train --qlora`` would. The
    self-check runs the same code on the tiny shape on the CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from groundcover.pipelines.finetune.train import load_base

    device = args.target
    big = device == "cuda" and not args.quick
    name = ("llama-8b" if big else "llama-tiny") + (" 4-bit" if quantised else "")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = LlamaConfig(
        **(LLAMA_8B if big else LLAMA_TINY | {"vocab_size": len(tokenizer)}),
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    examples = [
        {"prompt": e["messages"][:-1], "completion": e["messages"][-1:]}
        for e in training_examples(
            tokenizer, sentences, 64 if big else 16, args.seq_len if big else 128
        )
    ]
    steps = args.lora_steps
    if quantised:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            return Row(
                "qlora",
                name,
                device,
                "nf4",
                16,
                ok=True,
                note=f"skipped: bitsandbytes cannot be imported ({exc})",
            )
        folder = tmp / "llama-large"
        started = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(device):  # the 4-bit load reads the weights from files
            model = LlamaForCausalLM._from_config(config, dtype=dtype)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        del model
        free_gpu()
        print(f"  weights written in {time.perf_counter() - started:.0f} s", flush=True)
        options = train_options(tmp, str(folder), device, steps, qlora=True)
        model, tok, _ = load_base(options, device)
    else:
        options = train_options(tmp, "in-memory", device, steps)
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM._from_config(config, dtype=dtype)
        tok = tokenizer
    done = train_steps(options, model, tok, examples, device)
    del model
    losses = done["losses"]
    return Row(
        "qlora" if quantised else "lora",
        name,
        device,
        "nf4" if quantised else str(dtype)[6:],
        options.batch_size,
        steps,
        done["rate"],
        "tokens/s",
        peak_mib=done["peak_mib"],
        ok=bool(np.isfinite(losses).all()),
        note=f"r={options.rank}, micro-batch {options.micro_batch} x {options.accumulation}, "
        f"{done['tokens_per_step']:.0f} tokens/step, {done['step_s']:.2f} s/step, gradient "
        f"checkpointing {done['gradient_checkpointing']}, losses {losses[0]:.3f}..{losses[-1]:.3f}",
    )


# ---- report -------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if value < 1e-2 else f"{value:.{digits}f}"


def render_row(r: Row) -> str:
    rate = f"{fmt(r.rate)} {r.unit}" if r.rate is not None else "-"
    return (
        f"| {r.section} | {r.model} | {r.device} | {r.dtype} | {r.batch or '-'} | {r.n} "
        f"| {rate} | {fmt(r.max_abs, 2)} | {r.labels_agree or '-'} | {fmt(r.peak_mib)} "
        f"| {'yes' if r.ok else 'no (advisory)' if r.advisory else 'NO'} | {r.note} |"
    )


def render(report: Report) -> str:
    env = report.environment
    head = (
        f"device: {env.get('gpu', 'cpu only')}, {env['cpus']} CPUs, torch "
        f"{env['versions']['torch']}" + (f", CUDA {env['cuda']}" if "cuda" in env else "")
    )
    lines = [
        head,
        "| section | model | device | dtype | batch | n | rate | max abs vs CPU "
        "| labels | peak MiB | ok | note |",
        "|" + " --- |" * 12,
    ]
    lines += [render_row(r) for r in report.rows]
    lines += [f"error: {e}" for e in report.errors]
    return "\n".join(lines)


SECTIONS: dict[str, Callable[..., None]] = {
    "nli": check_nli,
    "embed": check_embeddings,
    "lora": check_training,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["nli", "embed", "lora", "qlora"],
        choices=("nli", "embed", "lora", "qlora"),
    )
    parser.add_argument(
        "--nli-shapes", nargs="+", default=["tiny", "large"], choices=("tiny", "large")
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes and counts only")
    parser.add_argument("--nli-model", help="a trained NLI checkpoint in place of the random ones")
    parser.add_argument(
        "--nli-kinds", nargs="+", default=["sentence", "passage"], choices=("sentence", "passage")
    )
    parser.add_argument(
        "--nli-dtypes",
        nargs="+",
        default=["float32", "bfloat16", "float16"],
        choices=("float32", "bfloat16", "float16"),
    )
    parser.add_argument("--nli-batches", nargs="+", type=int, help="batch sizes timed")
    parser.add_argument("--sentences", type=Path, help="one sentence per line")
    parser.add_argument("--vocab", type=Path, help="a tokenizer folder (default: shipped MiniLM)")
    parser.add_argument(
        "--nli-pairs",
        type=int,
        default=16384,
        help="pairs timed (tiny; large: /8, passage pairs /32)",
    )
    parser.add_argument("--chunks", type=int, default=8192, help="chunks timed on the GPU")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per training example")
    parser.add_argument("--lora-steps", type=int, default=5)
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="run the GPU side's code on the CPU against the CPU (tests this "
        "script where there is no GPU); implies --quick",
    )
    args = parser.parse_args(argv)
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    args.target = "cuda" if args.device == "cuda" else None
    if args.self_check:
        args.target, args.quick = "cpu", True
    args.repeats = 1 if args.quick else 3  # timings: the median of this many
    if args.quick:
        args.nli_shapes = ["tiny"]
    report = Report(environment(args.device), args.out)
    sentences = read_sentences(args.sentences)
    with tempfile.TemporaryDirectory(prefix="gc-gpu-check-") as folder:
        tmp = Path(folder)
        for name in ("nli", "embed", "lora"):
            wanted = name in args.sections or (name == "lora" and "qlora" in args.sections)
            if not wanted:
                continue
            started = time.perf_counter()
            try:
                SECTIONS[name](args, report, tmp, sentences)
            except Exception as exc:  # one broken section must not hide the others' results
                traceback.print_exc()
                report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            report.save()
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
