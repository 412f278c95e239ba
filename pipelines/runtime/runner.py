"""The one runtime every framework runs on: plan, open or resume each run, solve what is
missing through a bounded queue, record each result as it exists, aggregate, summarise, render.

One event loop serves a whole study, so runs that share an evaluator share its server and client;
a server is started only when some item still needs it and stopped after its last run.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from ...serving.client import EvalClient
from ..datasets.names import data_provenance
from .config import items_digest
from .costs import (
    Budget,
    BudgetReached,
    cost_table,
    hourly_rate,
    load_prices,
    require_prices,
)
from .drivers import check_drivers, solve_on_drivers
from .errors import ItemsFailed
from .estimate import print_estimate
from .evaluator import Servers, model_record, open_evaluator
from .identity import (
    evaluator_identity,
    evaluator_key,
    lead_evaluator,
    plan_roles,
    role_records,
    run_identity,
)
from .lines import item_ids, select
from .planning import estimate_from_disk, print_dry_run
from .protocol import (
    Framework,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
)
from .provenance import input_records
from .records import StudyRecord
from .repeats import print_repeats, repeat_plans, repeats_table
from .roles import judges_without_reasoning, self_judging
from .runstore import (
    STUDY_FILE,
    RunStore,
    atomic_write_json,
    fingerprint,
    invocation_seconds,
    record_invocation,
)
from .served import Endpoints, resolve_roles, unresolved_notes
from .solving import (
    Evaluators,
    OpenClient,
    close_resources,
    console,
    solve_missing,
)
from .summary import (
    failed_line,
    print_summary,
    recorded_cost,
    recorded_usage,
    records_for_tables,
    summarise,
    tables_of,
    usage_by_role,
)


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so servers we started are stopped on the way out."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# ---- studies -----------------------------------------------------------------------------------


def study_root(study: Study, request: RunRequest, items: Sequence[Any]) -> Path:
    if request.run.run_dir:
        return Path(request.run.run_dir)
    identity = {
        "study": study.name,
        "items": items_digest(items),
        "evaluator": evaluator_identity(request.evaluator),
        "options": request.options.model_dump(mode="json"),
    }
    if request.roles:  # a run with other models per role is another run
        identity["roles"] = {r: s.model_dump(mode="json") for r, s in sorted(request.roles.items())}
    if request.run.repeats > 1:  # K seeded runs under one root: not the single run's root
        identity["repeats"] = request.run.repeats
    return Path("runs") / f"{study.name}-{fingerprint(identity)}"


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
    study.check_roles(list(request.roles))
    items = study.load(request.options)
    study.check_inputs(request.options)
    if isinstance(study, Framework):  # an answers file: read and checked before anything is written
        study.given_answers(request.options, set(study.answer_ids(request.options, items)))
    root = study_root(study, request, items)
    plans = study.plan(request, root)
    repeats = request.run.repeats > 1
    if repeats:
        plans = repeat_plans(study, request, plans)
    roles = [plan_roles(p.framework or study, p, request) for p in plans]  # type: ignore[arg-type]
    if study.paper_judges_without_reasoning:
        roles = [judges_without_reasoning(r) for r in roles]
    # every endpoint a role uses is asked for its models before a run directory is written;
    # a test's or a notebook's own client is not asked
    endpoints = Endpoints(tolerate=dry_run, probe=open_client is None)
    endpoints.probe([ev for found in roles for ev in found.values()])
    roles = resolve_roles(roles, endpoints)
    unknown = unresolved_notes(roles) if endpoints.asks else []  # a given client: not asked
    for note in [*endpoints.notes(), *unknown]:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    check_drivers(request, roles)
    prices = load_prices(request.run.prices)
    if request.run.max_cost is not None:
        require_prices(
            [
                role_records(p.framework or study, found)  # type: ignore[arg-type]
                for p, found in zip(plans, roles, strict=True)
            ],
            prices,
        )
    cache = None if no_cache else request.run.cache
    if dry_run:  # the outcomes hold only each run's estimate
        estimates = print_dry_run(study, request, items, plans, roles, root, prices, cache)
        return {
            str(run_dir): RunOutcome(run_dir, [], None, None, estimate=estimate)
            for run_dir, estimate in estimates
        }
    servers = None
    if open_client is None:
        servers = Servers([ev for found in roles for ev in found.values()], linger=len(plans) > 1)
        open_client = lambda ev, run_dir: open_evaluator(ev, run_dir, cache, servers)  # noqa: E731
    sigterm_as_interrupt()
    try:
        outcomes = asyncio.run(
            _execute(
                study, request, items, plans, roles, root, open_client, quiet, prices, pilot, cache
            )
        )
    finally:
        if servers is not None:
            servers.close()
    combined = repeats_table(outcomes) if repeats else study.combine(outcomes, request.options)
    if len(plans) > 1 or combined is not None:
        atomic_write_json(
            root / STUDY_FILE,
            StudyRecord(
                study=study.name,
                options=request.options.model_dump(mode="json"),
                runs=[p.key for p in plans],
                combined=combined,
                **({"repeats": request.run.repeats} if repeats else {}),
            ).to_json(),
        )
    if repeats and combined is not None:
        print_repeats(combined, Console())
    elif combined is not None:
        study.render_combined(combined, Console())
    return outcomes


async def _execute(study, request, items, plans, roles, root, opener, quiet, prices, pilot, cache):
    keys = [{evaluator_key(ev) for ev in found.values()} for found in roles]
    evaluators = Evaluators(opener, keys)
    resources: dict[str, Any] = {}
    outcomes: dict[str, RunOutcome] = {}
    held: list[RunStore] = []  # the run directories this invocation holds the lock of
    try:
        for plan, plan_roles_ in zip(plans, roles, strict=True):
            run_items_ = plan.items(outcomes) if plan.items else items
            outcomes[plan.key] = await _run_one(
                study,
                request,
                plan,
                plan_roles_,
                run_items_,
                root,
                evaluators,
                resources,
                quiet,
                prices,
                pilot,
                len(items),
                cache,
                held,
            )
            held.pop().release()
            await evaluators.done_with_run()
    finally:
        for store in held:
            store.release()
        await evaluators.aclose()
        await asyncio.to_thread(close_resources, resources)
    return outcomes


def open_budget(request: RunRequest, fw: Framework, records, prices, store: RunStore, ids):
    """The run's caps with what its recorded items already spent (None without a cap)."""
    run = request.run
    if run.max_cost is None and run.max_run_tokens is None:
        return None
    budget = Budget(
        run.max_run_tokens,
        run.max_cost,
        item_cost=lambda usage: cost_table(fw, usage, records, prices)["total"],
        hourly_rate=hourly_rate(records, prices),
        clock_start=time.time(),
        prior_seconds=invocation_seconds(store.dir),
    )
    pending = store.pending(ids)
    for record in store.results([i for i in ids if i not in pending]):
        budget.record(record.usage, new=False)
    return budget


async def _run_one(
    study,
    request,
    plan: RunPlan,
    roles,
    items,
    root,
    evaluators,
    resources,
    quiet,
    prices,
    pilot,
    study_items,
    cache,
    held: list[RunStore],
):
    fw: Framework = plan.framework or study
    lead = lead_evaluator(roles, request.evaluator)
    judged_by_itself = self_judging(plan.systems | roles)
    store = RunStore(root / plan.key if plan.key else root)
    records = role_records(fw, roles)
    inputs = input_records(plan.options)
    store.open(
        framework=fw.name,
        task=plan.task,
        config=run_identity(fw, plan.options, roles, request.evaluator, items, inputs),
        legacy=run_identity(fw, plan.options, roles, request.evaluator, items, legacy=True),
        supersede=request.run.supersede,
        inputs=inputs,
        options=plan.options.model_dump(mode="json"),
        models=model_record(lead),
        roles=records,
        self_judging=judged_by_itself,
        prompts=fw.prompt_ids(plan.options),
        items=len(items),
        data=data_provenance(plan.options),
    )
    held.append(store)  # its lock is given back when the run ends, whichever way
    console.print(f"run directory: {store.dir}")
    for pair in judged_by_itself:
        console.print(
            f"note: the {pair['judge']} role uses the {pair['system']} model {pair['model']} "
            f"(self-judging); --role {pair['judge']}=MODEL sets another"
        )
    ids = item_ids(items)
    pending = store.pending(ids)
    todo = select(items, [k for k, i in enumerate(ids) if i in pending][:pilot])
    if request.run.drivers > 1 and not spread_over_drivers(request, plan, pilot):
        console.print(
            f"note: {store.dir} is solved by this process, not by {request.run.drivers} drivers "
            f"({'a pilot' if pilot is not None else 'its items come from an earlier run'})"
        )
    started, usage, budget, where = time.time(), {}, None, None
    limits: dict[str, dict[str, Any]] = {}  # per role: where its requests in flight settled
    spread: dict[str, list[dict[str, Any]]] = {}
    drivers = None
    if todo:  # nothing missing: no model is started, no resource loaded
        budget = open_budget(request, fw, records, prices, store, ids)
        solving: list[float] = []  # when the items began (after servers and setup)

        def began() -> None:
            solving.append(time.time())
            if budget is not None:
                budget.clock_start = solving[0]

        drivers_used = spread_over_drivers(request, plan, pilot)
        try:
            if drivers_used:
                began()
                run = await solve_on_drivers(
                    study.name,
                    request,
                    plan.key,
                    roles,
                    root,
                    store,
                    [i for i in ids if i in pending],
                    budget=budget,
                    cache=cache,
                    show_progress=not quiet,
                )
                solved, drivers = run.solved, run.drivers
                if budget is not None:
                    budget.stopped = run.budget_stop
            else:
                solved = await solve_missing(
                    fw,
                    plan,
                    request,
                    roles,
                    todo,
                    store,
                    evaluators,
                    resources,
                    root,
                    budget=budget,
                    show_progress=not quiet,
                    total=len(items),
                    began=began,
                )
        finally:
            if drivers_used:
                store.reindex()  # what the drivers recorded in their own files
            if solving:
                done = len(pending) - len(store.pending(ids))
                record_invocation(store.dir, solving[0], time.time() - solving[0], done)
        usage, limits, spread, where = solved.usage, solved.limits, solved.spread, solved.where
    # in id order: tables (bootstrap intervals too) equal what `report` rebuilds
    results = records_for_tables(fw, plan.options, store.results(sorted(ids)))
    tables = tables_of(fw, plan.options, results)
    summary = summarise(fw.name, plan.task, len(items), results)
    summary.add(
        usage_this_invocation=usage,
        usage_by_role_this_invocation=usage_by_role(fw, usage, store.manifest().roles),
        self_judging=judged_by_itself,
        concurrency_this_invocation=limits,
        seconds_this_invocation=round(time.time() - started, 3),
    )
    if where is not None:  # which replicas (node, process) answered this invocation's NLI
        summary.add(nli_placement_this_invocation=where)
    if spread:  # how the requests spread over the replicas of an app the run started
        summary.add(replicas_this_invocation=spread)
    if drivers is not None:  # --drivers N: what each driver did, and where
        summary.add(drivers_this_invocation=drivers)
    if prices:
        summary.add(
            cost_this_invocation=cost_table(
                fw, usage, records, prices, summary.seconds_this_invocation or 0.0
            ),
            cost_recorded=recorded_cost(fw, recorded_usage(results), records, prices, store.dir),
        )
    remaining = len(store.pending(ids))
    if budget is not None and budget.stopped and remaining:
        summary.add(budget_stop=budget.stopped)
    if pilot is not None:  # what the rest will ask, from every item recorded so far
        derived = study_items if plan.items is not None else None
        summary.add(
            estimate_of_the_rest=estimate_from_disk(
                fw, plan.options, store.dir, items, ids, records, prices, derived
            )
        )
    store.write_summary(summary)
    name = fw.tables_file(plan.options)
    if tables is not None and name:
        atomic_write_json(store.dir / name, tables)
    print_summary(summary, Console())
    if tables is not None:
        fw.render(tables, Console())
    if pilot is not None:
        print_estimate(
            f"after the pilot, {store.dir}", summary.estimate_of_the_rest or {}, Console()
        )
    if summary.budget_stop:
        raise BudgetReached(
            f"{store.dir}: stopped admitting items ({summary.budget_stop}); {remaining} of "
            f"{len(items)} items remain: rerun with a higher cap to resume"
        )
    return RunOutcome(store.dir, results, tables, summary, fw)


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


def spread_over_drivers(request: RunRequest, plan: RunPlan, pilot: int | None) -> bool:
    """Whether this run's items go to driver actors: ``--drivers`` above 1, items the study
    loads itself (a driver rebuilds them), and not a pilot (its K items are solved here)."""
    return request.run.drivers > 1 and plan.items is None and pilot is None


@contextlib.asynccontextmanager
async def fixed_client(client: EvalClient) -> AsyncIterator[EvalClient]:
    """An already-open client as an ``open_client`` result (it stays open afterwards)."""
    yield client
