"""A run that judges through a calibrated cascade (``--cascade CALIBRATION``).

``groundcover cascade calibrate`` writes, per label stage, each tier's threshold on its
confidence (the share of the tier's panel that gave the combined label). A run given that file
asks a judging role's members tier by tier instead of all at once: the role's members are the
tiers' members in order, cheapest first (tier 1's ``judge``, ``judge#2``, ``judge#3``, then tier
2's ``judge#4``, ...). A judgement is kept at the first tier whose confidence reaches the tier's
threshold; a tier without a threshold, or below it, escalates it; after the last tier it is
abstained: the item is recorded ``unjudged`` with the stage that abstained, never scored, and the
judgement is offered for labelling (``view``). The thresholds are the calibration's: the kept
judgements agree with people at least 1 - alpha of the time with probability at least 1 - delta.

Tier 1 of an entailment stage may be an NLI model instead of judges (its members ``["nli"]``,
its model the checkpoint's content digest, its confidence kind ``nli``: the probability the
model gave its label): the framework scores every pair with it and the role's LLM tiers are
asked only for the pairs below its threshold.

The calibration is known by its content: its SHA-256 enters the run's identity, so a run made
with another calibration is another run. Stages it did not calibrate are asked of the last,
strongest tier alone and recorded as such (no guarantee is claimed for them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....serving.redact import clipped
from .errors import UserError
from .panels import numbered, split_member

CALIBRATION_KIND = "groundcover-cascade-calibration"
NLI_TIER = "nli"  # the one member of a tier that is an NLI model (the cross-encoder's role)
CONFIDENCE_KINDS = frozenset({"share", "logprobs", NLI_TIER})


def tier_numbers(sizes: Sequence[int], nli_first: bool) -> list[list[int]]:
    """Each tier's member numbers of the role, from 1, for tiers of ``sizes`` (``nli_first``:
    tier 1 is an NLI model, which has no member)."""
    out: list[list[int]] = []
    start = 1
    for k, size in enumerate(sizes):
        if k == 0 and nli_first:
            out.append([])
            continue
        out.append(list(range(start, start + size)))
        start += size
    return out


@dataclass(frozen=True)
class Cascade:
    """What a run reads of a calibration: the tiers' sizes and models, cheapest first, and per
    stage each tier's threshold (None: that tier escalates every judgement of the stage)."""

    file: str
    sha256: str
    role: str  # the judging role whose members the tiers are
    alpha: float
    delta: float
    sizes: tuple[int, ...]
    models: tuple[tuple[str, ...], ...]
    thresholds: dict[str, tuple[float | None, ...]]
    # per stage, each tier's confidence: "share" (of its panel giving the label), "logprobs"
    # (the probability a lone judge gave its label) or "nli" (the NLI model's probability)
    confidences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # tier 1 is an NLI model, no member of the role: its checkpoint's content digest
    nli_model: str | None = None
    # per tier: its members asked with their own wordings (--simulated-annotators)
    annotators: tuple[bool, ...] = ()

    def kinds(self, stage: str) -> tuple[str, ...]:
        """Each tier's kind of confidence for ``stage`` (share where the file says none)."""
        return self.confidences.get(stage) or ("share",) * len(self.sizes)

    def tier_numbers(self) -> list[list[int]]:
        """Each tier's member numbers of the role (from 1: ``judge`` is 1, ``judge#4`` is 4); an
        NLI model's tier has none (the framework gives its answer, ``ItemContext.choice``)."""
        return tier_numbers(self.sizes, self.nli_model is not None)

    def kind_of_member(self, stage: str, member: int) -> str:
        """The kind of confidence of the tier member ``member`` (from 1) belongs to."""
        for kind, numbers in zip(self.kinds(stage), self.tier_numbers(), strict=True):
            if member in numbers:
                return kind
        return "share"

    @property
    def members(self) -> int:
        """How many members of the role the tiers have (an NLI model's tier is none)."""
        return sum(len(numbers) for numbers in self.tier_numbers())

    def judge_tiers(self) -> list[int]:
        """The indexes of the tiers whose members are the role's."""
        return [k for k, numbers in enumerate(self.tier_numbers()) if numbers]

    def check_role(self, role: str, members: Sequence[str], models: Sequence[str]) -> None:
        """The role's members are the calibration's tiers, model for model, or one line says
        which is not."""
        judging = self.judge_tiers()
        if len(members) != self.members:
            sizes = " + ".join(str(self.sizes[k]) for k in judging)
            raise UserError(
                f"--cascade {self.file}: its {len(judging)} tier(s) "
                + ("of judges " if self.nli_model else "")
                + f"have {sizes} member(s); role {role} has {len(members)} "
                f"({', '.join(members)}): give one --role {role}=MODEL per member, the "
                "cheapest tier's first"
            )
        calibrated = [m for k in judging for m in self.models[k]]
        for member, model, wanted in zip(members, models, calibrated, strict=True):
            if wanted != "?" and model != wanted:
                raise UserError(
                    f"--cascade {self.file}: role {member} is {model}, but the calibration's "
                    f"member in its place is {wanted} (its thresholds hold for that model only)"
                )

    def identity(self) -> dict[str, Any]:
        """What the run's identity keeps (and its report reads): the calibration by content,
        its guarantee, and the tiers' sizes (never its path or name)."""
        found = {"sha256": self.sha256, "alpha": self.alpha, "delta": self.delta}
        found |= {"role": self.role, "tiers": list(self.sizes)}
        return found | ({"nli_model": self.nli_model} if self.nli_model is not None else {})

    def check_annotators(self, simulated: bool) -> None:
        """A tier of several members was calibrated asking as the run asks: each member its own
        wording (``--simulated-annotators``) or all the prompt, or one line says which."""
        for k in self.judge_tiers():
            calibrated = self.annotators[k] if k < len(self.annotators) else False
            if self.sizes[k] > 1 and calibrated != simulated:
                how = "with" if calibrated else "without"
                raise UserError(
                    f"--cascade {self.file}: its tier {k + 1} was calibrated {how} "
                    "--simulated-annotators (its members' wordings); run it the same way"
                )

    def check_nli_model(self, digest: str | None) -> None:
        """The run's NLI model is the calibration's tier 1 by content, or one line says so."""
        if self.nli_model is None or digest == self.nli_model:
            return
        if digest is None:
            raise UserError(
                f"--cascade {self.file}: its tier 1 is an NLI model; this run scores no pair "
                "with one (--nli-backend cross-encoder --nli-model CHECKPOINT)"
            )
        raise UserError(
            f"--cascade {self.file}: its tier 1 is the NLI model {self.nli_model[:19]}…, this "
            f"run's is {digest[:19]}… (its threshold holds for that model only)"
        )


def read_cascade(path: Path) -> Cascade:
    """The calibration at ``path``, checked: one line names the file and the field that is wrong;
    a file whose content no longer matches its recorded SHA-256 is refused."""
    from .readers import read_text

    where = str(path)
    if not path.is_file():
        raise UserError(f"--cascade {where}: no such file")
    try:
        found = json.loads(read_text(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where}: not JSON: {clipped(str(exc), 200)}") from None
    if not isinstance(found, dict) or found.get("kind") != CALIBRATION_KIND:
        raise UserError(f"{where}: record: field 'kind': not a cascade calibration")
    digest = content_digest(found)
    if found.get("sha256") != digest:
        raise UserError(
            f"{where}: record: field 'sha256': the content does not match it (edited after "
            "`groundcover cascade calibrate` wrote it?)"
        )
    tiers = found.get("tiers")
    if not isinstance(tiers, list) or not tiers:
        raise UserError(f"{where}: record: field 'tiers': expected a list of tiers")
    sizes, models, roles, annotators = [], [], set(), []
    nli_model: str | None = None
    for k, tier in enumerate(tiers):
        members = tier.get("members") if isinstance(tier, dict) else None
        named = tier.get("models") if isinstance(tier, dict) else None
        if not isinstance(members, list) or not isinstance(named, list):
            raise UserError(f"{where}: record: field 'tiers[{k}]': members and models lists")
        sizes.append(max(len(members), 1))
        models.append(tuple(str(m) for m in named) or ("?",))
        annotators.append(tier.get("simulated_annotators") is True)
        if members == [NLI_TIER]:  # an NLI model, no judge: tier 1 of an entailment stage
            if k != 0 or len(tiers) < 2 or len(named) != 1:
                raise UserError(
                    f"{where}: record: field 'tiers[{k}]': an NLI model is tier 1 of several, "
                    "with its one model"
                )
            nli_model = str(named[0])
            continue
        roles |= {split_member(str(m))[0] for m in members}
    if len(roles) > 1:
        raise UserError(f"{where}: record: field 'tiers': members of several roles {sorted(roles)}")
    thresholds: dict[str, tuple[float | None, ...]] = {}
    confidences: dict[str, tuple[str, ...]] = {}
    stages = found.get("stages")
    if not isinstance(stages, dict):
        raise UserError(f"{where}: record: field 'stages': expected an object")
    for stage, calibrated in stages.items():
        given = calibrated.get("thresholds") if isinstance(calibrated, dict) else None
        if not isinstance(given, list) or len(given) != len(tiers):
            raise UserError(
                f"{where}: record: field 'stages.{stage}.thresholds': one per tier expected"
            )
        if any(t is not None and not isinstance(t, int | float) for t in given):
            raise UserError(f"{where}: record: field 'stages.{stage}.thresholds': numbers")
        thresholds[stage] = tuple(None if t is None else float(t) for t in given)
        kinds = calibrated.get("confidence") or ["share"] * len(tiers)
        if len(kinds) != len(tiers) or not set(kinds) <= CONFIDENCE_KINDS:
            raise UserError(
                f"{where}: record: field 'stages.{stage}.confidence': share, logprobs or nli "
                "per tier"
            )
        if [n for n, k in enumerate(kinds) if k == NLI_TIER] != ([0] if nli_model else []):
            raise UserError(
                f"{where}: record: field 'stages.{stage}.confidence': nli is the confidence of "
                "an NLI model's tier 1, and only its"
            )
        if any(k == "logprobs" and sizes[n] != 1 for n, k in enumerate(kinds)):
            raise UserError(
                f"{where}: record: field 'stages.{stage}.confidence': logprobs is a lone "
                "judge's confidence; a tier of several members has its share"
            )
        confidences[stage] = tuple(kinds)
    return Cascade(
        file=where,
        sha256=digest,
        role=next(iter(roles), "judge"),
        alpha=float(found.get("alpha", 0)),
        delta=float(found.get("delta", 0)),
        sizes=tuple(sizes),
        models=tuple(models),
        thresholds=thresholds,
        confidences=confidences,
        nli_model=nli_model,
        annotators=tuple(annotators),
    )


def content_digest(calibration: dict[str, Any]) -> str:
    """The calibration known by its content: the SHA-256 of its canonical JSON (without the
    digest itself)."""
    import hashlib

    body = {k: v for k, v in calibration.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ConfidenceRefused(UserError):
    """A confidence that is no probability (NaN, infinite, below 0 or above 1: a positive
    logprob, say), refused in one line naming the run, the item and the stage."""


def confidence_problem(value: Any) -> str | None:
    """Why ``value`` is no confidence (None: it is one, a finite number from 0 to 1)."""
    import math

    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r} is not a number"
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if not 0.0 <= value <= 1.0:
        return f"{value!r} is not a probability from 0 to 1"
    return None


def checked_confidence(value: Any, run: Any, item: str, stage: str) -> float:
    """``value`` as a confidence, or ``ConfidenceRefused``: ``RUN: record 'ITEM': stage S:
    field confidence: 1.65 is not a probability from 0 to 1``."""
    problem = confidence_problem(value)
    if problem is not None:
        raise ConfidenceRefused(
            f"{run}: record {item!r}: stage {stage}: field confidence: {problem}"
        )
    return float(value)


def route(confidences: Sequence[float | None], thresholds: Sequence[float | None]) -> int | None:
    """The tier that keeps a judgement (its index), or None: abstained. A tier without a
    threshold, or without a confidence for the judgement, escalates it."""
    for k, (confidence, threshold) in enumerate(zip(confidences, thresholds, strict=False)):
        if confidence is not None and threshold is not None and confidence >= threshold:
            return k
    return None


class JudgementAbstained(Exception):
    """No tier of the cascade was confident enough to keep a judgement: the item is recorded
    ``unjudged``, naming the stage and each tier's confidence against its threshold."""

    def __init__(self, stage: str, asked: list[tuple[float | None, float | None]]):
        self.stage = stage
        said = "; ".join(
            f"tier {k}: "
            + ("no answer" if c is None else f"{c:.3f}")
            + (" (no threshold)" if t is None else f" < {t:.3f}")
            for k, (c, t) in enumerate(asked, 1)
        )
        self.error = f"the cascade abstained: no tier was confident ({said})"
        super().__init__(f"{stage}: {self.error}")


PEOPLE = "people"  # a cascade entry's ``kept`` where people decided what every tier abstained on


def people_decided(
    records: Iterable[Any], labels: Mapping[tuple[str, str, int], Any]
) -> dict[str, dict[tuple[str, str], Any]]:
    """Per item, the judgements the cascade abstained on that people have labelled since
    (``labels``: (id, stage, key) -> label, the key numbering the stage's entries in the item),
    each known by its stage and the digest of what it asked: solved again, the label decides
    it. Matched by what was asked, not by its place, so the item's other judgements may come
    back in any order."""
    out: dict[str, dict[tuple[str, str], Any]] = {}
    for record in records:
        for key, entry in numbered(record.details.get("cascade") or []):
            stage = entry["stage"]
            label = labels.get((record.id, stage, key))
            if entry.get("kept") is None and label is not None and "asked" in entry:
                out.setdefault(record.id, {})[(stage, entry["asked"])] = label
    return out
