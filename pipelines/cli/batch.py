"""``groundcover batch``: a run's batch jobs as its ledgers record them (``status``), and the way
out of one that cannot end (``forget``, ``--rebuy``): stuck at the provider, its output gone,
lost by the provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from ..runtime.terminal import terminal
from .frameworks import lazy_group
from .options import clean_errors

batch_app = typer.Typer(
    cls=lazy_group("batch"),
    help="A run's batch jobs: where each stands, and forgetting one that cannot end.",
    no_args_is_help=True,
)
RunDir = Annotated[Path, typer.Argument(help="the run directory (its batches/ folder)")]


def _bought(run_dir: Path) -> dict[str, Any]:
    from ...serving.batch import read_ledgers  # aiohttp: not for --help
    from ..runtime.contract.errors import UserError

    found = read_ledgers(run_dir)
    if found is None:
        raise UserError(f"{run_dir}: no batch ledgers (batches/*/ledger.jsonl)")
    return found


@batch_app.command("status")
@clean_errors
def batch_status(
    run_dir: RunDir,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Each batch of the run: its client folder, round, lines, status, failed lines, wait and
    what the ledger notes about it (an incomplete output, a cancel, an adoption)."""
    bought = _bought(run_dir)
    if as_json:
        print(json.dumps(bought))
        return
    every = [b for batches in bought["clients"].values() for b in batches] or [{"batch": ""}]
    # a batch id is never wrapped: it is copied whole into `batch forget`
    batch = Column("batch", no_wrap=True, min_width=max(len(b["batch"]) for b in every))
    table = Table("client", batch, "round", "lines", "status", "failed", "wait s", "note")
    for client, batches in bought["clients"].items():
        for b in batches:
            waited = "-" if b["waited_s"] is None else f"{b['waited_s']:.0f}"
            table.add_row(
                client,
                b["batch"],
                str(b["round"]),
                str(b["lines"]),
                b["status"],
                str(b["failed"]),
                waited,
                b.get("note") or "",
            )
    out = terminal()
    out.print(table)
    causes = ", ".join(f"{k} {v}" for k, v in bought["causes"].items()) or "none"
    out.print(
        f"{bought['batches']} batches, {bought['lines']:,} lines, {bought['pending']} pending; "
        f"unanswered lines by cause: {causes}",
        highlight=False,
    )
    if bought.get("unfound"):
        out.print(
            f"{bought['unfound']} create(s) whose answer was lost were not found in the "
            "provider's listing by the end of their run: each later run that opens the "
            "batches looks for them again",
            highlight=False,
        )


@batch_app.command("forget")
@clean_errors
def batch_forget(
    run_dir: RunDir,
    batch: Annotated[str, typer.Argument(help="the batch id (groundcover batch status)")],
    rebuy: Annotated[
        bool,
        typer.Option(
            "--rebuy",
            help="also set its answers aside and buy every line of it again (a line lost twice "
            "included)",
        ),
    ] = False,
) -> None:
    """Stop waiting for a batch: the next run buys its unanswered lines again (with --rebuy,
    all of its lines). Refused while a run is writing the directory."""
    from ...serving.batch import BatchError, forget_batch
    from ..runtime.contract.errors import UserError
    from ..runtime.store.run_dir import LOCK, stale

    _bought(run_dir)
    holder = _holder(run_dir / LOCK)
    if holder is not None and stale(holder) is None:
        raise UserError(
            f"{run_dir}: a run is writing it (pid {holder.get('pid')} on {holder.get('host')}); "
            "stop it first"
        )
    try:
        ledger = forget_batch(run_dir, batch, rebuy)
    except BatchError as exc:
        raise UserError(str(exc)) from None
    what = "every line of it is bought again" if rebuy else "its unanswered lines are bought"
    terminal().print(f"{batch}: forgotten in {ledger}; on the next run {what}", highlight=False)


def _holder(lock: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
