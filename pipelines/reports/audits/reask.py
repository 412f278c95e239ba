"""Is the judge's verdict its own? Recorded judgements asked again (``agreement RUN --rerun K``
and ``--paraphrase K``).

- **Self-consistency** (``--rerun K``): K of the run's recorded judgements (``Framework.
  judgements``, seeded) asked once more of the same judge at its recorded sampling settings,
  through the framework's own stage (``Framework.ask_judgement``: the same prompt, parser,
  constraint and re-asks). The response cache is bypassed for these requests only: each is keyed
  as a rerun sample of its own (``EvalClient.sample``), so the recorded answer is not read back
  and the rerun's is kept apart from it. A flip is an answer other than the recorded one.
- **Rubric wording** (``--paraphrase K``): K recorded judgements asked with each paraphrase the
  framework declares for the stage's prompt (``Framework.paraphrases``: the same values, output
  format and scale in other words); flips per paraphrase.

In a panel run every member is asked, each against its own recorded answer (found in the
item's ``details["panel"]`` by the digest of the values the prompt was rendered with), and the
flips are given per member. In a cascade run (``--cascade``) every member of each tier the
judgement went to is asked, against its answer in ``details["cascade"]``: a member the cascade
never asked (its tier was not reached) has nothing to flip, and an NLI model's tier is no judge.
Each rate carries a 95% bootstrap interval with an item's judgements resampled together; a
numeric verdict (a rating) also gets the mean absolute change. Answers are appended to
``RUN/labels/rerun-audit.jsonl`` / ``paraphrase-audit.jsonl`` as they arrive, so a killed audit
asked again with the same K and seed asks only what is missing; an answer that stays
unparseable is recorded and counted apart (never a flip or an agreement) and asked again by the
next audit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...runtime.contract.cascade import tier_numbers
from ...runtime.contract.context import ItemContext
from ...runtime.contract.panels import asked_digest, panel_members, split_member
from ...runtime.contract.results import Judgement, StageFailed
from ..people.labels import append_labels_to
from .swap import (
    done_before,
    draw,
    flip_summary,
    judge_config,
    known_by_content,
    reader_cache,
)

RERUN = "rerun-audit.jsonl"
PARAPHRASE = "paraphrase-audit.jsonl"
Kind = Literal["rerun", "paraphrase"]
FILES: dict[str, str] = {"rerun": RERUN, "paraphrase": PARAPHRASE}
KEY = ("id", "stage", "key", "member", "variant")


@dataclass(frozen=True)
class Recorded:
    """One recorded judgement of an item, with the answer each judge gave it (one judge: the
    role itself; a panel: each member that answered)."""

    item: str
    judgement: Judgement
    members: dict[str, Any]  # member role -> its recorded answer


def recorded_judgements(run: Any) -> list[Recorded]:
    """Every recorded judgement the framework can ask again, in id order (none when the run's
    inputs no longer hold what it read: its prompts cannot be rendered again)."""
    fw, options = run.framework, run.options
    if run.items is None:
        return []
    roles = list(run.manifest.roles or {})
    tiers = cascade_tiers(run.manifest.config.get("cascade"))
    found = []
    for record in run.records:
        item = run.items.get(record.id)
        if item is None:
            continue
        entries = {  # (stage, digest of what it asked) -> member number -> its answer
            (e["stage"], e["asked"]): dict(enumerate(e["members"], start=1))
            for e in record.details.get("panel") or []
            if "asked" in e
        }
        cascaded = {
            (e["stage"], e["asked"]): tier_answers(e, tiers)
            for e in record.details.get("cascade") or []
            if "asked" in e
        }
        for judgement in fw.judgements(item, record, options):
            role = fw.role_of(judgement.stage, "judge")
            members = panel_members(role, roles) or [role]
            asked = (judgement.stage, asked_digest(judgement.values))
            if asked in cascaded:  # each tier's members that were asked: never the kept verdict
                given = cascaded[asked]
            elif len(members) == 1:
                given = {1: judgement.verdict}
            elif asked in entries:
                given = entries[asked]
            else:  # a record made before panels kept the digest
                continue
            answers = {
                members[n - 1]: v for n, v in given.items() if v is not None and n <= len(members)
            }
            if answers:
                found.append(Recorded(record.id, judgement, answers))
    return found


def cascade_tiers(made: Any) -> list[list[int]]:
    """The member numbers of each tier of the run's cascade (as its manifest records the
    calibration: its tiers' sizes, and an NLI model as tier 1); [] for a run without one."""
    if not isinstance(made, dict):
        return []
    return tier_numbers(list(made.get("tiers") or []), made.get("nli_model") is not None)


def tier_answers(entry: dict[str, Any], tiers: list[list[int]]) -> dict[int, Any]:
    """Member number -> its recorded answer, for each tier a cascade's judgement asked (an NLI
    model's tier answers for no member: it is not a judge to ask again)."""
    found: dict[int, Any] = {}
    for step in entry.get("tiers") or []:
        k = step.get("tier")
        numbers = tiers[k - 1] if isinstance(k, int) and 0 < k <= len(tiers) else []
        found |= dict(zip(numbers, step.get("members") or [], strict=False))
    return found


async def reask_audit(
    run: Any, kind: Kind, k: int, seed: int, clients: dict[str, Any]
) -> dict[str, Any]:
    """K recorded judgements of ``run`` (its ``RunRows``) asked again (``kind``), of each
    member's client in ``clients`` (member role -> client)."""
    fw = run.framework
    out: dict[str, Any] = {"run": str(run.run_dir), "task": run.manifest.task, "seed": seed}
    candidates = recorded_judgements(run)
    if not candidates:
        out["note"] = (
            f"no recorded judgement of this run can be asked again ({fw.name} declares none, "
            "or the run's inputs changed since)"
            if run.items is not None
            else "the run's inputs changed since it read them: its prompts cannot be rebuilt"
        )
        return out
    drawn = draw(candidates, k, seed)
    variants: list[Any] = [None]
    if kind == "paraphrase":
        declared = {t.id: t for c in drawn for t in fw.paraphrases(c.judgement.stage)}
        variants = [declared[name] for name in sorted(declared)]
        if not variants:
            out["note"] = f"{fw.name} declares no paraphrase of the drawn judgements' prompts"
            return out
    asks = [
        (c, member, variant)
        for c in drawn
        for member in c.members
        for variant in variants
        if variant is None or variant.id in {t.id for t in fw.paraphrases(c.judgement.stage)}
    ]
    earlier = done_before(run.run_dir, FILES[kind], KEY)
    todo = [a for a in asks if (earlier.get(_key(*a)) or {}).get("again") is None]
    answers = await asyncio.gather(*(_ask(run, kind, a, clients) for a in todo))
    for row in answers:  # already appended one by one; kept here to read back below
        earlier[_key_of(row)] = row
    rows = [earlier[_key(*a)] for a in asks]
    out |= {"candidates": len(candidates), "judgements": len(drawn), "asked_now": len(todo)}
    out |= flip_summary(rows, "again") | {"change": mean_change(rows)}
    group = "member" if kind == "rerun" else "variant"
    out["by_" + group] = {
        name: flip_summary(part, "again") | {"change": mean_change(part)}
        for name, part in _grouped(rows, group).items()
    }
    return out


def _key(recorded: Recorded, member: str, variant: Any) -> tuple[str, ...]:
    j = recorded.judgement
    return (recorded.item, j.stage, j.key, member, str(variant.id if variant else None))


def _key_of(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(row.get(f)) for f in KEY)


def _grouped(rows: Sequence[dict[str, Any]], field: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[str(row[field])].append(row)
    return dict(sorted(out.items()))


async def _ask(
    run: Any, kind: Kind, ask: tuple[Recorded, str, Any], clients: dict[str, Any]
) -> dict[str, Any]:
    recorded, member, variant = ask
    fw, options, judgement = run.framework, run.options, recorded.judgement
    role = split_member(member)[0]
    ctx = ItemContext(
        recorded.item, {role: clients[member]}, options, None, run.run_dir, options.max_reasks, fw
    )
    row: dict[str, Any] = {
        "id": recorded.item,
        "stage": judgement.stage,
        "key": judgement.key,
        "member": member,
        "variant": variant.id if variant is not None else None,
        "original": recorded.members[member],
    }
    try:
        row["again"] = await fw.ask_judgement(ctx, judgement, variant)
    except StageFailed as exc:
        row |= {"again": None, "unparseable": exc.error, "outputs": exc.outputs}
    append_labels_to(run.run_dir, FILES[kind], [row])
    return row


def mean_change(rows: Sequence[dict[str, Any]], field: str = "again") -> float | None:
    """The mean absolute difference of numeric verdicts asked again (None: not numbers)."""
    pairs = [(r["original"], r[field]) for r in rows if r.get(field) is not None]
    if not pairs or not all(_number(a) and _number(b) for a, b in pairs):
        return None
    return sum(abs(float(b) - float(a)) for a, b in pairs) / len(pairs)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---- the judges asked again ----------------------------------------------------------------


def audit_runs(
    run_dir: Sequence[Path],
    kind: Kind,
    k: int,
    seed: int,
    model: str | None,
    endpoint: str | None,
) -> list[dict[str, Any]]:
    """``reask_audit`` of every run under ``run_dir``, each member asking as the manifest
    records it (``model`` / ``endpoint``: another judge, or the same one moved)."""
    from ...runtime.store.run_dir import run_directories
    from ..exports.rows import run_rows

    return [
        asyncio.run(_audit_one(run_rows(d), kind, k, seed, model, endpoint))
        for d in run_directories(run_dir)
    ]


async def _audit_one(
    run: Any, kind: Kind, k: int, seed: int, model: str | None, endpoint: str | None
) -> dict[str, Any]:
    from ....serving.launch.embedded import cache_root
    from ...runtime.execution.models import open_evaluator

    members = sorted({m for c in recorded_judgements(run) for m in c.members})
    if not members:
        return await reask_audit(run, kind, k, seed, {})
    cache = reader_cache(cache_root(), endpoint)  # none for the endpoint the run records
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for member in members:
            stage = _stage_of(run.framework, member)
            cfg = known_by_content(judge_config(run, stage, model, endpoint))
            client = await stack.enter_async_context(open_evaluator(cfg, run.run_dir, cache))
            if kind == "rerun":  # a sample of its own: neither the recorded answer nor kept as it
                client.sample = f"rerun:{cfg.sample or 1}"
            clients[member] = client
        return await reask_audit(run, kind, k, seed, clients)


def _stage_of(fw: Any, member: str) -> str:
    """A stage ``member`` answers (its role's first declared stage, as that member asks it)."""
    from ...runtime.contract.panels import member_name

    base, index = split_member(member)
    stage = next((s for s, r in fw.stage_roles.items() if r == base), base)
    return member_name(stage.rstrip("*"), index)


def recorded_audits(run_dir: Path) -> dict[str, Any]:
    """What the audits that asked the judge again found, read back from the run's files (no
    model call): per audit the flips over every judgement it has answered, by member or
    paraphrase where it asked several (the latest answer of each judgement counts)."""
    from .swap import AUDIT

    out: dict[str, Any] = {}
    for kind, name, field, keys, group in (
        ("swap", AUDIT, "swapped", ("id", "stage", "key"), None),
        ("rerun", RERUN, "again", KEY, "member"),
        ("paraphrase", PARAPHRASE, "again", KEY, "variant"),
    ):
        rows = list(done_before(run_dir, name, keys).values())
        if not rows:
            continue
        found = flip_summary(rows, field) | {"change": mean_change(rows, field)}
        if group is not None:
            found["by_" + group] = {
                key: flip_summary(part, field) | {"change": mean_change(part, field)}
                for key, part in _grouped(rows, group).items()
            }
        out[kind] = found
    return out


def render_reask(found: list[dict[str, Any]], kind: Kind, out: Any) -> None:
    title = "self-consistency (asked again)" if kind == "rerun" else "rubric wording (paraphrases)"
    for run in found:
        out.print(f"{title}: {run['run']} ({run['task']})", highlight=False, soft_wrap=True)
        if "note" in run:
            out.print(f"  {run['note']}", highlight=False)
            continue
        out.print(
            f"  {_flips(run)}; {run['judgements']} judgements drawn of {run['candidates']} "
            f"(seed {run['seed']}), asked now {run['asked_now']}",
            highlight=False,
        )
        for name, part in (run.get("by_member") or run.get("by_variant") or {}).items():
            out.print(f"  {name}: {_flips(part)}", highlight=False, soft_wrap=True)
        if run["unparseable"]:
            out.print(
                f"  {run['unparseable']} answers stayed unparseable: counted apart, neither "
                "flip nor agreement (the next audit asks them again)",
                highlight=False,
            )


def _flips(part: dict[str, Any]) -> str:
    rate, ci = part["flip_rate"], part["flip_rate_ci"]
    shown = "undefined" if rate is None else f"{rate:.3f}"
    interval = f" (95% CI {ci[0]:.3f} to {ci[1]:.3f}, items resampled)" if ci else ""
    change = f", mean change {part['change']:.3f}" if part.get("change") is not None else ""
    return f"{part['flips']} of {part['answered']} flip: {shown}{interval}{change}"
