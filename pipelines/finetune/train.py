"""LoRA / QLoRA fine-tuning of a claim extractor with trl's SFTTrainer and peft.

Data: JSONL chat examples {"messages": [..., {"role": "assistant", "content": ...}]}, as written by
``finetune claims data``. Each becomes a prompt-completion pair (every message but the last, and
the last), so the loss covers the assistant's part only, under the base model's chat template.
Defaults are the ICAT paper's: r = 64, alpha = 16, lr 2e-4, effective batch 16 (micro-batches and
gradient accumulation), one epoch. Checkpoints go to ``<out>/checkpoints``; a rerun of the same
command continues from the last one. The output is a standard adapter directory plus ``card.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from groundcover import UserError
from groundcover.inputs import Strict, iter_jsonl
from groundcover.serving.files import write_atomic

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainOptions(Strict):
    data: Path
    base: str = Field(description="preset, model directory or hub id")
    out: Path
    rank: int = Field(64, ge=1, le=512)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    learning_rate: float = Field(2e-4, gt=0)
    batch_size: int = Field(16, ge=1, description="effective batch (micro x accumulation)")
    micro_batch: int = Field(4, ge=1)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="overrides epochs")
    max_length: int = Field(2048, ge=16)
    qlora: bool = Field(False, description="4-bit base weights (needs a CUDA GPU)")
    full: bool = Field(False, description="train every weight, no adapter (bench comparison)")
    save_steps: int = Field(50, ge=1)
    seed: int = 0
    device: str | None = Field(None, description="cpu | cuda (default: cuda if available)")

    @model_validator(mode="after")
    def _batch(self) -> TrainOptions:
        if self.batch_size % min(self.micro_batch, self.batch_size):
            raise ValueError("batch_size must be a multiple of micro_batch")
        return self

    @property
    def accumulation(self) -> int:
        micro = min(self.micro_batch, self.batch_size)
        return self.batch_size // micro


def read_examples(path: Path) -> list[dict[str, Any]]:
    """Prompt-completion pairs from chat examples; a bad line stops with one clear line."""
    examples = []
    for lineno, row in iter_jsonl(path):
        messages = row.get("messages")
        if not isinstance(messages, list) or len(messages) < 2:
            raise UserError(f"{path}:{lineno}: field messages: needs a list of 2+ messages")
        for n, message in enumerate(messages):
            if (
                not isinstance(message, dict)
                or message.get("role") not in {"system", "user", "assistant"}
                or not isinstance(message.get("content"), str)
            ):
                raise UserError(f"{path}:{lineno}: field messages[{n}]: needs role and content")
        if messages[-1]["role"] != "assistant" or not messages[-1]["content"].strip():
            raise UserError(f"{path}:{lineno}: field messages: must end with an assistant answer")
        examples.append({"prompt": messages[:-1], "completion": messages[-1:]})
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


CHECKPOINT_FILES = ("trainer_state.json", "adapter_model.safetensors", "optimizer.pt")


def last_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint: one cut short by a kill lacks some of its files."""
    found = [
        p
        for p in directory.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and all((p / f).is_file() for f in CHECKPOINT_FILES)
    ]
    return max(found, key=lambda p: int(p.name.split("-")[-1]), default=None)


def train_device(options: TrainOptions) -> str:
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if options.qlora and options.full:
        raise UserError("--qlora trains an adapter; it cannot be combined with full training")
    if options.qlora and device != "cuda":
        raise UserError("--qlora needs a CUDA GPU (4-bit weights); use plain LoRA on CPU")
    return device


def load_base(options: TrainOptions, device: str) -> tuple[Any, Any, str]:
    """(model, tokenizer, source) of the base: bf16 on CUDA, float32 on CPU, 4-bit with QLoRA."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ...serving.launch.registry import model_source, resolve

    source = str(model_source(resolve(options.base)))
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.chat_template is None:
        raise UserError(f"base model {options.base!r} has no chat template")
    load: dict[str, Any] = {"dtype": torch.bfloat16 if device == "cuda" else torch.float32}
    if options.qlora:
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    return AutoModelForCausalLM.from_pretrained(source, **load), tokenizer, source


def make_trainer(
    options: TrainOptions,
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    device: str,
    progress: bool = True,
) -> Any:
    """The SFTTrainer of ``train``: the project's LoRA config over a loaded base, on ``device``
    (``scripts/gpu_check.py`` runs it on a GPU-sized model built in memory)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    lora = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=[m for m in TARGET_MODULES if m in present],
        task_type="CAUSAL_LM",
    )
    config = SFTConfig(
        output_dir=str(options.out / "checkpoints"),
        per_device_train_batch_size=min(options.micro_batch, options.batch_size),
        gradient_accumulation_steps=options.accumulation,
        learning_rate=options.learning_rate,
        num_train_epochs=options.epochs,
        max_steps=options.max_steps or -1,
        max_length=options.max_length,
        logging_steps=1,
        save_steps=options.save_steps,
        save_total_limit=2,
        report_to=[],
        seed=options.seed,
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        disable_tqdm=not progress,
        completion_only_loss=True,
        lr_scheduler_type="linear",
    )
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
        peft_config=None if options.full else lora,
    )


def train(options: TrainOptions, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and write the adapter and its card; returns the card."""
    examples = read_examples(options.data)
    device = train_device(options)
    model, tokenizer, source = load_base(options, device)
    trainer = make_trainer(options, model, tokenizer, examples, device, progress)
    checkpoints = options.out / "checkpoints"
    resume = last_checkpoint(checkpoints)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    trainer.save_model(str(options.out))
    tokenizer.save_pretrained(str(options.out))
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    card = {
        "base": options.base,
        "base_source": str(source),
        "data": str(options.data),
        "data_sha256": sha256(options.data),
        "examples": len(examples),
        "hyperparameters": options.model_dump(mode="json", exclude={"data", "out", "base"}),
        "steps": trainer.state.global_step,
        "resumed_from": str(resume) if resume else None,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "losses": losses,
        "device": device,
        "seconds": round(trainer.state.log_history[-1].get("train_runtime", 0.0), 3),
        "tokens": next(
            (
                int(float(e["num_tokens"]))
                for e in reversed(trainer.state.log_history)
                if "num_tokens" in e
            ),
            None,
        ),
        "versions": {p: version(p) for p in ("trl", "peft", "transformers", "torch")},
    }
    final = card["final_loss"]
    if final is not None and not math.isfinite(float(final)):
        raise UserError(f"training diverged (final loss {card['final_loss']}): lower the rate")
    write_atomic(options.out / "card.json", json.dumps(card, indent=1), within=options.out)
    return card
