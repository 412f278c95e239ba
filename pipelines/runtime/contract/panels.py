"""Judge panels: a judging role played by several models, their answers combined per stage.

``--role judge=A --role judge=B --role judge=C`` (or a YAML list) makes the role a panel. Its
members are the roles ``judge``, ``judge#2``, ``judge#3``: each has its own client, cache
entries, usage and price, and asks under its own stage name (``eligibility#2``), so every usage
table, estimate and cost is per member with no other bookkeeping. A panel of one is the role as
it always was.

A framework declares how each judging stage's answers combine (``Framework.panel_rules``):

- ``Vote``: labels. The label more than half of the members give wins (a strict majority). No
  strict majority is a tie, recorded as such and resolved by the stage's declared ``tie`` label,
  never by the order of the members.
- ``Average``: scores. Their mean or median.
- ``Cover``: sets. Each member names the items a text covers (ICAT's aspects a response's claims
  cover), each with what it rests on; an item is in the panel's set when more than half of the
  members name it.

A member whose answer stays unreadable gives no vote and no score; a stage none of the members
answers is unreadable, as for one judge. Stages without a rule (extraction, free text) are
asked of the first member only. Each combined answer is kept in the item's details under
``panel``: the stage, the members' answers and the combined one, and whether it was a tie.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

MEMBER = "#"  # judge#2: the second member of the judge panel (the first is the role itself)

Level = Literal["nominal", "ordinal", "interval"]


@dataclass(frozen=True)
class Vote:
    """Labels by strict majority; a tie goes to ``tie``. ``order``: the labels' order when they
    are ordinal (agreement then weighs near misses less), None when nominal; ``labels``: every
    label the stage may give when nominal (what a person labelling it chooses from)."""

    tie: Any
    order: tuple[Any, ...] | None = None
    labels: tuple[Any, ...] | None = None

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The labels a person chooses from (None: not declared)."""
        return self.order or self.labels

    @property
    def level(self) -> Level:
        return "nominal" if self.order is None else "ordinal"

    def combine(self, answers: Sequence[Any]) -> tuple[Any, bool]:
        """(the combined label, whether it was a tie) from the members' answers (None: the
        member gave none). A strict majority counts every member, answered or not."""
        votes = Counter(a for a in answers if a is not None)
        if votes:
            label, count = votes.most_common(1)[0]
            if count * 2 > len(answers):
                return label, False
        return self.tie, True


@dataclass(frozen=True)
class Average:
    """Scores by their mean or median over the members that answered; ``level`` says how
    agreement treats them (ratings on a scale are ordinal, probabilities interval)."""

    how: Literal["mean", "median"] = "mean"
    level: Level = "interval"

    def combine(self, answers: Sequence[Any]) -> tuple[Any, bool]:
        given = [float(a) for a in answers if a is not None]
        if not given:
            return None, False
        return (statistics.fmean(given) if self.how == "mean" else statistics.median(given)), False


NOTHING_COVERED = "none"  # the label of an empty set (a person types it, a report shows it)


class Covering(Protocol):
    """An answer that is a set of items, each with what it rests on (an alignment: the aspects a
    response covers, each with the claims that cover it), as ``Cover`` combines it."""

    def covers(self) -> dict[int, list[int]]:
        """item -> what it rests on, in the order the answer named them."""
        ...

    @classmethod
    def from_covers(cls, found: dict[int, list[int]]) -> Covering:
        """The answer that names these items (from a panel's combination, or a person's set)."""
        ...


@dataclass(frozen=True)
class Cover:
    """Sets of numbered items (``kind``: the class of the stage's answers, a ``Covering``). An
    item is in the panel's set when a strict majority of all members name it (what it rests on:
    what those members cite, in member order, each once); an item exactly half of them name is
    a tie, left out: a panel claims no coverage it does not agree on. The verdict a cascade keeps
    and a person gives is the set, written ``cover_label`` ("1, 3"; "none")."""

    kind: type[Covering]
    level: ClassVar[Level] = "nominal"

    def combine(self, answers: Sequence[Any]) -> tuple[Any, bool]:
        given = [a.covers() for a in answers if a is not None]
        if not given:
            return None, False
        votes = Counter(item for found in given for item in found)
        chosen: dict[int, list[int]] = {}
        for found in given:  # the first member naming an item places it
            for item, support in found.items():
                if votes[item] * 2 > len(answers):
                    merged = chosen.setdefault(item, [])
                    merged += [s for s in support if s not in merged]
        return self.kind.from_covers(chosen), any(n * 2 == len(answers) for n in votes.values())

    def label(self, value: Any) -> str | None:
        """The set ``value`` names, as a label (None: no answer)."""
        return None if value is None else cover_label(value.covers())

    def answer(self, label: str) -> Any:
        """The answer a person's set ``label`` stands for (nothing rests on anything)."""
        return self.kind.from_covers({item: [] for item in cover_items(label)})


def cover_label(items: Iterable[int]) -> str:
    """A set of item numbers as one label: ascending, comma-separated; the empty set "none"."""
    found = sorted(set(items))
    return ", ".join(str(n) for n in found) if found else NOTHING_COVERED


def cover_items(label: Any) -> list[int]:
    """The item numbers of a set's label ("1, 3", "3,1", "none", or a list of numbers), or a
    ``ValueError`` saying what a set's label is."""
    if isinstance(label, list):
        parts: list[Any] = label
    elif isinstance(label, str):
        text = label.strip()
        parts = [] if text.lower() in {NOTHING_COVERED, ""} else text.split(",")
    else:
        raise ValueError(f"a set such as '1, 3' or {NOTHING_COVERED!r}, got {label!r}")
    items: list[int] = []
    for part in parts:
        text = str(part).strip()
        if isinstance(part, bool) or not text.isdigit() or int(text) < 1:
            raise ValueError(f"a set such as '1, 3' or {NOTHING_COVERED!r}, got {label!r}")
        items.append(int(text))
    return sorted(set(items))


PanelRule = Vote | Average | Cover

Verdict = Literal["label", "rating", "set"]


def verdict_of(rule: PanelRule | None) -> Verdict | None:
    """What a stage's answer is to a judge cascade, which keeps a verdict where a tier agrees on
    it and escalates it elsewhere: a ``label`` (a ``Vote``: a category, or a relation between
    two texts such as an entailment), a ``rating`` (the median of ratings on an ordinal scale:
    the tier's verdict is the rating its members give, people agree when they give the same),
    a ``set`` (a ``Cover``: the items a tier's majority names, people agree when they give the
    same set), or None: a score on an interval scale (a mean) or a stage without a rule
    (extraction, free text), with no verdict to agree on, asked of the strongest tier."""
    if isinstance(rule, Vote):
        return "label"
    if isinstance(rule, Cover):
        return "set"
    if isinstance(rule, Average) and rule.how == "median" and rule.level == "ordinal":
        return "rating"
    return None


def verdict(rule: PanelRule | None, value: Any) -> Any:
    """``value`` as a stage's verdict is recorded, compared and labelled: a set as its label
    ("1, 3"), any other answer as it is."""
    return rule.label(value) if isinstance(rule, Cover) else value


def member_name(name: str, k: int) -> str:
    """The k-th member's role or stage (k from 1; the first is the name itself)."""
    return name if k == 1 else f"{name}{MEMBER}{k}"


def split_member(name: str) -> tuple[str, int]:
    """``judge#2`` -> ("judge", 2); ``judge`` -> ("judge", 1)."""
    base, sep, k = name.rpartition(MEMBER)
    if sep and k.isdigit() and int(k) >= 2:
        return base, int(k)
    return name, 1


def panel_members(role: str, names: Sequence[str]) -> list[str]:
    """The members of ``role`` among the role ``names`` a run opened, in member order."""
    found = sorted(
        (split_member(n)[1], n) for n in names if n == role or split_member(n)[0] == role
    )
    return [name for _, name in found]


def check_panels(roles: Sequence[str], declared: Sequence[str], system: Sequence[str]) -> None:
    """Member roles name a declared judging role and run #2, #3, ... without a gap."""
    from .errors import UserError

    members: dict[str, list[int]] = {}
    for name in roles:
        base, k = split_member(name)
        if k > 1:
            if base not in declared:
                raise UserError(f"--role {name}: no role {base!r} to add a panel member to")
            if base in system:
                raise UserError(
                    f"--role {name}: {base} is the system under evaluation; a panel judges"
                )
            members.setdefault(base, []).append(k)
    for base, ks in members.items():
        if sorted(ks) != list(range(2, len(ks) + 2)):
            raise UserError(f"--role {base}: panel members must be {base}#2, {base}#3, ...")


@dataclass(frozen=True)
class HumanLabel:
    """A label the dataset's own annotators gave for what a judged stage decides, beside what
    the run decided (``Framework.human_labels``). ``order``: the labels' order when ordinal."""

    stage: str
    judged: Any
    human: Any
    order: tuple[Any, ...] | None = None
    key: int = 0


def asked_digest(values: dict[str, Any]) -> str:
    """A short digest of the values a judging prompt was rendered with: the same judgement
    asked again has the same one, whatever the wording of the prompt."""
    canonical = json.dumps(values, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def shown(value: Any) -> str:
    """A prompt value as a person reads it: text as it is, a list numbered one per line."""
    if isinstance(value, list):
        return "\n".join(f"[{n}] {v}" for n, v in enumerate(value, 1))
    return str(value)


def record(stage: str, answers: Sequence[Any], value: Any, tie: bool) -> dict[str, Any]:
    """One combined answer as kept in the item's details (``details["panel"]``)."""
    entry = {"stage": stage, "members": list(answers), "value": value}
    return entry | {"tie": True} if tie else entry


def numbered(entries: Iterable[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each of an item's recorded entries (``panel``, ``cascade``, ``confidence``) with its
    number within its stage: the ``key`` labels and audits name a unit of the item by."""
    seen: dict[str, int] = {}
    for entry in entries:
        key = seen[entry["stage"]] = seen.get(entry["stage"], -1) + 1
        yield key, entry
