"""What a run will still ask, before it asks it (``--dry-run``, ``--pilot K``).

Per stage (and its role), over the items a run has not recorded yet:

- **calls known exactly**: what the items fix before any model output
  (``Framework.known_calls``: one coverage call per item, one summary per context...), re-asks of
  an unparseable output not counted; items already recorded cost nothing more (the run store is
  consulted, and it is what a resumed run reads);
- **calls and tokens estimated** from the items recorded so far (an earlier invocation, or a
  pilot): the per-item counts of the recorded items, extrapolated to the missing ones, with a
  95% bootstrap prediction interval for the total (the recorded items resampled, then the
  missing items drawn from each resample: the uncertainty of the mean and the item-to-item
  spread both count);
- dollars (with ``--prices``) and wall time (at the throughput the recorded invocations had).

Nothing here starts a model or writes a file.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from ..contract.context import ItemContext
from ..contract.panels import member_name, panel_members
from ..contract.protocol import Framework
from ..contract.results import ItemResult, StageFailed
from ..execution.models import NotCached
from .costs import cost_table

RESAMPLES = 2000
# reasoning tokens are part of the completion tokens, estimated apart to show what reasoning costs
TOKENS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")


def predict_total(observed: list[float], n: int, seed: int = 0) -> tuple[float, float, float]:
    """The expected sum of ``n`` more items like ``observed``, and its 95% prediction
    interval: a bootstrap resample of ``observed`` per round, then ``n`` draws from it (their
    sum from the resample's mean and spread when ``n`` is large)."""
    if n == 0:
        return 0.0, 0.0, 0.0
    data = np.asarray(observed, dtype=float)
    rng = np.random.default_rng(seed)
    boot = data[rng.integers(0, data.size, (RESAMPLES, data.size))]
    if n * RESAMPLES <= 2_000_000:
        picks = rng.integers(0, data.size, (RESAMPLES, n))
        sums = np.take_along_axis(boot, picks, axis=1).sum(axis=1)
    else:  # the sum of n draws is normal to a very good approximation
        sums = n * boot.mean(axis=1) + np.sqrt(n) * boot.std(axis=1) * rng.standard_normal(
            RESAMPLES
        )
    low, high = np.percentile(sums, [2.5, 97.5])
    return float(n * data.mean()), float(max(0.0, low)), float(high)


@dataclass
class StageEstimate:
    stage: str
    role: str
    cached_calls: int  # of missing items the response cache answers wholly: no request
    cached_tokens: dict[str, int]  # their prompt / completion tokens, exact
    exact_calls: int  # fixed by the other missing items alone
    fixed_items: int  # other missing items whose calls of this stage are fixed
    calls: tuple[float, ...] | None  # estimate (point, low, high) beyond those
    tokens: dict[str, tuple[float, ...]] | None  # totals (point, low, high), cached included
    # retried attempts the rest will likely need, at the recorded items' rate (the server's
    # faults so far), and the seconds waited before them
    retries: tuple[float, ...] | None = None
    backoff_seconds: tuple[float, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def member_stages(fw: Framework[Any, Any], stage: str, roles: dict[str, Any]) -> list[str]:
    """``stage`` as each member of a judge panel asks it (the stage alone without a panel)."""
    if fw.panel_rule(stage) is None:
        return [stage]
    members = panel_members(fw.role_of(stage, "unknown"), list(roles))
    return [member_name(stage, k) for k in range(1, max(len(members), 1) + 1)]


def _plus(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def estimate_run(
    fw: Framework[Any, Any],
    options: BaseModel,
    missing: Iterable[Any],
    n_missing: int,
    recorded: list[ItemResult],
    recorded_items: Iterable[Any] | None,
    *,
    roles: dict[str, dict[str, Any]],
    prices: dict[str, Any],
    throughput: float | None,
    cached: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The estimate of one run for its ``missing`` items, from the ``recorded`` ones (and the
    items they answer, ``recorded_items``, whose fixed calls tell the re-asks apart). Missing
    items the response cache answers wholly (``cached``: id -> usage of the replay) are
    exact and ask no server."""
    cached = cached or {}
    exact: dict[str, int] = {}
    fixed: dict[str, int] = {}
    for item in missing:
        if str(item.id) in cached:
            continue
        for stage, n in fw.known_calls(item, options).items():
            for asked in member_stages(fw, stage, roles):  # each panel member asks it too
                exact[asked] = exact.get(asked, 0) + n
                fixed[asked] = fixed.get(asked, 0) + 1
    from_cache: dict[str, dict[str, int]] = {}
    for usage in cached.values():
        for stage, u in usage.items():
            into = from_cache.setdefault(stage, dict.fromkeys(("calls", *TOKENS), 0))
            for key in into:
                into[key] += u.get(key, 0)
    n_rest = n_missing - len(cached)
    known_before = [
        {
            asked: n
            for stage, n in fw.known_calls(i, options).items()
            for asked in member_stages(fw, stage, roles)
        }
        for i in recorded_items or []
    ]
    stages = list(dict.fromkeys([*from_cache, *exact, *(s for r in recorded for s in r.usage)]))
    out = []
    for k, stage in enumerate(stages):
        per_item = [r.usage.get(stage, {}) for r in recorded]
        hits = from_cache.get(stage, dict.fromkeys(("calls", *TOKENS), 0))
        exact_tokens: dict[str, tuple[float, ...]] = {t: (float(hits[t]),) * 3 for t in TOKENS}
        calls: tuple[float, ...] | None = (0.0, 0.0, 0.0) if n_rest == 0 else None
        tokens: dict[str, tuple[float, ...]] | None = exact_tokens if n_rest == 0 else None
        if recorded:
            observed = [u.get("calls", 0) for u in per_item]
            # items whose calls are fixed: only the re-asks beyond them are estimated
            pairs = zip(observed, known_before, strict=True) if known_before else []
            extra = [c - known.get(stage, 0) for c, known in pairs]
            more = predict_total(extra, fixed.get(stage, 0), seed=k) if extra else (0, 0, 0)
            rest = predict_total(observed, n_rest - fixed.get(stage, 0), seed=k)
            calls = _plus(more, rest)
            tokens = {
                t: _plus(
                    exact_tokens[t], predict_total([u.get(t, 0) for u in per_item], n_rest, seed=k)
                )
                for t in TOKENS
            }
        retries = backoff = None
        if recorded and n_rest:
            retries = predict_total([u.get("retries", 0) for u in per_item], n_rest, seed=k)
            waits = [u.get("backoff_seconds", 0) for u in per_item]
            backoff = predict_total(waits, n_rest, seed=k)
        out.append(
            StageEstimate(
                stage,
                fw.role_of(stage, "unknown"),
                hits["calls"],
                {t: hits[t] for t in TOKENS},
                exact.get(stage, 0),
                fixed.get(stage, 0),
                calls,
                tokens,
                retries,
                backoff,
            )
        )
    result: dict[str, Any] = {
        "missing": n_missing,
        "cached_items": len(cached),
        "recorded": len(recorded),
        "stages": [s.as_dict() for s in out],
        "seconds": n_rest / throughput if throughput else None,
    }
    batched = [s.stage for s in out if (roles.get(s.role) or {}).get("transport") == "batch"]
    if batched and n_rest:  # each stage's calls wait on the one before: a round per stage
        result["batch_rounds"] = len(batched)
    if prices and all(s.tokens for s in out) and out:
        result["cost"] = {
            bound: cost_table(fw, _usage_at(out, i), roles, prices, result["seconds"] or 0.0)
            for i, bound in enumerate(("estimate", "low", "high"))
        }
    return result


def _usage_at(stages: list[StageEstimate], i: int) -> dict[str, dict[str, float]]:
    """Per-stage usage at one bound of the estimates (0 point, 1 low, 2 high)."""
    return {s.stage: {t: s.tokens[t][i] for t in TOKENS} for s in stages if s.tokens}


# ---- the response cache ------------------------------------------------------------------------


async def replay_cached(
    fw: Framework[Any, Any],
    items: Iterable[Any],
    options: BaseModel,
    clients: dict[str, Any],
    resources: Any,
    max_reasks: int,
    width: int = 64,
    judging: dict[str, Any] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per item the response cache answers wholly (every request it makes is cached), the
    usage of solving it; an item with a request the cache has not seen is left out. Files a
    framework writes while solving go to a directory deleted afterwards. ``judging``: how the
    run's contexts judge (``solve.judging_context``), as the run sets it."""
    answered: dict[str, dict[str, dict[str, Any]]] = {}
    gate = asyncio.Semaphore(width)
    answers = fw.given_answers(options)
    with tempfile.TemporaryDirectory(prefix="groundcover-dry-") as scratch:

        async def one(item: Any) -> None:
            ctx = ItemContext(
                str(item.id),
                clients,
                options,
                resources,
                Path(scratch),
                max_reasks,
                fw,
                answers,
                **(judging or {}),  # a cascade, the confidence, the wordings: as the run asks
            )
            async with gate:
                try:
                    await fw.solve(item, ctx)
                except NotCached:
                    return
                except StageFailed:  # cached outputs that stay unparseable: recorded as such
                    pass
            answered[str(item.id)] = ctx.usage()

        await asyncio.gather(*(one(item) for item in items))
    return answered


# ---- printing ----------------------------------------------------------------------------------


def _triple(value: tuple[float, ...] | None, exact: int = 0) -> str:
    if value is None:
        return "?"
    point, low, high = (exact + v for v in value)
    return f"{point:,.0f} ({low:,.0f}-{high:,.0f})"


def _calls(stage: dict[str, Any], rest: int) -> str:
    """All calls of a stage: the cache's, those the items fix, and the estimate of the rest."""
    known = stage["cached_calls"] + stage["exact_calls"]
    no_more = stage["calls"] is None or stage["calls"][2] == 0  # (re-asks not counted)
    if stage["fixed_items"] == rest and no_more:
        return f"{known:,} (exact)"
    if stage["calls"] is None:
        return f"{known:,} + ?" if known else "?"
    return _triple(stage["calls"], known)


def _retries(stage: dict[str, Any]) -> str:
    retries, waits = stage.get("retries"), stage.get("backoff_seconds")
    if not retries:
        return "-"
    return f"{_triple(retries)} ({waits[0]:,.0f} s)" if waits else _triple(retries)


def print_estimate(label: str, estimate: dict[str, Any], out: Console) -> None:
    title = (
        f"{label}: {estimate['missing']} items to solve"
        + (
            f", {estimate['cached_items']} of them answered by the response cache"
            if estimate.get("cached_items")
            else ""
        )
        + f"; estimated from {estimate['recorded']} recorded"
    )
    if not estimate["stages"]:
        out.print(f"{title}: which stages it asks is known once an item is recorded")
        return
    rest = estimate["missing"] - estimate.get("cached_items", 0)
    reasons = any(
        (s["tokens"] or {}).get("reasoning_tokens", (0,))[-1]
        or s["cached_tokens"].get("reasoning_tokens")
        for s in estimate["stages"]
    )
    retried = any((s.get("retries") or (0,))[-1] for s in estimate["stages"])
    table = Table(
        "stage",
        "role",
        "calls from the cache",
        "calls fixed by the items",
        "calls (95% PI)",
        "prompt tokens",
        "completion tokens",
        *(["of which reasoning"] if reasons else []),
        *(["retries (backoff s)"] if retried else []),
        title=title,
    )
    for s in estimate["stages"]:
        tokens = s["tokens"] or {}
        fixed = f"{s['exact_calls']:,} in {s['fixed_items']:,} items" if s["fixed_items"] else "-"
        table.add_row(
            s["stage"],
            s["role"],
            f"{s['cached_calls']:,}",
            fixed,
            _calls(s, rest),
            _triple(tokens.get("prompt_tokens")),
            _triple(tokens.get("completion_tokens")),
            *([_triple(tokens.get("reasoning_tokens"))] if reasons else []),
            *([_retries(s)] if retried else []),
        )
    out.print(table)
    if not estimate["recorded"] and rest:
        out.print(
            "no item recorded yet: calls not fixed by the items and every token count are "
            "unknown; --pilot K solves K items for real and estimates the rest"
        )
    if estimate.get("cost"):
        cost = estimate["cost"]
        out.print(
            f"cost ${cost['estimate']['total']:.4f} (95% PI ${cost['low']['total']:.4f}-"
            f"${cost['high']['total']:.4f})"
            + (
                f"; no price for {', '.join(cost['estimate']['unpriced'])}"
                if cost["estimate"]["unpriced"]
                else ""
            )
        )
    if estimate.get("cost") and "saving" in estimate["cost"]["estimate"]:
        cost = estimate["cost"]["estimate"]
        out.print(
            f"as batch jobs: ${cost['total']:.4f} at the batch prices, ${cost['online']:.4f} "
            f"online (saving ${cost['saving']:.4f})"
        )
    if estimate.get("batch_rounds"):
        out.print(
            f"batch rounds: at least {estimate['batch_rounds']} (one per stage bought as batch "
            "jobs; failed lines add rounds), each waiting for its batch to end"
        )
    if estimate["seconds"] is not None:
        out.print(f"wall time about {estimate['seconds'] / 60:.1f} min at the recorded throughput")
