"""Before a run, and after its pilot: what each run would still ask (``--dry-run``, ``--pilot``),
from what its directory holds, the items and the response cache. Nothing here starts a model or
writes a file; the numbers come from ``pipelines.runtime.budget.estimate``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ....serving.cache import ResponseCache, family
from ..contract.protocol import RunPlan, RunRequest
from ..contract.roles import self_judging
from ..execution.identity import (
    earlier_identity,
    judging_identity,
    lead_evaluator,
    role_records,
    run_identity,
)
from ..execution.models import CacheReplay
from ..execution.solve import judging_context, run_cascade
from ..store.lines import item_ids, select
from ..store.provenance import identity_changes
from ..store.run_dir import (
    MANIFEST,
    RunStore,
    fingerprint,
    invocations,
    read_manifest,
)
from ..terminal import terminal
from .estimate import estimate_run, print_estimate, replay_cached

if TYPE_CHECKING:
    from ..execution.plan import StudyPlan


def estimate_from_disk(
    fw, options, run_dir: Path, items, ids, records, prices, derived_total=None, replay=None
):
    """The estimate of one run from what its directory holds (nothing is written); with
    ``replay(missing items)``, the items the response cache answers wholly are exact."""
    reader = RunStore.reading(run_dir)
    pending = reader.pending(ids)
    done = [k for k, i in enumerate(ids) if i not in pending]
    missing = [k for k, i in enumerate(ids) if i in pending]
    n_missing = len(missing)
    if derived_total is not None:  # its items come from an earlier run: about one per item
        n_missing = max(n_missing, derived_total - len(done))
    seconds, solved = invocations(run_dir)
    missing_items = select(items, missing) if items else []
    return estimate_run(
        fw,
        options,
        missing_items,
        n_missing,
        list(reader.results([ids[k] for k in done])),
        select(items, done) if items else None,
        roles=records,
        prices=prices,
        throughput=solved / seconds if seconds and solved else None,
        cached=replay(missing_items) if replay and missing_items else None,
    )


def cache_replay(fw, plan: RunPlan, found, request: RunRequest, root: Path, cache_path, out):
    """``replay(items)`` against the response cache, or None (no cache, or a framework whose
    setup loads models: a dry run starts none)."""
    if cache_path is None or not family(Path(cache_path)) or not found:
        return None
    if not fw.light_setup(plan.options):
        out.print(f"{fw.name}: its setup loads models, so the response cache is not consulted")
        return None

    def replay(items):
        cache = ResponseCache(cache_path)
        try:
            clients = {role: CacheReplay(ev, cache) for role, ev in found.items()}
            lead = lead_evaluator(found, request.evaluator)
            resources = fw.setup(RunRequest(lead, request.run, plan.options, request.roles), root)
            judging = judging_context(request, run_cascade(request, found))
            solving = replay_cached(
                fw, items, plan.options, clients, resources, plan.options.max_reasks, 64, judging
            )
            return asyncio.run(solving)
        finally:
            cache.close()

    return replay


def another_run(run_dir: Path, fw, plan: RunPlan, found, request: RunRequest, items) -> str | None:
    """What differs when the run directory exists with another identity (the real run would
    refuse it), else None."""
    if not (run_dir / MANIFEST).is_file():
        return None
    config = run_identity(fw, plan.options, found, request.evaluator, items)
    legacy = run_identity(fw, plan.options, found, request.evaluator, items, legacy=True)
    earlier = earlier_identity(fw, plan.options, found, request.evaluator, items)
    for identity in (config, legacy, earlier):  # as the run keeps it (study.Run.open)
        if identity is not None:
            identity |= judging_identity(request.run)
    held = read_manifest(run_dir / MANIFEST)
    fp = fingerprint({"task": plan.task, "config": config})
    if not RunStore.changed(held, plan.task, config, fp, legacy, earlier):
        return None
    if held.task != plan.task:
        return f"the task {held.task}, not {plan.task}"
    return "; ".join(identity_changes(held.config, config)) or "its configuration"


def dry_run_estimates(
    study, request, items, plans, roles, root, prices, out: Console, cache_path=None
):
    """Per run: (run directory, estimate of what it would still ask). No model, no file; the
    roles, self-judging and a run directory that holds another run are said on ``out``."""
    estimates = []
    for plan, found in zip(plans, roles, strict=True):
        fw = plan.framework or study
        run_dir = root / plan.key if plan.key else root
        derived = plan.items is not None
        changed = None if derived else another_run(run_dir, fw, plan, found, request, items)
        if changed is not None and request.run.supersede:
            out.print(f"{run_dir}: --supersede sets its records aside ({changed})", soft_wrap=True)
        elif changed is not None:
            out.print(
                f"{run_dir}: holds a different run; the real run will refuse it ({changed}): "
                "use a new --run-dir, or --supersede",
                style="red",
                soft_wrap=True,
            )
            continue
        for role, ev in found.items():
            out.print(f"{run_dir}: role {role}: {ev.ref().request_name}")
        for pair in self_judging(plan.systems | found):
            out.print(
                f"note: the {pair['judge']} role uses the {pair['system']} model "
                f"{pair['model']} (self-judging)"
            )
        replay = cache_replay(fw, plan, found, request, root, cache_path, out)
        estimate = estimate_from_disk(
            fw,
            plan.options,
            run_dir,
            [] if derived else items,
            [] if derived else item_ids(items),
            role_records(fw, found),
            prices,
            len(items) if derived else None,
            replay,
        )
        if request.run.drivers > 1:
            estimate["drivers"] = driver_shares(request.run.drivers, run_dir, items, derived, out)
        estimates.append((run_dir, estimate | {"derived": derived}))
    return estimates


def driver_shares(drivers: int, run_dir: Path, items, derived: bool, out: Console) -> list[int]:
    """The missing items each of ``drivers`` driver actors would take (said on ``out``); a run
    whose items an earlier run makes is solved by the command itself."""
    from ..execution.drivers import shard_counts

    if derived:
        out.print(
            f"{run_dir}: solved by the command itself (its items come from an earlier run)",
            soft_wrap=True,
        )
        return []
    ids = item_ids(items)
    pending = RunStore.reading(run_dir).pending(ids)
    shares = shard_counts([i for i in ids if i in pending], drivers)
    each = ", ".join(f"driver {k}: {n}" for k, n in enumerate(shares))
    out.print(f"{run_dir}: {drivers} drivers take the missing items ({each})", soft_wrap=True)
    return shares


def print_dry_run(planned: StudyPlan) -> list[tuple[Path, dict]]:
    """Per run: (run directory, what it would still ask), printed; nothing started or written."""
    out = terminal()
    out.print("dry run: inputs checked; no model is started and nothing is written")
    p = planned
    estimates = dry_run_estimates(
        p.study, p.request, p.items, p.runs, p.roles, p.root, p.prices, out, p.cache
    )
    for run_dir, estimate in estimates:
        note = " (items made by an earlier run: about one each)" if estimate["derived"] else ""
        print_estimate(f"{run_dir}{note}", estimate, out)
    return estimates
