"""Does the judge's verdict follow the order of two texts? (``agreement RUN --swap-audit K``)

A judge that compares two texts of one kind (two answers to one question) should give the same
relation whichever it reads first. The audit draws K of the run's recorded comparisons (seeded,
among those the model decided: a rule's verdict has no order to follow), asks each again with
the two texts swapped, through the framework's own stage (``Framework.ask_swapped``: the same
prompt, parser, re-asks and cache), maps the answer back to the original order and counts the
flips: a flip is a mapped-back verdict other than the recorded one. The flip rate carries a 95%
bootstrap interval with an item's comparisons resampled together.

Each answer is appended to ``RUN/labels/swap-audit.jsonl`` as it arrives, so a killed audit
asked again with the same K and seed asks only what is missing. An answer that stays
unparseable after the re-asks is recorded and counted as such, never as agreement or a flip,
and asked again by the next audit.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...runtime.contract.context import ItemContext
from ...runtime.contract.results import StageFailed, SwapPair
from ..people.labels import append_labels_to, labels_dir
from .agreement import Unit, by_item_interval

AUDIT = "swap-audit.jsonl"
T = TypeVar("T")


@dataclass(frozen=True)
class Drawn:
    item: str
    pair: SwapPair


def swap_candidates(run: Any) -> list[Drawn]:
    """Every recorded comparison the framework can ask again swapped, in id order."""
    return [Drawn(r.id, pair) for r in run.records for pair in run.framework.swap_pairs(r)]


def draw(candidates: list[T], k: int, seed: int) -> list[T]:
    """K of them at random (all, when there are fewer), in id order."""
    if k >= len(candidates):
        return list(candidates)
    picked = set(random.Random(seed).sample(range(len(candidates)), k))
    return [c for n, c in enumerate(candidates) if n in picked]


def done_before(
    run_dir: Path, name: str = AUDIT, fields: tuple[str, ...] = ("id", "stage", "key")
) -> dict[tuple[str, ...], dict[str, Any]]:
    """The answers an earlier audit recorded in ``labels/NAME``, by ``fields`` (a torn last
    line is left: asked again)."""
    path = labels_dir(run_dir) / name
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed audit: asked again
        out[tuple(str(row.get(f)) for f in fields)] = row
    return out


async def swap_audit(
    run_dir: Path, k: int, seed: int, clients: Any, run: Any = None
) -> dict[str, Any]:
    """Ask K recorded comparisons of ``run_dir`` again with the texts swapped (``clients``:
    one client for every role, or one per role) and measure how often the verdict flips.
    ``run``: the run's ``RunRows``, where the caller has read them."""
    from ..exports.rows import run_rows

    run = run or run_rows(run_dir)
    out: dict[str, Any] = {"run": str(run_dir), "task": run.manifest.task, "seed": seed}
    candidates = swap_candidates(run)
    if not candidates:
        out["note"] = (
            "no recorded judgement of this run compares two texts of one kind that a model "
            "decided (the comprehensiveness Q&A method's answer comparison has them)"
        )
        return out
    drawn = draw(candidates, k, seed)
    earlier = done_before(run_dir)
    # asked again: what no earlier audit answered, and what stayed unparseable (as a run
    # retries its failed items)
    todo = [
        d
        for d in drawn
        if (earlier.get((d.item, d.pair.stage, d.pair.key)) or {}).get("swapped") is None
    ]
    answers = await asyncio.gather(*(_ask(run, d, clients) for d in todo))
    for found in answers:  # already appended one by one; here only to read them back below
        earlier[(found["id"], found["stage"], found["key"])] = found
    rows = [earlier[(d.item, d.pair.stage, d.pair.key)] for d in drawn]
    return out | {"candidates": len(candidates), "asked_now": len(todo)} | flip_summary(rows)


async def _ask(run: Any, drawn: Drawn, clients: Any) -> dict[str, Any]:
    fw, options = run.framework, run.options
    ctx = ItemContext(drawn.item, clients, options, None, run.run_dir, options.max_reasks, fw, None)
    row: dict[str, Any] = {
        "id": drawn.item,
        "stage": drawn.pair.stage,
        "key": drawn.pair.key,
        "original": drawn.pair.verdict,
    }
    try:
        row["swapped"] = await fw.ask_swapped(ctx, drawn.pair)
    except StageFailed as exc:
        row |= {"swapped": None, "unparseable": exc.error, "outputs": exc.outputs}
    append_labels_to(run.run_dir, AUDIT, [row])
    return row


def flip_summary(rows: list[dict[str, Any]], answer: str = "swapped") -> dict[str, Any]:
    """Flips among the answered judgements (``answer``: the field holding the new verdict,
    beside ``original``), the rate's interval with items resampled, and the table of recorded
    against new verdicts (unparseable answers counted apart, neither flip nor agreement)."""
    answered = [r for r in rows if r.get(answer) is not None]
    flips = [r for r in answered if r[answer] != r["original"]]
    units = [
        Unit(r["id"], r["stage"], n, [float(r[answer] != r["original"])])
        for n, r in enumerate(answered)
    ]

    def rate(found):
        return sum(u.values[0] for u in found) / len(found) if found else None

    table = Counter((r["original"], r[answer]) for r in answered)
    return {
        "drawn": len(rows),
        "answered": len(answered),
        "unparseable": len(rows) - len(answered),
        "flips": len(flips),
        "flip_rate": rate(units),
        "flip_rate_ci": by_item_interval(units, rate),
        "items": len({r["id"] for r in answered}),
        "table": [
            {"original": a, answer: b, "count": n}
            for (a, b), n in sorted(table.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
        ],
    }


def render_swap(found: list[dict[str, Any]], out: Any) -> None:
    for run in found:
        out.print(f"swap audit: {run['run']} ({run['task']})", highlight=False, soft_wrap=True)
        if "note" in run:
            out.print(f"  {run['note']}", highlight=False)
            continue
        rate, ci = run["flip_rate"], run["flip_rate_ci"]
        shown = "undefined" if rate is None else f"{rate:.3f}"
        interval = f" (95% CI {ci[0]:.3f} to {ci[1]:.3f}, items resampled)" if ci else ""
        out.print(
            f"  {run['flips']} of {run['answered']} comparisons flip with the texts swapped: "
            f"{shown}{interval}; drawn {run['drawn']} of {run['candidates']} (seed "
            f"{run['seed']}), {run['items']} items, asked now {run['asked_now']}",
            highlight=False,
        )
        if run["unparseable"]:
            out.print(
                f"  {run['unparseable']} swapped answers stayed unparseable: counted apart, "
                "neither flip nor agreement",
                highlight=False,
            )
        for row in run["table"]:
            mark = "" if row["original"] == row["swapped"] else "  (flip)"
            out.print(
                f"  recorded {row['original']!r} -> swapped back {row['swapped']!r}: "
                f"{row['count']}{mark}",
                highlight=False,
            )


# ---- the judge asked again -----------------------------------------------------------------

SAMPLING = ("temperature", "seed", "max_tokens", "reasoning", "reasoning_tokens")
NO_KEY = ""  # no variable has this name: no key is read, none is sent ("EMPTY")


def judge_config(run: Any, stage: str, model: str | None, endpoint: str | None) -> Any:
    """The model that answered ``stage`` in the run, as its manifest records it (``model`` /
    ``endpoint``: another, or the same one moved), with the run's sampling settings."""
    from ...runtime.contract.config import EvaluatorConfig, UserError

    role = run.framework.role_of(stage, "judge")
    recorded = (run.manifest.roles or {}).get(role) or {}
    named_model = model is not None
    config = run.manifest.config
    sampling = (config.get("roles") or {}).get(role) or config
    fields: dict[str, Any] = {k: sampling[k] for k in SAMPLING if sampling.get(k) is not None}
    if model is None:
        model = recorded.get("model") or config.get("model")
        fields["adapter"] = recorded.get("adapter") or config.get("adapter")
        if endpoint is None:  # the same model where it was: known as the run knew it
            fields["content"] = recorded.get("content")
            fields["revision"] = recorded.get("declared_revision")
            fields["sample"] = recorded.get("sample")  # a self-consistency member's
    if endpoint is None:
        # where the run's record says: anyone could have written that, so this machine's key
        # (the --api-key-env variable) is sent only to an endpoint named on the command line
        endpoint, fields["api_key_env"] = recorded.get("endpoint"), NO_KEY
        if not (isinstance(endpoint, str) and endpoint.startswith(("http://", "https://"))):
            if not named_model:  # a model is started here only when the user names it
                raise UserError(
                    f"{run.run_dir}: the run records no endpoint for role {role!r} (its judge "
                    "was started for the run): name where it is served with --endpoint, or "
                    "the model to start here with --model"
                )
            endpoint = None
    if model is None:
        raise UserError(
            f"{run.run_dir}: the manifest names no model for role {role!r}: give --model"
        )
    return EvaluatorConfig.model_validate({"model": model, "endpoint": endpoint} | fields)


def reader_cache(home: Path, endpoint: str | None) -> Path | None:
    """The reader's response cache, for a judge at an endpoint the user named; none for the
    endpoint a run records: anyone could have written that, and its server could answer as
    whatever model the run claims to be, answers the cache would then give the reader's own
    runs of that model. What an audit asked is kept in the run (``labels/``) either way."""
    return home / "responses.sqlite" if endpoint is not None else None


def known_by_content(cfg: Any) -> Any:
    """``cfg`` with its model resolved by content where the manifest's record did not come
    with it (another judge, or one moved): its endpoint is asked for its models first."""
    if cfg.content is not None:
        return cfg
    from ...runtime.execution.model_content import ask_endpoints

    roles, _ = ask_endpoints([{"judge": cfg}], probe=True, tolerate=False)
    return roles[0]["judge"]


def audit_runs(
    run_dir: Sequence[Path], k: int, seed: int, model: str | None, endpoint: str | None
) -> list[dict[str, Any]]:
    """``swap_audit`` of every run under ``run_dir``, each asking the judge its manifest
    records (the reader's response cache only for an endpoint named: ``reader_cache``)."""
    from ....serving.launch.embedded import cache_root
    from ...runtime.execution.models import open_evaluator
    from ...runtime.store.run_dir import run_directories
    from ..exports.rows import run_rows

    async def one(directory: Path) -> dict[str, Any]:
        run = run_rows(directory)
        candidates = swap_candidates(run)
        if not candidates:
            return await swap_audit(directory, k, seed, None)
        cfg = known_by_content(judge_config(run, candidates[0].pair.stage, model, endpoint))
        cache = reader_cache(cache_root(), endpoint)
        async with open_evaluator(cfg, directory, cache) as client:
            return await swap_audit(directory, k, seed, client)

    return [asyncio.run(one(d)) for d in run_directories(run_dir)]
