"""One run spread over the nodes of a Ray cluster (``--drivers N``): N driver actors, one run.

The command that opens the run (its manifest, identity and summary) hands the solving of its
missing items to N Ray actors, the drivers. Driver ``k`` takes the items whose id hashes to
shard ``k`` (``shard_of``: the same item goes to the same shard on every resume with the same
N) and solves them with the same code a run solved in one process uses (``solve_missing``), with
its own clients and NLI handle, appending whole records to its own file in the run directory
(``results.dK.jsonl``). Readers see the union, so ``report``, ``compare`` and the HTML page see
one run, and a resume with any N (1 included) finds everything recorded.

- **Faults.** Ray restarts a driver whose process dies (``RESTARTS`` times) and asks it again:
  it resumes its shard from its records. A command killed whole takes its drivers with it (they
  are owned by its coordinator process) and the same command resumes with the same or another N.
- **Budgets.** ``--max-cost`` / ``--max-run-tokens`` are held by one ledger actor that every
  driver asks before taking an item (``SharedBudget``): one cap over the run, not N.
- **NLI.** A cross-encoder on a Serve app (``--nli-replicas N``) is one app for the run: the
  coordinator deploys it before the drivers start, they score on it by name, and it is deleted
  when they are done (``SharedNli``), so the cluster holds N replicas, not N per driver.
- **Placement.** ``--driver-resources`` places the drivers: one JSON object for all, or a list
  with one per driver (e.g. ``[{"node:10.0.0.1": 0.01}, {"node:10.0.0.2": 0.01}]``); without
  it they are spread over the nodes. An endpoint on 127.0.0.1 is each driver's own node's: the
  Serve proxy there prefers that node's replicas.

The coordinator runs in a ``DriverChild`` (the command itself never joins Ray, so Ray cannot end
it) and reports progress and the drivers' results over its pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....serving.client import EndpointError
from ....serving.cluster.join import Channel, DriverChild, error_line
from ....serving.credentials import held_environment
from ..budget.costs import Budget, Ledger, usage_tokens
from ..contract.config import EvaluatorConfig, UserError
from ..contract.protocol import RunRequest
from ..store.run_dir import RunStore
from .nli_placement import NliPlacement
from .solve import Solved

RESTARTS = 3  # a driver process that dies is restarted this many times, then the run stops
PROGRESS_SECONDS = 1.0  # how often the coordinator reports the drivers' progress
NLI_START_SECONDS = 600.0  # for the drivers' shared NLI app to run (a scorer's own waits as long)
# a driver not started by then cannot be placed (what it asks is held by others): one error
# line, never a wait without end (long enough for an autoscaler to add a node)
DRIVER_START_SECONDS = 600.0


class DriversFailed(EndpointError):
    """A driver failed for good, or the coordinator could not run: the run stops (what the
    drivers recorded is kept; the same command resumes)."""


def shard_of(item_id: str, drivers: int) -> int:
    """The driver (0..drivers-1) that solves ``item_id``: stable across processes and resumes
    (a hash of the id, not Python's salted ``hash``)."""
    digest = hashlib.sha256(item_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % drivers


def shard_counts(ids: list[str], drivers: int) -> list[int]:
    counts = [0] * drivers
    for item_id in ids:
        counts[shard_of(item_id, drivers)] += 1
    return counts


def driver_resources(raw: Any, drivers: int) -> list[dict[str, float]]:
    """Each driver's Ray resources from ``--driver-resources`` (one object for all, or one per
    driver); ``CPU`` among them sets the driver's CPUs (default 1)."""
    if raw is None:
        return [{} for _ in range(drivers)]
    each = raw if isinstance(raw, list) else [raw] * drivers
    if len(each) != drivers:
        raise UserError(
            f"--driver-resources: {len(each)} objects for --drivers {drivers} (give one for "
            "all, or one per driver)"
        )
    return [dict(r) for r in each]


def check_drivers(request: RunRequest, roles: list[dict[str, EvaluatorConfig]]) -> None:
    """Refuse what N drivers cannot do, before anything starts: every driver would start its own
    Serve LLM app of the same model (start it once with ``groundcover serve --replicas``)."""
    if request.run.drivers < 2:
        return
    for found in roles:
        for role, ev in found.items():
            if ev.endpoint is None and (ev.replicas > 1 or ev.ray_address):
                raise UserError(
                    f"--drivers {request.run.drivers}: role {role} would have each driver start "
                    f"its own Ray Serve app of {ev.model}; start it once (groundcover serve "
                    "--replicas N) and give its --endpoint"
                )
    driver_resources(request.run.driver_resources, request.run.drivers)


def spread_over_drivers(request: RunRequest, plan: Any, pilot: int | None) -> bool:
    """Whether a run's items go to driver actors: ``--drivers`` above 1, items the study loads
    itself (a driver rebuilds them), and not a pilot (its K items are solved here)."""
    return request.run.drivers > 1 and plan.items is None and pilot is None


# ---- in a driver ------------------------------------------------------------------------------


@dataclass
class DriverSpec:
    """What driver ``shard`` of ``drivers`` needs to rebuild its part of one run."""

    study: str
    request: RunRequest
    root: str  # absolute: a driver's working directory is the command's (``cwd``)
    plan_key: str
    roles: dict[str, EvaluatorConfig]
    shard: int
    drivers: int
    share: int  # its shard's missing items when the command started
    cache: str | None
    cwd: str
    env: dict[str, str] = field(default_factory=dict)


class RemoteLedger(Ledger):
    """A driver's view of the run's one ``SharedBudget`` actor."""

    wait_seconds = 0.2

    def __init__(self, actor: Any, shard: int, item_cost):
        super().__init__(None)
        self.actor, self.shard, self.item_cost = actor, shard, item_cost

    async def admit(self, now: float) -> bool | None:
        return await self.actor.admit.remote(now, self.shard)

    async def record(self, usage: dict[str, dict[str, Any]]) -> None:
        await self.actor.record.remote(usage_tokens(usage), self.item_cost(usage), self.shard)

    async def release(self) -> None:
        await self.actor.release.remote(self.shard)


class SharedBudget:
    """The run's caps, held once for all its drivers (a Ray actor). It counts each driver's
    items in flight, so a restarted driver gives back what its dead process had admitted."""

    def __init__(self, state: dict[str, Any]):
        self.budget = Budget(**state, item_cost=lambda usage: 0.0)
        self.in_flight: dict[int, int] = {}

    def admit(self, now: float, shard: int) -> bool | None:
        verdict = self.budget.admit(now)
        if verdict:
            self.in_flight[shard] = self.in_flight.get(shard, 0) + 1
        return verdict

    def record(self, tokens: float, cost: float, shard: int) -> None:
        self.budget.record_spend(tokens, cost, new=True)
        self.in_flight[shard] -= 1

    def release(self, shard: int) -> None:
        self.budget.release()
        self.in_flight[shard] -= 1

    def restarted(self, shard: int) -> None:
        self.budget.in_flight -= self.in_flight.pop(shard, 0)

    def stopped(self) -> str | None:
        return self.budget.stopped


class ShardDriver:
    """One driver of a run (a Ray actor): solves the missing items of its shard into its own
    results file. Asked again after a restart, it resumes from what it recorded."""

    def __init__(self) -> None:
        self.items = 0
        self.began = time.monotonic()
        self.cpu = time.process_time()
        self.calls = 0

    def start_clock(self) -> None:
        """Seconds and CPU count from here: the first item (imports and setup come before)."""
        self.began, self.cpu = time.monotonic(), time.process_time()

    async def status(self) -> dict[str, Any]:
        import ray

        seconds = time.monotonic() - self.began
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "items": self.items,
            "calls": self.calls,
            "seconds": round(seconds, 3),
            "cpu_seconds": round(time.process_time() - self.cpu, 3),  # Ray's threads too
        }

    async def solve(self, spec: DriverSpec, ledger: Any) -> dict[str, Any]:
        os.chdir(spec.cwd)  # relative inputs resolve as they did for the command
        os.environ.update(spec.env)  # before anything of ours reads it (no runtime_env agent)
        self.start_clock()
        solved, todo = await solve_shard(spec, ledger, self)
        return await self.status() | {
            "shard": spec.shard,
            "todo": todo,
            "usage": solved.usage,
            "limits": solved.limits,
            "where": solved.where,
            "spread": solved.spread,
        }


async def solve_shard(spec: DriverSpec, ledger: Any, driver: ShardDriver) -> tuple[Solved, int]:
    """The driver's part of the run: the study's plan rebuilt from ``spec``, the shard's
    missing items solved by ``solve_missing``."""
    from ..budget.costs import cost_table, load_prices
    from ..contract.plugins import study as find_study
    from ..store.lines import item_ids, select
    from .identity import evaluator_key, role_records
    from .models import open_evaluator
    from .repeats import repeat_plans
    from .solve import Evaluators, close_resources, solve_missing

    study = find_study(spec.study)
    request = spec.request
    items = study.load(request.options)
    plans = study.plan(request, Path(spec.root))
    if request.run.repeats > 1:
        plans = repeat_plans(study, request, plans)
    plan = next(p for p in plans if p.key == spec.plan_key)
    fw: Any = plan.framework or study
    run_dir = Path(spec.root) / plan.key if plan.key else Path(spec.root)
    store = RunStore(run_dir, shard=f"d{spec.shard}")
    store.attach()
    ids = item_ids(items)
    pending = store.pending(ids)
    mine = [
        k for k, i in enumerate(ids) if i in pending and shard_of(i, spec.drivers) == spec.shard
    ]
    driver.items = max(0, spec.share - len(mine))  # a restarted driver: what it recorded before
    cache = Path(spec.cache) if spec.cache else None
    evaluators = Evaluators(
        # the drivers may be on several hosts: each host writes its own cache file, reads all
        lambda ev, where: open_evaluator(
            ev, where, cache, None, shared_cache=True, driver=(spec.shard, spec.drivers)
        ),
        [{evaluator_key(ev) for ev in spec.roles.values()}],
    )
    records, prices = role_records(fw, spec.roles), load_prices(request.run.prices)
    shared = None
    if ledger is not None:
        await ledger.restarted.remote(spec.shard)
        shared = RemoteLedger(
            ledger, spec.shard, lambda usage: cost_table(fw, usage, records, prices)["total"]
        )

    def done(result) -> None:
        driver.items += 1
        driver.calls += sum(int(u.get("calls", 0)) for u in result.usage.values())

    resources: dict[str, Any] = {}
    try:
        solved = await solve_missing(
            fw,
            plan,
            request,
            spec.roles,
            select(items, mine),
            store,
            evaluators,
            resources,
            Path(spec.root),
            budget=shared,
            show_progress=False,
            total=len(mine),
            done=done,
            began=driver.start_clock,
        )
    finally:
        await evaluators.aclose()
        await asyncio.to_thread(close_resources, resources)
    return solved, len(mine)


# ---- the coordinator (a DriverChild of the command) -------------------------------------------


def coordinate(
    channel: Channel,
    address: str | None,
    specs: list[DriverSpec],
    placement: list[dict[str, float]],
    ledger_state: dict[str, Any] | None,
    nli: SharedNli | None = None,
) -> None:
    """Deploy the drivers' shared NLI app (``nli``), start the drivers and the ledger, report
    progress, end with their results or one error line. Told to stop (or its command gone), it
    ends the drivers, then deletes the app."""
    from ....serving.cluster.join import connect

    try:
        connect(address)
    except Exception as exc:
        channel.say({"error": f"cannot join Ray at {address or 'a local Ray'}: {error_line(exc)}"})
        return
    if nli is None:
        _drive(channel, specs, placement, ledger_state)
        return
    from ....retrieval.nli_serve import delete_app, deploy

    # terminated (the command gave up waiting for a tidy stop): the app is deleted all the same
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        try:
            deploy(nli.name, nli.settings, NLI_START_SECONDS, lambda: _told_to_stop(channel))
        except Exception as exc:
            with contextlib.suppress(OSError):  # called off by a command that is gone
                channel.say({"error": f"the drivers' NLI app: {error_line(exc)}"})
            return
        _drive(channel, specs, placement, ledger_state)
    finally:
        delete_app(nli.name)


def _drive(
    channel: Channel,
    specs: list[DriverSpec],
    placement: list[dict[str, float]],
    ledger_state: dict[str, Any] | None,
) -> None:
    import ray

    if (nowhere := unplaceable(placement, _live_node_resources())) is not None:
        channel.say({"error": nowhere})
        return
    ledger: Any = None
    if ledger_state is not None:
        ledger = ray.remote(SharedBudget).options(num_cpus=0).remote(ledger_state)
    began = time.monotonic()
    actors = [
        _start_driver(spec, resources) for spec, resources in zip(specs, placement, strict=True)
    ]
    calls = {
        actor.solve.remote(spec, ledger): spec.shard
        for actor, spec in zip(actors, specs, strict=True)
    }
    results: dict[int, dict[str, Any]] = {}
    pids: dict[int, set[int]] = {spec.shard: set() for spec in specs}  # a restart: a new one
    last = 0.0
    try:
        while len(results) < len(specs):
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=0.5)
            for ref in ready:
                shard = calls.pop(ref)
                try:
                    results[shard] = ray.get(ref)
                    pids[shard].add(results[shard]["pid"])
                    results[shard]["restarts"] = len(pids[shard]) - 1
                except Exception as exc:
                    channel.say({"error": f"driver {shard}: {_cause(exc)}"})
                    return
            if time.monotonic() - last >= PROGRESS_SECONDS:
                rows = _statuses(actors, results)
                for row in rows:
                    if "pid" in row and row["shard"] not in results:
                        pids[row["shard"]].add(row["pid"])
                channel.say({"progress": rows})
                last = time.monotonic()
                waiting = [k for k in range(len(specs)) if k not in results and not pids[k]]
                if waiting and time.monotonic() - began > DRIVER_START_SECONDS:
                    channel.say({"error": never_started(waiting[0], placement[waiting[0]])})
                    return
            if _told_to_stop(channel):
                return
        stopped = ray.get(ledger.stopped.remote()) if ledger is not None else None
        channel.say({"done": [results[k] for k in range(len(specs))], "budget_stop": stopped})
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


def _start_driver(spec: DriverSpec, resources: dict[str, float]) -> Any:
    import ray

    resources = dict(resources)
    cpus = resources.pop("CPU", 1)
    gpus = resources.pop("GPU", 0)  # Ray takes CPUs and GPUs as options of their own
    options: dict[str, Any] = {
        "num_cpus": cpus,
        **({"num_gpus": gpus} if gpus else {}),
        "max_restarts": RESTARTS,
        "max_task_retries": RESTARTS,
    }
    if resources:
        options["resources"] = resources
    else:
        options["scheduling_strategy"] = "SPREAD"
    return ray.remote(ShardDriver).options(**options).remote()


def _statuses(actors: list[Any], results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each driver's progress now; a driver being restarted answers nothing (None)."""
    import ray

    refs = {k: a.status.remote() for k, a in enumerate(actors) if k not in results}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=2.0)
    out: list[dict[str, Any]] = []
    for k in range(len(actors)):
        if k in results:
            out.append(results[k] | {"finished": True})
        elif refs[k] in ready:
            with contextlib.suppress(Exception):
                out.append(ray.get(refs[k]) | {"shard": k})
                continue
            out.append({"shard": k})
        else:
            out.append({"shard": k})
    return out


def driver_asks(resources: dict[str, float]) -> dict[str, float]:
    """What a driver actor asks Ray for: its resources, with one CPU unless it names its own."""
    return {"CPU": 1.0} | {name: float(amount) for name, amount in resources.items()}


def unplaceable(placement: list[dict[str, float]], nodes: list[dict[str, float]]) -> str | None:
    """One error line for the first driver that no live node could ever hold (a resource no
    node offers, or more of it than any node has), else None: said at once, not waited on (a
    misspelt resource is the usual cause; on an autoscaling cluster, ask for what a live node
    offers, the head's own)."""
    for k, resources in enumerate(placement):
        if negative := [name for name, amount in resources.items() if amount < 0]:
            return f"driver {k}: --driver-resources asks a negative amount of {negative[0]}"
        asks = {name: amount for name, amount in driver_asks(resources).items() if amount > 0}
        if not any(all(node.get(n, 0.0) >= a for n, a in asks.items()) for node in nodes):
            return (
                f"driver {k} asks Ray for {json.dumps(asks, sort_keys=True)}, which no node of "
                f"the cluster has ({len(nodes)} node(s)): fix --driver-resources"
            )
    return None


def never_started(k: int, resources: dict[str, float]) -> str:
    asks = json.dumps(driver_asks(resources), sort_keys=True)
    return (
        f"driver {k} was not started in {DRIVER_START_SECONDS:.0f} s: no node has {asks} free "
        "(other actors, such as Serve's replicas, hold it); give --driver-resources that fit, "
        "e.g. '{\"CPU\": 0}' for drivers that only wait on their endpoints"
    )


def _live_node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def _cause(exc: BaseException) -> str:
    """The driver's own exception in one line (Ray wraps it), or why the actor is gone."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return error_line(cause)
    return error_line(exc)


def _told_to_stop(channel: Channel) -> bool:
    try:
        if not channel.conn.poll(0):
            return False
        message = channel.conn.recv_bytes()
    except (EOFError, OSError):  # the command is gone
        return True
    return b'"stop"' in message


# ---- the command's side -----------------------------------------------------------------------


@dataclass
class SharedNli:
    """One Serve app of the run's NLI replicas that every driver scores on: the command's
    coordinator deploys it before the drivers start and deletes it when they are done (without
    it, each driver would deploy ``--nli-replicas`` of its own)."""

    name: str
    settings: dict[str, Any]

    @classmethod
    def of(cls, request: RunRequest) -> SharedNli | None:
        options = request.options
        if not isinstance(options, NliPlacement):
            return None
        settings = options.serve_app_settings()
        if settings is None:
            return None
        return cls(f"groundcover-nli-{uuid.uuid4().hex[:8]}", settings)

    def request_for_drivers(self, request: RunRequest) -> RunRequest:
        return dataclasses.replace(request, options=request.options.on_app(self.name))


@dataclass
class DriverRun:
    """What N drivers did this invocation: merged for the run's summary, and per driver."""

    solved: Solved
    drivers: list[dict[str, Any]]
    budget_stop: str | None


def passed_env(roles: dict[str, EvaluatorConfig]) -> dict[str, str]:
    """The environment a driver on another node needs: groundcover's own settings, the
    evaluators' API keys and endpoints' credentials, and the hub's offline switches (never the
    whole environment)."""
    names = {ev.api_key_env for ev in roles.values()}
    passed = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("GROUNDCOVER_", "HF_")) or k in names or k == "PYTHONPATH"
    }
    return passed | held_environment()  # endpoints' user-info, held in memory here


async def solve_on_drivers(
    study_name: str,
    request: RunRequest,
    plan_key: str,
    roles: dict[str, EvaluatorConfig],
    root: Path,
    store: RunStore,
    pending: list[str],
    *,
    budget: Budget | None,
    cache: Path | None,
    show_progress: bool,
) -> DriverRun:
    """Solve the run's ``pending`` items on ``request.run.drivers`` driver actors and wait for
    them, showing each driver's progress; then merge what they report."""
    n = request.run.drivers
    env = passed_env(roles)
    shares = shard_counts(pending, n)
    nli = SharedNli.of(request)
    specs = [
        DriverSpec(
            study=study_name,
            request=nli.request_for_drivers(request) if nli else request,
            root=str(root.resolve()),
            plan_key=plan_key,
            roles=roles,
            shard=k,
            drivers=n,
            share=shares[k],
            cache=str(cache.resolve()) if cache else None,
            cwd=os.getcwd(),
            env=env,
        )
        for k in range(n)
    ]
    placement = driver_resources(request.run.driver_resources, n)
    state = budget.state() if budget is not None else None
    args = (request.evaluator.ray_address, specs, placement, state, nli)
    child = DriverChild(coordinate, args, "groundcover-drivers")
    try:
        with DriverProgress(shares, len(pending), show_progress) as progress:
            while True:
                got = await asyncio.to_thread(child.receive, 1.0)
                if got is None:
                    if not child.alive():
                        raise DriversFailed(
                            f"{store.dir}: the drivers' coordinator stopped: {child.ended()}; "
                            "the run directory is resumable"
                        )
                    continue
                message = got[0]
                if "error" in message:
                    raise DriversFailed(
                        f"{store.dir}: {message['error']}; the run directory is resumable"
                    )
                if "progress" in message:
                    progress.update(message["progress"])
                if "done" in message:
                    progress.update([r | {"finished": True} for r in message["done"]])
                    return merged(message["done"], message.get("budget_stop"))
    finally:
        child.stop(tidy=True, wait=30)


def merged(results: list[dict[str, Any]], budget_stop: str | None) -> DriverRun:
    usage: dict[str, dict[str, Any]] = {}
    limits: dict[str, dict[str, Any]] = {}
    spread: dict[str, list[dict[str, Any]]] = {}
    places = []
    rows = []
    for result in results:
        k = result["shard"]
        for stage, delta in result["usage"].items():
            into = usage.setdefault(stage, dict.fromkeys(delta, 0))
            for key, value in delta.items():
                into[key] = round(into.get(key, 0) + value, 6)
        for role, report in result["limits"].items():
            limits[f"{role} (driver {k})"] = report
        for model, replicas in result["spread"].items():
            spread.setdefault(model, []).extend(replicas)
        if result["where"] is not None:
            places.append({"driver": k} | result["where"])
        seconds = result["seconds"] or 0.0
        rows.append(
            {
                "driver": k,
                "node": result["node"],
                "ip": result["ip"],
                "pid": result["pid"],
                "items": result["items"],
                "solved_by_last_process": result["todo"],
                "calls": result["calls"],
                "seconds": seconds,
                "cpu_seconds": result["cpu_seconds"],
                "calls_per_s": round(result["calls"] / seconds, 2) if seconds else None,
                "restarts": result.get("restarts", 0),
            }
        )
    where = {"drivers": places} if places else None
    return DriverRun(Solved(usage, limits, spread, where), rows, budget_stop)


class DriverProgress:
    """One progress bar per driver: its node, items done of its shard, calls/s."""

    def __init__(self, shares: list[int], total: int, show: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        from .solve import console

        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            "{task.fields[rate]}",
            TimeElapsedColumn(),
            disable=not show,
            transient=True,
            console=console,
        )
        self.bars = [
            self.progress.add_task(f"driver {k}", total=share, rate="")
            for k, share in enumerate(shares)
        ]

    def __enter__(self) -> DriverProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def update(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if "items" not in row:
                continue
            seconds = row.get("seconds") or 0.0
            rate = f"{row['calls'] / seconds:.1f} calls/s" if seconds else ""
            self.progress.update(
                self.bars[row["shard"]],
                completed=row["items"],
                description=f"driver {row['shard']} @ {row['ip']}",
                rate=rate,
            )
