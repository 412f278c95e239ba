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

from ...datasets.names import data_provenance
from ..budget.costs import BudgetReached, cost_table, open_budget
from ..budget.dry_run import estimate_from_disk
from ..budget.estimate import print_estimate
from ..contract.config import EvaluatorConfig
from ..contract.protocol import Framework, RunOutcome, RunPlan
from ..contract.roles import self_judging
from ..store.lines import item_ids, select
from ..store.manifest import StudyRecord
from ..store.provenance import input_records
from ..store.run_dir import STUDY_FILE, RunStore, atomic_write_json, record_invocation
from ..store.summary import (
    print_summary,
    recorded_cost,
    recorded_usage,
    records_for_tables,
    summarise,
    tables_of,
    usage_by_role,
)
from ..terminal import terminal
from .drivers import solve_on_drivers, spread_over_drivers
from .identity import (
    earlier_identity,
    evaluator_key,
    judging_identity,
    lead_evaluator,
    role_records,
    run_identity,
)
from .models import Servers, model_record, open_evaluator
from .plan import StudyPlan
from .repeats import print_repeats, repeats_table
from .solve import (
    Evaluators,
    OpenClient,
    close_resources,
    console,
    decided_by_people,
    run_cascade,
    solve_missing,
)


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
            source=getattr(study, "source", None),
            **repeats,
        )
        atomic_write_json(planned.root / STUDY_FILE, record.to_json(), within=planned.root)
    if planned.repeats and combined is not None:
        print_repeats(combined, terminal())
    elif combined is not None:
        study.render_combined(combined, terminal())
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
    # the abstained judgements people have decided since (a cascade run), read once
    decided: dict[str, dict[tuple[str, str], Any]] | None = None

    @property
    def fw(self) -> Framework[Any, Any]:
        return self.plan.framework or self.planned.study  # type: ignore[return-value]

    async def execute(self) -> RunOutcome:
        store = self.open()
        started = time.time()
        ids = item_ids(self.items)
        pending = store.pending(ids)
        if self.planned.request.run.cascade is not None:  # what people decided since: again
            self.decided = decided_by_people(store)  # read once: the contexts take it
            pending |= set(self.decided) & set(ids)
        todo = select(self.items, [k for k, i in enumerate(ids) if i in pending][: self.pilot])
        # nothing missing: no model is started, no resource loaded
        solving = await self.solve(store, ids, pending, todo) if todo else None
        return self.summarise(store, ids, solving, started)

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
        earlier = earlier_identity(*given, inputs)
        run_cascade(request, self.roles)  # its tiers checked against the roles, before writing
        judging = judging_identity(request.run)  # another calibration is another run
        for found in (identity, legacy, earlier):
            if found is not None:
                found |= judging
        self.store = store = RunStore(root / plan.key if plan.key else root)
        store.open(
            framework=fw.name,
            task=plan.task,
            config=identity,
            legacy=legacy,
            earlier=earlier,
            supersede=request.run.supersede,
            inputs=inputs,
            options=plan.options.model_dump(mode="json"),
            models=model_record(lead_evaluator(self.roles, request.evaluator)),
            roles=self.records,
            self_judging=self.self_judging,
            prompts=fw.prompt_ids(plan.options),
            items=len(self.items),
            data=data_provenance(plan.options),
            source=getattr(fw, "source", None),
        )
        console.print(f"run directory: {store.dir}")
        source = getattr(fw, "source", None)
        if source:
            console.print(
                f"note: {fw.name} runs from {source['file']} (sha256 {source['sha256'][:12]}, part "
                "of the run's identity: an edited file is another run); the same command resumes "
                "it, and report / view / agreement read it from that file",
                highlight=False,
                soft_wrap=True,
            )
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
                    decided=self.decided,
                )
                solving.took(solved)
        finally:
            if on_drivers:
                store.reindex()  # what the drivers recorded in their own files
            if solving.start is not None:
                done = len(pending) - len(store.pending(ids))
                record_invocation(store.dir, solving.start, time.time() - solving.start, done)
        return solving

    def summarise(
        self, store: RunStore, ids: list[str], solving: Solving | None, started: float
    ) -> RunOutcome:
        """The run's last step: its records in id order (tables and bootstrap intervals equal
        what ``report`` rebuilds), its summary with what this invocation used and cost, written
        and printed; ``BudgetReached`` when a cap stopped it with items left."""
        fw, plan, planned, run = self.fw, self.plan, self.planned, self
        results = records_for_tables(fw, plan.options, store.results(sorted(ids)))
        tables = tables_of(fw, plan.options, results)
        summary = summarise(fw.name, plan.task, len(run.items), results)
        solved = solving.solved if solving is not None else None
        usage = solved.usage if solved is not None else {}
        summary.add(
            usage_this_invocation=usage,
            usage_by_role_this_invocation=usage_by_role(fw, usage, store.manifest().roles),
            self_judging=run.self_judging,
            concurrency_this_invocation=solved.limits if solved is not None else {},
            seconds_this_invocation=round(time.time() - started, 3),
        )
        if solved is not None and solved.where is not None:  # which replicas answered the NLI
            summary.add(nli_placement_this_invocation=solved.where)
        if solved is not None and solved.spread:  # requests over the replicas the run started
            summary.add(replicas_this_invocation=solved.spread)
        if solved is not None and solved.batches:  # a batch transport: its rounds
            summary.add(batches_this_invocation=solved.batches)
        if solving is not None and solving.drivers is not None:  # --drivers N: each one's work
            summary.add(drivers_this_invocation=solving.drivers)
        if planned.prices:
            seconds = summary.seconds_this_invocation or 0.0
            summary.add(
                cost_this_invocation=cost_table(fw, usage, run.records, planned.prices, seconds),
                cost_recorded=recorded_cost(
                    fw, recorded_usage(results), run.records, planned.prices, store.dir
                ),
            )
        remaining = len(store.pending(ids))
        budget = solving.budget if solving is not None else None
        if budget is not None and budget.stopped and remaining:
            summary.add(budget_stop=budget.stopped)
        if run.pilot is not None:  # what the rest will ask, from every item recorded so far
            derived = len(planned.items) if plan.items is not None else None
            summary.add(
                estimate_of_the_rest=estimate_from_disk(
                    fw,
                    plan.options,
                    store.dir,
                    run.items,
                    ids,
                    run.records,
                    planned.prices,
                    derived,
                )
            )
        store.write_summary(summary)
        name = fw.tables_file(plan.options)
        if tables is not None and name:
            atomic_write_json(store.dir / name, tables, within=store.dir)
        print_summary(summary, terminal())
        if tables is not None:
            fw.render(tables, terminal())
        if run.pilot is not None:
            label = f"after the pilot, {store.dir}"
            print_estimate(label, summary.estimate_of_the_rest or {}, terminal())
        if summary.budget_stop:
            raise BudgetReached(
                f"{store.dir}: stopped admitting items ({summary.budget_stop}); {remaining} of "
                f"{len(run.items)} items remain: rerun with a higher cap to resume"
            )
        return RunOutcome(store.dir, results, tables, summary, fw)


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
