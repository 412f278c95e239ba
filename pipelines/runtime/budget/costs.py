"""Dollars and budgets: what a run's model usage costs, and the cap that stops admitting items.

A prices file (YAML) maps a model name to its price::

    gpt-4o-mini: {input: 0.15, output: 0.60}     # $ per million prompt / completion tokens
    gpt-4.1: {input: 2.0, output: 8.0, batch_input: 1.0, batch_output: 4.0}  # and as batches
    llama-3.1-8b: {gpu_hour: 2.40, gpus: 1}       # a model we serve: $ per GPU-hour

A role bought as batch jobs (``transport: batch``) pays the batch prices where the file gives
them (else the online ones); the table then says what the same tokens cost online (``online``)
and the difference (``saving``).

A model is found by the name a role was given (``--model``, ``--role``), else by the name
requests carry, else by its hub id. Token prices apply to every call's tokens, cached calls
included: the cost of the records, the same however often the run was resumed (the cache makes
the money actually spent lower; ``cache_hits`` says by how much). A GPU-hour price applies to the
wall time of the invocations that had the model open, shared out over its stages by tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from ..contract.config import Strict, UserError
from ..contract.readers import describe_validation, read_text


class ModelPrice(Strict):
    input: float | None = Field(None, ge=0, description="$ per million prompt tokens")
    output: float | None = Field(None, ge=0, description="$ per million completion tokens")
    gpu_hour: float | None = Field(None, ge=0, description="$ per GPU-hour (a served model)")
    gpus: int = Field(1, ge=1, description="GPUs the served model holds")
    batch_input: float | None = Field(None, ge=0, description="$ per million, in a batch job")
    batch_output: float | None = Field(None, ge=0, description="$ per million, in a batch job")

    @model_validator(mode="after")
    def _one_kind(self) -> ModelPrice:
        tokens = self.input is not None or self.output is not None
        if tokens == (self.gpu_hour is not None):
            raise ValueError("give input and output ($ per million tokens) or gpu_hour")
        if tokens and (self.input is None or self.output is None):
            raise ValueError("a token price needs both input and output")
        return self

    def tokens(self, prompt: float, completion: float, batch: bool = False) -> float:
        if self.gpu_hour is not None:
            return 0.0
        per_input, per_output = self.input or 0, self.output or 0
        if batch and self.batch_input is not None:
            per_input = self.batch_input
        if batch and self.batch_output is not None:
            per_output = self.batch_output
        return (prompt * per_input + completion * per_output) / 1e6

    def hours(self, seconds: float) -> float:
        return (self.gpu_hour or 0) * self.gpus * seconds / 3600


def load_prices(path: Path | None) -> dict[str, ModelPrice]:
    """The prices file, or one line naming the file, the model and the field."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(read_text(path)) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must map model names to prices")
    prices = {}
    for name, value in data.items():
        try:
            prices[str(name)] = ModelPrice.model_validate(value)
        except ValidationError as exc:
            raise UserError(f"{path}: model {name}: {describe_validation(exc)}") from exc
    return prices


def price_of(prices: dict[str, ModelPrice], record: dict[str, Any]) -> ModelPrice | None:
    """The price of a role's model (its manifest record): by given name, request name, hub id."""
    for key in ("model", "request_model", "hub_id"):
        name = record.get(key)
        if name and name in prices:
            return prices[name]
    return None


def cost_table(
    fw: Any,
    usage: dict[str, dict[str, Any]],
    roles: dict[str, dict[str, Any]],
    prices: dict[str, ModelPrice],
    seconds: float = 0.0,
) -> dict[str, Any]:
    """Dollars per stage and per role for ``usage`` (per stage), and their total. ``seconds``:
    wall time the models were open (GPU-hour prices). Stages of a role without a price are
    listed under ``unpriced``, never counted as free."""
    by_stage: dict[str, float] = {}
    unpriced: set[str] = set()
    hourly: dict[str, tuple[ModelPrice, list[str]]] = {}  # served model -> price, its stages
    online = 0.0  # what the batch-bought stages' tokens would have cost online, beyond
    for stage, u in usage.items():
        role = fw.role_of(stage, "unknown")
        record = roles.get(role)
        if record is None:  # not a model stage (a cross-encoder), or an unknown role
            continue
        price = price_of(prices, record)
        if price is None:
            unpriced.add(record.get("request_model") or record.get("model") or role)
        elif price.gpu_hour is not None:  # GPU time is shared by the model's stages
            hourly.setdefault(record.get("request_model") or role, (price, []))[1].append(stage)
        else:
            prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
            batch = record.get("transport") == "batch"
            by_stage[stage] = price.tokens(prompt, completion, batch)
            if batch:  # a failed line asked again online is priced online
                asked_p = u.get("online_prompt_tokens", 0)
                asked_c = u.get("online_completion_tokens", 0)
                by_stage[stage] = price.tokens(prompt - asked_p, completion - asked_c, True)
                by_stage[stage] += price.tokens(asked_p, asked_c)
                online += price.tokens(prompt, completion) - by_stage[stage]
    for price, stages in hourly.values():
        tokens = {
            s: usage[s].get("prompt_tokens", 0) + usage[s].get("completion_tokens", 0)
            for s in stages
        }
        weight = sum(tokens.values())
        for s in stages:
            share = tokens[s] / weight if weight else 1 / len(stages)
            by_stage[s] = price.hours(seconds) * share
    by_role: dict[str, float] = {}
    for stage, dollars in by_stage.items():
        role = fw.role_of(stage, "unknown")
        by_role[role] = by_role.get(role, 0.0) + dollars
    table = {
        "by_stage": {s: round(v, 6) for s, v in by_stage.items()},
        "by_role": {r: round(v, 6) for r, v in by_role.items()},
        "total": round(sum(by_stage.values()), 6),
        "unpriced": sorted(unpriced),
    }
    if any(r.get("transport") == "batch" for r in roles.values()):
        table["online"] = round(sum(by_stage.values()) + online, 6)
        table["saving"] = round(online, 6)
    return table


def hourly_rate(roles: dict[str, dict[str, Any]], prices: dict[str, ModelPrice]) -> float:
    """Dollars per second of the distinct GPU-hour-priced models the roles use (one server
    each)."""
    found = {r.get("request_model"): price_of(prices, r) for r in roles.values()}
    return sum(p.hours(1.0) for p in found.values() if p is not None and p.gpu_hour is not None)


def require_prices(runs: list[dict[str, dict[str, Any]]], prices: dict[str, ModelPrice]) -> None:
    """A dollar cap needs the price of every model the runs (their role records) ask: one
    line naming the first model without one."""
    for roles in runs:
        for role, record in roles.items():
            if record["stages"] and price_of(prices, record) is None:
                raise UserError(
                    f"--max-cost: no price for {record['model']} (role {role}); "
                    "add it to the --prices file"
                )


# ---- budgets -----------------------------------------------------------------------------------


def open_budget(request: Any, fw: Any, records, prices, store: Any, ids: list[str]):
    """The run's caps with what its recorded items already spent (None without a cap)."""
    import time

    from ..store.run_dir import invocation_seconds

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


class BudgetReached(Exception):
    """A cap stopped admitting items: what was solved is recorded, the run is partial."""


@dataclass
class Budget:
    """Caps on the tokens and dollars of one run's records. An item is admitted only when what
    was spent, plus what the items in flight may still spend, plus what the next item may
    spend (the most any recorded item spent) stays within every cap; until an item has been
    recorded, items are admitted one at a time. Items in flight always finish: a cap stops
    admission, never an item, so the run keeps whole records only."""

    max_tokens: int | None
    max_cost: float | None
    item_cost: Callable[[dict[str, dict[str, Any]]], float]  # one item's dollars (tokens)
    hourly_rate: float = 0.0  # $ per second of the models with GPU-hour prices
    spent_tokens: float = 0.0
    spent_cost: float = 0.0
    peak_tokens: float = 0.0
    peak_cost: float = 0.0
    seen: int = 0  # items recorded
    in_flight: int = 0
    stopped: str | None = None  # why admission stopped
    clock_start: float = 0.0  # this invocation's start (GPU time)
    prior_seconds: float = 0.0  # GPU time of earlier invocations
    solved_now: int = 0

    @property
    def active(self) -> bool:
        return self.max_tokens is not None or self.max_cost is not None

    def record(self, usage: dict[str, dict[str, Any]], *, new: bool) -> None:
        """One recorded item's usage (``new``: solved by this invocation)."""
        self.record_spend(usage_tokens(usage), self.item_cost(usage), new=new)

    def record_spend(self, tokens: float, cost: float, *, new: bool) -> None:
        """One recorded item's tokens and dollars (a driver of a shared ledger sends these)."""
        self.spent_tokens += tokens
        self.spent_cost += cost
        self.peak_tokens = max(self.peak_tokens, tokens)
        self.peak_cost = max(self.peak_cost, cost)
        self.seen += 1
        if new:
            self.in_flight -= 1
            self.solved_now += 1

    def gpu_cost(self, now: float) -> tuple[float, float]:
        """GPU dollars spent so far, and what one more item adds (its share of wall time)."""
        if not self.hourly_rate:
            return 0.0, 0.0
        elapsed = max(0.0, now - self.clock_start)
        per_item = elapsed / self.solved_now if self.solved_now else 0.0
        return self.hourly_rate * (self.prior_seconds + elapsed), self.hourly_rate * per_item

    def admit(self, now: float) -> bool | None:
        """True: take the next item. None: wait for an item in flight to finish (what it
        spends decides). False: stop admitting (``stopped`` says why)."""
        if not self.active:
            return True
        if self.stopped:
            return False
        if self.seen == 0 and self.in_flight:  # nothing known yet: learn from one item
            return None
        ahead = self.in_flight + 1
        tokens = self.spent_tokens + ahead * self.peak_tokens
        gpu_spent, gpu_next = self.gpu_cost(now)
        cost = self.spent_cost + ahead * self.peak_cost + gpu_spent + gpu_next
        why = None
        if self.max_tokens is not None and tokens > self.max_tokens:
            why = (
                f"--max-run-tokens {self.max_tokens}: {round(self.spent_tokens)} tokens "
                f"recorded, the next item may take {round(self.peak_tokens)}"
            )
        elif self.max_cost is not None and cost > self.max_cost + 1e-12:
            why = (
                f"--max-cost {self.max_cost:g}: ${self.spent_cost + gpu_spent:.4f} spent, "
                f"the next item may cost ${self.peak_cost + gpu_next:.4f}"
            )
        if why is None:
            self.in_flight += 1
            return True
        if self.in_flight:  # what those spend may leave room for this one
            return None
        self.stopped = why
        return False

    def release(self) -> None:
        """An admitted worker found no item left."""
        self.in_flight -= 1

    def state(self) -> dict[str, Any]:
        """What the budget knows, less its cost function: to rebuild it as a shared ledger."""
        return {k: v for k, v in asdict(self).items() if k != "item_cost"}


def usage_tokens(usage: dict[str, dict[str, Any]]) -> float:
    """An item's prompt and completion tokens over its stages."""
    return sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usage.values())


class Ledger:
    """How ``run_items`` asks a budget: this process's own ``Budget`` here; the drivers of one
    run share one in a Ray actor (``execution.drivers``), behind the same four calls."""

    wait_seconds: float | None = None  # None: admission changes only when an item here ends

    def __init__(self, budget: Budget | None):
        self.budget = budget or Budget(None, None, lambda usage: 0.0)

    async def admit(self, now: float) -> bool | None:
        return self.budget.admit(now)

    async def record(self, usage: dict[str, dict[str, Any]]) -> None:
        self.budget.record(usage, new=True)

    async def release(self) -> None:
        self.budget.release()
