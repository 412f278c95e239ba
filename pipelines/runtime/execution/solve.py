"""Solving a run's missing items in one process: each item's answer or its recorded failure,
a bounded queue of workers appending each record as it exists, the clients of a run's roles, and
what the solving reports (usage, concurrency, placement). The study runner calls it for a run
solved here; each driver of a run spread over a Ray cluster calls it for its shard."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from ....serving.client import EndpointError, EvalClient, RequestRejected, StageUsage
from ....serving.launch.server import ServerStartError
from ....serving.reasoning import ReasoningCut
from ....serving.redact import clipped
from ..budget.costs import Budget, Ledger
from ..contract.cascade import Cascade, JudgementAbstained, read_cascade
from ..contract.config import EvaluatorConfig, UserError
from ..contract.protocol import (
    Framework,
    ItemContext,
    ItemT,
    RunPlan,
    RunRequest,
)
from ..contract.results import ItemResult, StageFailed, StageFailure
from ..store.run_dir import RunStore, RunStoreError
from ..terminal import terminal
from .identity import evaluator_key

OpenClient = Callable[[EvaluatorConfig, Path], contextlib.AbstractAsyncContextManager[EvalClient]]
console = terminal(stderr=True)


async def solve_item(fw: Framework[Any, ItemT], item: ItemT, ctx: ItemContext) -> ItemResult:
    """The framework's answer, or the item's failure recorded as such. Only a gone endpoint or
    an interrupt stops the run (what finished is kept; a rerun resumes)."""
    result = await _recorded(fw, item, ctx)
    if ctx.reasoning_log:  # --keep-reasoning: what the judge reasoned, failed items included
        result = result.model_copy(update={"reasoning": ctx.reasoning_log})
    return result


async def _solved(fw: Framework[Any, ItemT], item: ItemT, ctx: ItemContext) -> ItemResult:
    try:
        return await fw.solve(item, ctx)
    except (StageFailed, RequestRejected, JudgementAbstained, ReasoningCut):
        await ctx.settle()  # the failed stage's siblings end first: the record holds them
        raise


async def _recorded(fw: Framework[Any, ItemT], item: ItemT, ctx: ItemContext) -> ItemResult:
    try:
        return await _solved(fw, item, ctx)
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
    except JudgementAbstained as exc:  # never a score: counted apart, offered for labelling
        return ctx.failed(
            StageFailure(stage=exc.stage, error=exc.error),
            "unjudged",
            f"stage {exc.stage}: no tier of the judge cascade was confident enough",
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
        error = clipped(f"{type(exc).__name__}: {exc}", 500)  # redacted, then cut
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
    budget: Budget | Ledger | None = None,
    done: Callable[[ItemResult], None] | None = None,
    label: str = "items",
) -> None:
    """Solve ``items`` with ``workers`` tasks pulling from one queue (memory stays bounded by
    the workers, not the items), appending each result as soon as it exists. A ``budget``
    (or the ``Ledger`` several drivers share) admits each item before it is taken; items in
    flight always finish. ``done(result)`` is told of each result once it is recorded."""
    pending = iter(items)
    ledger = budget if isinstance(budget, Ledger) else Ledger(budget)
    settled = asyncio.Condition()

    async def admitted() -> bool:
        async with settled:
            while (verdict := await ledger.admit(time.time())) is None:
                if ledger.wait_seconds is None:
                    await settled.wait()
                else:  # another driver's item may end first: ask again
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(settled.wait(), ledger.wait_seconds)
        return verdict

    async def worker() -> None:
        # admission and taking the next item happen with no await between them
        while await admitted():
            item = next(pending, None)  # a shared iterator: each item goes to one worker
            if item is None:
                await ledger.release()
                return
            result = await solve(item)
            store.append(result)
            await ledger.record(result.usage)
            async with settled:
                settled.notify_all()
            progress.advance(bar)
            if done is not None:
                done(result)

    total = total or len(items)
    with items_progress(show_progress) as progress:
        bar = progress.add_task(label, total=total, completed=total - len(items))
        tasks = [asyncio.create_task(worker()) for _ in range(max(1, min(workers, len(items))))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            store.close()


def items_progress(show: bool, out: Console | None = None) -> Progress:
    """The run's progress bar: its label (the run's task: framework and setting) whole on one
    line; the bar gives way on a narrow terminal."""
    return Progress(
        TextColumn("[progress.description]{task.description}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show,
        transient=True,
        console=out or console,
    )


def usage_since(client: EvalClient, before: dict[str, StageUsage]) -> dict[str, dict[str, Any]]:
    """Per-stage usage of the client since the snapshot ``before``."""
    out = {}
    for stage, now in client.usage.items():
        then = before.get(stage, StageUsage()).as_dict()
        delta = {k: round(v - then[k], 6) for k, v in now.as_dict().items()}
        if any(delta.values()):
            out[stage] = delta
    return out


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


def run_cascade(request: RunRequest, roles: dict[str, EvaluatorConfig]) -> Cascade | None:
    """The run's ``--cascade``, read and checked against the role it cascades: its members are
    the calibration's tiers, model for model (None: no cascade)."""
    if request.run.cascade is None:
        return None
    from ..contract.panels import panel_members
    from .models import model_record

    cascade = read_cascade(Path(request.run.cascade))
    members = panel_members(cascade.role, list(roles))
    models = [str(model_record(roles[m]).get("request_model", "?")) for m in members]
    cascade.check_role(cascade.role, members, models)
    cascade.check_annotators(request.run.simulated_annotators)
    if cascade.nli_model is not None:
        cascade.check_nli_model(nli_model_digest(request.options))
    return cascade


def judging_context(request: RunRequest, cascade: Cascade | None) -> dict[str, Any]:
    """How the run's items judge, as every ``ItemContext`` of it takes it (the run's and the dry
    run's replay alike): the cascade, the confidence recorded with a lone judge's labels, and
    panel members' own wordings."""
    return {
        "cascade": cascade,
        "label_confidence": request.run.confidence == "logprobs",
        "annotators": request.run.simulated_annotators,
    }


def nli_model_digest(options: Any) -> str | None:
    """The content digest of the NLI cross-encoder ``options`` score pairs with (None: none)."""
    from ....serving.content import model_content

    used = options.cross_encoder() if hasattr(options, "cross_encoder") else None
    return None if used is None else model_content(used[0]).get("revision")


def decided_by_people(store: RunStore) -> dict[str, dict[tuple[str, str], Any]]:
    """Per item, the abstained judgements people have labelled since (``cascade``): the items a
    resume solves again, and what decides each of those judgements there."""
    from ..contract.cascade import people_decided
    from ..store.labels import run_labels

    labels = run_labels(store.dir)
    return people_decided(store.results(), labels) if labels else {}


@dataclass
class Solved:
    """What one process's solving of a run's missing items tells the run's summary."""

    usage: dict[str, dict[str, Any]] = field(default_factory=dict)  # per stage, since it began
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)  # per role: concurrency
    spread: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Serve replicas
    where: dict[str, Any] | None = None  # NLI placement, where the framework has one
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)  # per role: batch rounds


async def solve_missing(
    fw: Framework,
    plan: RunPlan,
    request: RunRequest,
    roles: dict[str, EvaluatorConfig],
    todo: Sequence[Any],
    store: RunStore,
    evaluators: Evaluators,
    resources: dict[str, Any],
    root: Path,
    *,
    budget: Budget | Ledger | None,
    show_progress: bool,
    total: int,
    done: Callable[[ItemResult], None] | None = None,
    began: Callable[[], None] | None = None,
    decided: dict[str, dict[tuple[str, str], Any]] | None = None,
) -> Solved:
    """Open the run's roles, set the framework up once (``resources`` keeps it for the runs
    after), solve ``todo`` into ``store`` and report what that took. ``began()`` is called
    once the first item can be taken (servers up, setup done): the run's clock starts there.
    ``decided``: what people decided of the abstained judgements (``decided_by_people``), where
    the caller has read it already."""
    from .identity import lead_evaluator

    lead = lead_evaluator(roles, request.evaluator)
    clients = await _open_roles(evaluators, roles, store.dir)
    resource_key = f"{fw.name}:{plan.options.model_dump_json()}"
    if resource_key not in resources:
        run_request = RunRequest(lead, request.run, plan.options, request.roles)
        resources[resource_key] = await asyncio.to_thread(fw.setup, run_request, root)
    answers = fw.given_answers(plan.options)
    cascade = run_cascade(request, roles)
    judging = judging_context(request, cascade)
    if decided is None:
        decided = decided_by_people(store) if cascade is not None else {}
    before = {id(c): copy.deepcopy(c.usage) for c in clients.values()}
    spread = await replica_counts(clients)

    async def solve(item):
        ctx = ItemContext(
            str(item.id),
            clients,
            plan.options,
            resources[resource_key],
            store.dir,
            plan.options.max_reasks,
            fw,
            answers,
            reasoning_log=[] if request.run.keep_reasoning else None,
            people=decided.get(str(item.id)),
            **judging,
        )
        return await solve_item(fw, item, ctx)

    workers = lead.concurrency_max if lead.concurrency == "auto" else lead.concurrency
    batched = [ev.batch_size for ev in roles.values() if ev.transport == "batch"]
    if batched:  # a round holds the calls of the items in flight: as many as a batch takes
        workers = max(workers, *batched)
    if began is not None:
        began()
    await run_items(
        todo,
        solve,
        store,
        workers=workers,
        show_progress=show_progress,
        total=total,
        budget=budget,
        done=done,
        label=f"{plan.task}: items",
    )
    placement = getattr(resources[resource_key], "placement", None)
    return Solved(
        usage=_usage_since(clients, before),
        limits={role: client.limit.report() for role, client in clients.items()},
        batches={
            role: client.batcher.stats.as_dict()
            for role, client in clients.items()
            if client.batcher is not None
        },
        spread=replicas_since(spread, await replica_counts(clients)),
        where=placement() if callable(placement) else None,
    )
