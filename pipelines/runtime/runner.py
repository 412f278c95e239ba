"""The one runtime every framework runs on: plan, open or resume each run, solve what is
missing through a bounded queue, record each result as it exists, aggregate, summarise, render.

One event loop serves a whole study, so runs that share an evaluator share its server and client;
a server is started only when some item still needs it and stopped after its last run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from pipelines.datasets.names import data_provenance
from pipelines.runtime.config import EvaluatorConfig, UserError, items_digest
from pipelines.runtime.costs import (
    Budget,
    BudgetReached,
    cost_table,
    hourly_rate,
    load_prices,
    require_prices,
)
from pipelines.runtime.estimate import print_estimate
from pipelines.runtime.evaluator import Servers, model_record, open_evaluator
from pipelines.runtime.identity import (
    evaluator_identity,
    evaluator_key,
    lead_evaluator,
    plan_roles,
    role_records,
    run_identity,
)
from pipelines.runtime.lines import item_ids, select
from pipelines.runtime.planning import estimate_from_disk, print_dry_run
from pipelines.runtime.protocol import (
    Framework,
    ItemContext,
    ItemT,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
)
from pipelines.runtime.records import StudyRecord
from pipelines.runtime.repeats import print_repeats, repeat_plans, repeats_table
from pipelines.runtime.results import ItemResult, StageFailed, StageFailure
from pipelines.runtime.roles import judges_without_reasoning, self_judging
from pipelines.runtime.runstore import (
    STUDY_FILE,
    RunStore,
    RunStoreError,
    atomic_write_json,
    fingerprint,
    invocation_seconds,
    record_invocation,
)
from pipelines.runtime.summary import (
    print_summary,
    recorded_cost,
    recorded_usage,
    records_for_tables,
    summarise,
    tables_of,
    usage_by_role,
)
from serving.client import EndpointError, EvalClient, RequestRejected, StageUsage
from serving.launcher import ServerStartError
from serving.reasoning import ReasoningCut

OpenClient = Callable[[EvaluatorConfig, Path], contextlib.AbstractAsyncContextManager[EvalClient]]
console = Console(stderr=True)


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so servers we started are stopped on the way out."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# ---- solving -----------------------------------------------------------------------------------


async def solve_item(fw: Framework[Any, ItemT], item: ItemT, ctx: ItemContext) -> ItemResult:
    """The framework's answer, or the item's failure recorded as such. Only a gone endpoint or
    an interrupt stops the run (what finished is kept; a rerun resumes)."""
    result = await _solved(fw, item, ctx)
    if ctx.reasoning_log:  # --keep-reasoning: what the judge reasoned, failed items included
        result = result.model_copy(update={"reasoning": ctx.reasoning_log})
    return result


async def _solved(fw: Framework[Any, ItemT], item: ItemT, ctx: ItemContext) -> ItemResult:
    try:
        return await fw.solve(item, ctx)
    except StageFailed as failure:
        return ctx.failed(
            failure.failure(),
            "unparseable",
            f"stage {failure.stage} stayed unparseable after re-asks",
        )
    except RequestRejected as exc:
        return ctx.failed(
            StageFailure(stage=exc.stage, error=str(exc)),
            "error",
            f"the server rejected a request of stage {exc.stage}",
        )
    except ReasoningCut as exc:  # counted as such, never a score; a resume asks again
        return ctx.failed(
            StageFailure(stage=exc.stage, error=str(exc)),
            "cut_in_reasoning",
            f"stage {exc.stage}: the reasoning used every token of the largest budget",
        )
    except (EndpointError, UserError, RunStoreError, ServerStartError):
        raise
    except Exception as exc:  # a defect on this item: recorded, retried on resume, run goes on
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
        return ctx.failed(
            StageFailure(stage="solve", error=error), "error", "solving the item raised an error"
        )


async def run_items(
    items: Sequence[Any],
    solve: Callable[[Any], Any],
    store: RunStore,
    *,
    workers: int,
    show_progress: bool = True,
    total: int | None = None,
    budget: Budget | None = None,
) -> None:
    """Solve ``items`` with ``workers`` tasks pulling from one queue (memory stays bounded by
    the workers, not the items), appending each result as soon as it exists. A ``budget``
    admits each item before it is taken; items in flight always finish."""
    pending = iter(items)
    budget = budget or Budget(None, None, lambda usage: 0.0)
    settled = asyncio.Condition()

    async def admitted() -> bool:
        async with settled:
            while (verdict := budget.admit(time.time())) is None:
                await settled.wait()
        return verdict

    async def worker() -> None:
        # admission and taking the next item happen with no await between them
        while await admitted():
            item = next(pending, None)  # a shared iterator: each item goes to one worker
            if item is None:
                budget.release()
                return
            result = await solve(item)
            store.append(result)
            budget.record(result.usage, new=True)
            async with settled:
                settled.notify_all()
            progress.advance(bar)

    total = total or len(items)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show_progress,
        transient=True,
        console=console,
    ) as progress:
        bar = progress.add_task("items", total=total, completed=total - len(items))
        tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(workers, len(items))))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            store.close()


def usage_since(client: EvalClient, before: dict[str, StageUsage]) -> dict[str, dict[str, Any]]:
    """Per-stage usage of the client since the snapshot ``before``."""
    out = {}
    for stage, now in client.usage.items():
        then = before.get(stage, StageUsage()).as_dict()
        delta = {k: round(v - then[k], 6) for k, v in now.as_dict().items()}
        if any(delta.values()):
            out[stage] = delta
    return out


# ---- studies -----------------------------------------------------------------------------------


class Evaluators:
    """Clients opened on demand, one per distinct evaluator, closed after their last run."""

    def __init__(self, open_client: OpenClient, remaining: list[set[str]]):
        self.open_client = open_client
        self.remaining = remaining  # evaluator keys of every run still to come, in order
        self.open: dict[str, tuple[EvalClient, contextlib.AsyncExitStack]] = {}

    async def client(self, key: str, ev: EvaluatorConfig, run_dir: Path) -> EvalClient:
        if key not in self.open:
            stack = contextlib.AsyncExitStack()
            client = await stack.enter_async_context(self.open_client(ev, run_dir))
            self.open[key] = (client, stack)
        return self.open[key][0]

    async def done_with_run(self) -> None:
        self.remaining.pop(0)
        later = set().union(*self.remaining)
        for key in [k for k in self.open if k not in later]:
            _, stack = self.open.pop(key)
            await stack.aclose()

    async def aclose(self) -> None:
        for _, stack in self.open.values():
            await stack.aclose()
        self.open.clear()


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
            _execute(study, request, items, plans, roles, root, open_client, quiet, prices, pilot)
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


async def _execute(study, request, items, plans, roles, root, opener, quiet, prices, pilot):
    keys = [{evaluator_key(ev) for ev in found.values()} for found in roles]
    evaluators = Evaluators(opener, keys)
    resources: dict[str, Any] = {}
    outcomes: dict[str, RunOutcome] = {}
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
            )
            await evaluators.done_with_run()
    finally:
        await evaluators.aclose()
        await asyncio.to_thread(close_resources, resources)
    return outcomes


async def replica_counts(clients: dict[str, EvalClient]) -> dict[str, list[dict[str, Any]]]:
    """Each Ray Serve app's replicas now (node, pid, requests answered so far), by model."""
    counts = {}
    for client in {id(c): c for c in clients.values()}.values():
        replicas = getattr(client, "replicas", None)  # a test's scripted client has none
        if replicas is not None:
            counts[client.model] = await asyncio.to_thread(replicas)
    return counts


def replicas_since(before: dict[str, list[dict]], now: dict[str, list[dict]]) -> dict[str, list]:
    """Requests each replica answered between the two counts (a new replica counts from 0)."""
    spread = {}
    for model, replicas in now.items():
        earlier = {(r["node"], r["pid"]): r["requests"] for r in before.get(model, [])}
        spread[model] = [
            r | {"requests": r["requests"] - earlier.get((r["node"], r["pid"]), 0)}
            for r in replicas
        ]
    return spread


def close_resources(resources: dict[str, Any]) -> None:
    """What a framework's setup opened and must give back (a Serve app it deployed, Ray
    drivers), once its last run is done."""
    for resource in resources.values():
        close = getattr(resource, "close", None)
        if callable(close):
            close()


async def _open_roles(evaluators: Evaluators, roles: dict[str, EvaluatorConfig], run_dir: Path):
    """One client per distinct evaluator; roles that resolve to the same one share it. They
    open together, so the servers of a run's local models start side by side; every opening
    ends (what opened is closed with the rest) before the first failure is raised."""
    keys = {role: evaluator_key(ev) for role, ev in roles.items()}
    distinct: dict[str, EvaluatorConfig] = {}
    for role, ev in roles.items():
        distinct.setdefault(keys[role], ev)
    opened = await asyncio.gather(
        *(evaluators.client(key, ev, run_dir) for key, ev in distinct.items()),
        return_exceptions=True,
    )
    clients: dict[str, EvalClient] = {}
    for key, client in zip(distinct, opened, strict=True):
        if isinstance(client, BaseException):
            raise client
        clients[key] = client
    return {role: clients[keys[role]] for role in roles}


def _usage_since(clients: dict[str, EvalClient], before: dict[int, dict[str, StageUsage]]):
    usage: dict[str, dict[str, Any]] = {}
    for client in {id(c): c for c in clients.values()}.values():
        for stage, delta in usage_since(client, before[id(client)]).items():
            into = usage.setdefault(stage, dict.fromkeys(delta, 0))
            for k, v in delta.items():
                into[k] = round(into.get(k, 0) + v, 6)
    return usage


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
):
    fw: Framework = plan.framework or study
    lead = lead_evaluator(roles, request.evaluator)
    judged_by_itself = self_judging(plan.systems | roles)
    store = RunStore(root / plan.key if plan.key else root)
    records = role_records(fw, roles)
    store.open(
        framework=fw.name,
        task=plan.task,
        config=run_identity(fw, plan.options, roles, request.evaluator, items),
        options=plan.options.model_dump(mode="json"),
        models=model_record(lead),
        roles=records,
        self_judging=judged_by_itself,
        prompts=fw.prompt_ids(plan.options),
        items=len(items),
        data=data_provenance(plan.options),
    )
    console.print(f"run directory: {store.dir}")
    for pair in judged_by_itself:
        console.print(
            f"note: the {pair['judge']} role uses the {pair['system']} model {pair['model']} "
            f"(self-judging); --role {pair['judge']}=MODEL sets another"
        )
    ids = item_ids(items)
    pending = store.pending(ids)
    todo = select(items, [k for k, i in enumerate(ids) if i in pending][:pilot])
    started, usage, budget, where = time.time(), {}, None, None
    limits: dict[str, dict[str, Any]] = {}  # per role: where its requests in flight settled
    spread: dict[str, list[dict[str, Any]]] = {}
    if todo:  # nothing missing: no model is started, no resource loaded
        clients = await _open_roles(evaluators, roles, store.dir)
        resource_key = f"{fw.name}:{plan.options.model_dump_json()}"
        if resource_key not in resources:
            run_request = RunRequest(lead, request.run, plan.options, request.roles)
            resources[resource_key] = await asyncio.to_thread(fw.setup, run_request, root)
        answers = fw.given_answers(plan.options)
        before = {id(c): copy.deepcopy(c.usage) for c in clients.values()}
        spread = await replica_counts(clients)
        max_reasks = plan.options.max_reasks

        async def solve(item):
            ctx = ItemContext(
                str(item.id),
                clients,
                plan.options,
                resources[resource_key],
                store.dir,
                max_reasks,
                fw,
                answers,
                reasoning_log=[] if request.run.keep_reasoning else None,
            )
            return await solve_item(fw, item, ctx)

        budget = open_budget(request, fw, records, prices, store, ids)
        solving = time.time()
        if budget is not None:
            budget.clock_start = solving
        try:
            workers = lead.concurrency_max if lead.concurrency == "auto" else lead.concurrency
            await run_items(
                todo,
                solve,
                store,
                workers=workers,
                show_progress=not quiet,
                total=len(items),
                budget=budget,
            )
        finally:
            solved = len(pending) - len(store.pending(ids))
            record_invocation(store.dir, solving, time.time() - solving, solved)
        usage = _usage_since(clients, before)
        limits = {role: client.limit.report() for role, client in clients.items()}
        spread = replicas_since(spread, await replica_counts(clients))
        placement = getattr(resources[resource_key], "placement", None)
        where = placement() if callable(placement) else None
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


@contextlib.asynccontextmanager
async def fixed_client(client: EvalClient) -> AsyncIterator[EvalClient]:
    """An already-open client as an ``open_client`` result (it stays open afterwards)."""
    yield client
