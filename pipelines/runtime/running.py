"""A study's runs, one after the other, on one event loop: each run's directory opened (or
resumed) under its identity, its missing items solved (here, or by ``--drivers N`` driver
actors), and its summary and tables written and printed; then the study's own table.

Runs that share an evaluator share its server and client; a server is started only when some
item still needs it and stopped after its last run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from ..datasets.names import data_provenance
from .config import EvaluatorConfig
from .costs import open_budget
from .drivers import solve_on_drivers, spread_over_drivers
from .evaluator import Servers, model_record, open_evaluator
from .identity import evaluator_key, lead_evaluator, role_records, run_identity
from .lines import item_ids, select
from .plan import StudyPlan
from .protocol import Framework, RunOutcome, RunPlan
from .provenance import input_records
from .records import StudyRecord
from .repeats import print_repeats, repeats_table
from .roles import self_judging
from .runstore import STUDY_FILE, RunStore, atomic_write_json, record_invocation
from .solving import Evaluators, OpenClient, close_resources, console, solve_missing
from .summary import summarise_run


def run_study(
    planned: StudyPlan, open_client: OpenClient | None, *, quiet: bool, pilot: int | None
) -> dict[str, RunOutcome]:
    """Solve every run of the plan (``open_client``: a caller's own client, else a server per
    local model), then the study's combined table, written and printed."""
    servers = None
    if open_client is None:
        evaluators = [ev for found in planned.roles for ev in found.values()]
        servers = Servers(evaluators, linger=len(planned.runs) > 1)
        cache = planned.cache
        open_client = lambda ev, run_dir: open_evaluator(ev, run_dir, cache, servers)  # noqa: E731
    try:
        outcomes = asyncio.run(_runs(planned, open_client, quiet, pilot))
    finally:
        if servers is not None:
            servers.close()
    study, options = planned.study, planned.request.options
    combined = repeats_table(outcomes) if planned.repeats else study.combine(outcomes, options)
    if len(planned.runs) > 1 or combined is not None:
        repeats = {"repeats": planned.request.run.repeats} if planned.repeats else {}
        record = StudyRecord(
            study=study.name,
            options=options.model_dump(mode="json"),
            runs=[run.key for run in planned.runs],
            combined=combined,
            **repeats,
        )
        atomic_write_json(planned.root / STUDY_FILE, record.to_json())
    if planned.repeats and combined is not None:
        print_repeats(combined, Console())
    elif combined is not None:
        study.render_combined(combined, Console())
    return outcomes


async def _runs(
    planned: StudyPlan, opener: OpenClient, quiet: bool, pilot: int | None
) -> dict[str, RunOutcome]:
    keys = [{evaluator_key(ev) for ev in found.values()} for found in planned.roles]
    evaluators = Evaluators(opener, keys)
    resources: dict[str, Any] = {}
    outcomes: dict[str, RunOutcome] = {}
    try:
        for plan, roles in zip(planned.runs, planned.roles, strict=True):
            items = plan.items(outcomes) if plan.items else planned.items
            run = Run(planned, plan, roles, items, evaluators, resources, quiet, pilot)
            try:
                outcomes[plan.key] = await run.execute()
            finally:
                if run.store is not None:  # its lock is given back however the run ended
                    run.store.release()
            await evaluators.done_with_run()
    finally:
        await evaluators.aclose()
        await asyncio.to_thread(close_resources, resources)
    return outcomes


@dataclass
class Run:
    """One run of a study, in named steps: ``open`` its directory, ``solve`` what is missing,
    ``summarise`` it."""

    planned: StudyPlan
    plan: RunPlan
    roles: dict[str, EvaluatorConfig]
    items: Any
    evaluators: Evaluators
    resources: dict[str, Any]
    quiet: bool
    pilot: int | None
    store: RunStore | None = None
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    self_judging: list[dict[str, str]] = field(default_factory=list)

    @property
    def fw(self) -> Framework[Any, Any]:
        return self.plan.framework or self.planned.study  # type: ignore[return-value]

    async def execute(self) -> RunOutcome:
        store = self.open()
        started = time.time()
        ids = item_ids(self.items)
        pending = store.pending(ids)
        todo = select(self.items, [k for k, i in enumerate(ids) if i in pending][: self.pilot])
        # nothing missing: no model is started, no resource loaded
        solving = await self.solve(store, ids, pending, todo) if todo else None
        return summarise_run(self, store, ids, solving, started)

    def open(self) -> RunStore:
        """The run directory, opened under the run's identity (a changed one is refused by name,
        or set aside with ``--supersede``); the self-judging roles said."""
        fw, plan, request = self.fw, self.plan, self.planned.request
        root = self.planned.root
        self.self_judging = self_judging(plan.systems | self.roles)
        self.records = role_records(fw, self.roles)
        inputs = input_records(plan.options)
        given = (fw, plan.options, self.roles, request.evaluator, self.items)
        identity, legacy = run_identity(*given, inputs), run_identity(*given, legacy=True)
        self.store = store = RunStore(root / plan.key if plan.key else root)
        store.open(
            framework=fw.name,
            task=plan.task,
            config=identity,
            legacy=legacy,
            supersede=request.run.supersede,
            inputs=inputs,
            options=plan.options.model_dump(mode="json"),
            models=model_record(lead_evaluator(self.roles, request.evaluator)),
            roles=self.records,
            self_judging=self.self_judging,
            prompts=fw.prompt_ids(plan.options),
            items=len(self.items),
            data=data_provenance(plan.options),
        )
        console.print(f"run directory: {store.dir}")
        for pair in self.self_judging:
            console.print(
                f"note: the {pair['judge']} role uses the {pair['system']} model {pair['model']} "
                f"(self-judging); --role {pair['judge']}=MODEL sets another"
            )
        drivers = self.planned.request.run.drivers
        if drivers > 1 and not spread_over_drivers(request, plan, self.pilot):
            console.print(
                f"note: {store.dir} is solved by this process, not by {drivers} drivers "
                f"({'a pilot' if self.pilot is not None else 'its items come from an earlier run'})"
            )
        return store

    async def solve(self, store: RunStore, ids: list[str], pending: set[str], todo: Any) -> Solving:
        """The missing items, here or on driver actors; the run's clock starts once the first
        item can be taken (servers up, setup done)."""
        request, planned = self.planned.request, self.planned
        fw, plan = self.fw, self.plan
        budget = open_budget(request, fw, self.records, planned.prices, store, ids)
        solving = Solving(budget=budget)
        on_drivers = spread_over_drivers(request, plan, self.pilot)
        try:
            if on_drivers:
                solving.began()
                run = await solve_on_drivers(
                    planned.study.name,
                    request,
                    plan.key,
                    self.roles,
                    planned.root,
                    store,
                    [i for i in ids if i in pending],
                    budget=budget,
                    cache=planned.cache,
                    show_progress=not self.quiet,
                )
                solving.took(run.solved, run.drivers)
                if budget is not None:
                    budget.stopped = run.budget_stop
            else:
                solved = await solve_missing(
                    fw,
                    plan,
                    request,
                    self.roles,
                    todo,
                    store,
                    self.evaluators,
                    self.resources,
                    planned.root,
                    budget=budget,
                    show_progress=not self.quiet,
                    total=len(self.items),
                    began=solving.began,
                )
                solving.took(solved)
        finally:
            if on_drivers:
                store.reindex()  # what the drivers recorded in their own files
            if solving.start is not None:
                done = len(pending) - len(store.pending(ids))
                record_invocation(store.dir, solving.start, time.time() - solving.start, done)
        return solving


@dataclass
class Solving:
    """What solving a run's missing items took: its budget, when the items began, what the
    solver reported, and the drivers' own reports (``--drivers``)."""

    budget: Any = None
    start: float | None = None
    solved: Any = None
    drivers: list[dict[str, Any]] | None = None

    def began(self) -> None:
        if self.start is None:
            self.start = time.time()
            if self.budget is not None:
                self.budget.clock_start = self.start

    def took(self, solved: Any, drivers: list[dict[str, Any]] | None = None) -> None:
        self.solved, self.drivers = solved, drivers
