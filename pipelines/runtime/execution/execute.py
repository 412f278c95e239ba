"""The one runtime every framework runs on, read top-down: ``plan`` (``plan.py``: inputs
checked, runs listed, models chosen and asked for, nothing written), then either the dry run's
estimates (``planning.py``) or the runs (``running.py``: each run's directory opened under its
identity, its missing items solved through a bounded queue or by driver actors, its summary and
tables written and printed), then the study's own table.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator

from ....serving.client import EvalClient
from ..budget.dry_run import print_dry_run
from ..contract.errors import ItemsFailed
from ..contract.protocol import RunOutcome, RunRequest, Study
from ..store.summary import failed_line
from .plan import plan_study
from .solve import OpenClient
from .study import run_study


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so servers we started are stopped on the way out."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# ---- a study, top-down: plan, then estimate (--dry-run) or run ----------------------------------


def execute(
    study: Study,
    request: RunRequest,
    *,
    no_cache: bool = False,
    quiet: bool = False,
    open_client: OpenClient | None = None,
    dry_run: bool = False,
    pilot: int | None = None,
) -> dict[str, RunOutcome]:
    """Run (or resume) every run of ``study``; print and write its tables; return the outcomes.

    ``open_client(evaluator, run_dir)`` opens the client of an evaluator (default: connect to
    the endpoint or start vLLM; tests pass a scripted client here). ``dry_run``: check the
    inputs and print what each run would still ask, starting and writing nothing. ``pilot``:
    solve that many missing items of each run for real (recorded: the full run resumes from
    them), then print the estimate of the rest.
    """
    # 1. plan: inputs checked, runs listed, models chosen and asked for; nothing written yet
    planned = plan_study(
        study, request, probe=open_client is None, dry_run=dry_run, no_cache=no_cache
    )
    if dry_run:  # 2a. what each run would still ask; the outcomes hold only those estimates
        return {
            str(run_dir): RunOutcome(run_dir, [], None, None, estimate=estimate)
            for run_dir, estimate in print_dry_run(planned)
        }
    sigterm_as_interrupt()
    # 2b. each run opened under its identity, solved, summarised; then the study's own table
    return run_study(planned, open_client, quiet=quiet, pilot=pilot)


def raise_for_failures(outcomes: dict[str, RunOutcome], request: RunRequest, command: str) -> None:
    """``ItemsFailed`` when the runs ended with more failed items (``error``,
    ``cut_in_reasoning``) than ``--allow-failures`` accepts: a command's exit code must tell a
    run with failed items from a clean one. ``command`` retries just those (recorded items are
    skipped)."""
    failed = [
        (o.dir, o.summary.failed) for o in outcomes.values() if o.summary and o.summary.failed
    ]
    count = sum(f["count"] for _, f in failed)
    items = sum(o.summary.items for o in outcomes.values() if o.summary)
    allowed = request.run.failures_allowed(items)
    if count <= allowed:
        return
    lines = "; ".join(failed_line(f, str(where)) for where, f in failed)
    accepted = f" (--allow-failures accepts {allowed})" if allowed else ""
    raise ItemsFailed(f"{count} of {items} items failed{accepted}: {lines}. Retry: {command}")


@contextlib.asynccontextmanager
async def fixed_client(client: EvalClient) -> AsyncIterator[EvalClient]:
    """An already-open client as an ``open_client`` result (it stays open afterwards)."""
    yield client
