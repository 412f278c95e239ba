"""`finetune claims train` and `finetune claims register` (no evaluator: plain commands; the
studies `finetune claims data` and `eval` come from ``pipelines.finetune.plugin``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .options import clean_errors


@clean_errors
def finetune_claims_train(
    data: Annotated[Path, typer.Argument(help="train.jsonl (chat examples)")],
    base: Annotated[str, typer.Option(help="base model: preset, directory or hub id")],
    out: Annotated[Path, typer.Option(help="adapter directory to write")],
    rank: Annotated[int, typer.Option(help="LoRA rank")] = 64,
    alpha: Annotated[int, typer.Option(help="LoRA alpha")] = 16,
    learning_rate: Annotated[float, typer.Option(help="peak learning rate")] = 2e-4,
    batch_size: Annotated[int, typer.Option(help="effective batch")] = 16,
    micro_batch: Annotated[int, typer.Option(help="per step (rest: accumulation)")] = 4,
    epochs: Annotated[float, typer.Option()] = 1.0,
    max_steps: Annotated[int | None, typer.Option(help="overrides epochs")] = None,
    qlora: Annotated[bool, typer.Option("--qlora", help="4-bit base (CUDA only)")] = False,
    save_steps: Annotated[int, typer.Option(help="checkpoint every N steps")] = 50,
    register_as: Annotated[str | None, typer.Option(help="register the adapter by name")] = None,
) -> None:
    """LoRA (or QLoRA) fine-tuning of a claim extractor; the ICAT paper's hyper-parameters by
    default. Rerunning the same command resumes from the last checkpoint."""
    from pydantic import ValidationError

    from ..finetune.train import TrainOptions, train

    try:
        options = TrainOptions(
            data=data,
            base=base,
            out=out,
            rank=rank,
            alpha=alpha,
            learning_rate=learning_rate,
            batch_size=batch_size,
            micro_batch=micro_batch,
            epochs=epochs,
            max_steps=max_steps,
            qlora=qlora,
            save_steps=save_steps,
        )
    except ValidationError as exc:
        from ..runtime.contract.readers import describe_validation

        raise UserError(f"training options: {describe_validation(exc)}") from exc
    card = train(options)
    console = terminal()
    console.print(
        f"adapter written to {out}: {card['steps']} steps, loss {card['first_loss']:.4f}"
        f" -> {card['final_loss']:.4f}"
    )
    if register_as:
        finetune_claims_register(register_as, out, replace=True)


@clean_errors
def finetune_claims_register(
    name: Annotated[str, typer.Argument(help="name to serve it under (--lora NAME)")],
    directory: Annotated[Path, typer.Argument(help="adapter directory")],
    replace: Annotated[bool, typer.Option("--replace", help="overwrite a registered one")] = False,
) -> None:
    """Register a trained adapter by name (under GROUNDCOVER_HOME) so that `serve BASE --lora
    NAME` and `--lora NAME` on any eval find it."""
    from ...serving.launch.adapters import AdapterError, register

    try:
        path = register(name, directory, replace=replace)
    except AdapterError as exc:
        raise UserError(str(exc)) from exc
    terminal().print(f"registered {name} at {path}")
