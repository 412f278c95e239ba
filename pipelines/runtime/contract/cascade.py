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

from .errors import UserError
from .panels import numbered, split_member

CALIBRATION_KIND = "groundcover-cascade-calibration"


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
    # per stage, each tier's confidence: "share" (of its panel giving the label) or "logprobs"
    # (the probability a lone judge gave its label)
    confidences: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def kinds(self, stage: str) -> tuple[str, ...]:
        """Each tier's kind of confidence for ``stage`` (share where the file says none)."""
        return self.confidences.get(stage) or ("share",) * len(self.sizes)

    def tier_numbers(self) -> list[list[int]]:
        """Each tier's member numbers (from 1: ``judge`` is 1, ``judge#4`` is 4)."""
        out, start = [], 1
        for size in self.sizes:
            out.append(list(range(start, start + size)))
            start += size
        return out

    def kind_of_member(self, stage: str, member: int) -> str:
        """The kind of confidence of the tier member ``member`` (from 1) belongs to."""
        for kind, numbers in zip(self.kinds(stage), self.tier_numbers(), strict=True):
            if member in numbers:
                return kind
        return "share"

    @property
    def members(self) -> int:
        return sum(self.sizes)

    def check_role(self, role: str, members: Sequence[str], models: Sequence[str]) -> None:
        """The role's members are the calibration's tiers, model for model, or one line says
        which is not."""
        if len(members) != self.members:
            sizes = " + ".join(str(s) for s in self.sizes)
            raise UserError(
                f"--cascade {self.file}: its {len(self.sizes)} tier(s) have {sizes} member(s); "
                f"role {role} has {len(members)} ({', '.join(members)}): give one --role "
                f"{role}=MODEL per member, tier 1's first"
            )
        calibrated = [m for tier in self.models for m in tier]
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
        return found | {"role": self.role, "tiers": list(self.sizes)}


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
        raise UserError(f"{where}: not JSON: {' '.join(str(exc).split())[:200]}") from None
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
    sizes, models, roles = [], [], set()
    for k, tier in enumerate(tiers):
        members = tier.get("members") if isinstance(tier, dict) else None
        named = tier.get("models") if isinstance(tier, dict) else None
        if not isinstance(members, list) or not isinstance(named, list):
            raise UserError(f"{where}: record: field 'tiers[{k}]': members and models lists")
        sizes.append(max(len(members), 1))
        roles |= {split_member(str(m))[0] for m in members}
        models.append(tuple(str(m) for m in named) or ("?",))
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
        if len(kinds) != len(tiers) or not set(kinds) <= {"share", "logprobs"}:
            raise UserError(
                f"{where}: record: field 'stages.{stage}.confidence': share or logprobs per tier"
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
    )


def content_digest(calibration: dict[str, Any]) -> str:
    """The calibration known by its content: the SHA-256 of its canonical JSON (without the
    digest itself)."""
    import hashlib

    body = {k: v for k, v in calibration.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
