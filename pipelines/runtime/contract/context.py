"""``ItemContext``: one item's view of the runtime, the only way a framework's ``solve`` asks a
model. A stage reaches its role's client with per-item accounting; a judging stage whose role
is a panel asks every member side by side and combines their answers by the stage's rule
(``panels``), keeping the members' answers and a digest of what they were asked in the details.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ....serving.client import (
    ChatResult,
    EvalClient,
    LabelScore,
    Parsed,
    StageUsage,
    Tool,
    ToolRun,
)
from ....serving.templates import PromptTemplate
from . import panels
from .cascade import (
    NLI_TIER,
    PEOPLE,
    Cascade,
    ConfidenceRefused,
    JudgementAbstained,
    checked_confidence,
)
from .panels import (
    Cover,
    PanelRule,
    member_name,
    panel_members,
    split_member,
    verdict,
    verdict_of,
)
from .results import ItemResult, StageFailed, StageFailure, Status

A = TypeVar("A")  # an answer of a stage (a panel member's, or the one)


class StageRouting(Protocol):
    """What a context reads of its framework: which role answers a stage, and how a panel's
    answers to it combine (``Framework`` is one; named here so the context needs no import of
    the protocol that hands it to frameworks)."""

    def role_of(self, stage: str, default: str | None = None) -> str: ...

    def panel_rule(self, stage: str) -> PanelRule | None: ...

    def paraphrases(self, stage: str) -> tuple[PromptTemplate, ...]: ...


@dataclass
class ItemContext:
    """One item's view of the runtime: the model of each role (a stage reaches its role's
    client, with per-item accounting), the run's options and shared resources, and ``details``
    that are recorded even when a stage fails. Frameworks ask through the stage methods only."""

    item_id: str
    clients: EvalClient | Mapping[str, EvalClient]  # one client: every role
    options: Any
    resources: Any = None
    run_dir: Path = Path(".")
    max_reasks: int = 2
    framework: StageRouting | None = None  # its stage_roles route each stage
    answers: Mapping[str, str] | None = None  # answers made elsewhere (``--answers``)
    details: dict[str, Any] = field(default_factory=dict)
    meter: dict[str, StageUsage] = field(default_factory=dict)
    # the reasoning of each request, kept only with --keep-reasoning (None: not kept)
    reasoning_log: list[dict[str, Any]] | None = None
    cascade: Cascade | None = None  # --cascade: the judging role's members asked tier by tier
    label_confidence: bool = False  # --confidence logprobs: a lone judge's label probability
    # --simulated-annotators: a panel's member k asks with the stage's (k-1)-th paraphrase
    annotators: bool = False
    # what people decided of this item's judgements the cascade abstained on: (stage, asked
    # digest) -> label (cascade.people_decided)
    people: Mapping[tuple[str, str], Any] | None = None
    # stage calls in flight, and what a ``settle`` waits on (set when the last one ends)
    _flying: int = field(default=0, init=False, repr=False)
    _landed: asyncio.Event | None = field(default=None, init=False, repr=False)

    @property
    def answered_elsewhere(self) -> bool:
        """The run scores a file's answers: no answering model is asked."""
        return self.answers is not None

    def given_answer(self) -> str | None:
        """This item's answer in the run's answers file (None: the file has none for it)."""
        if self.answers is None:
            raise RuntimeError("given_answer: this run has no answers file")
        return self.answers.get(self.item_id)

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        self._flying += 1
        try:
            yield
        finally:
            self._flying -= 1
            if not self._flying and self._landed is not None:
                self._landed.set()

    async def settle(self) -> None:
        """Wait until no stage call of this item is in flight. A stage that fails (unparseable,
        abstained) raises through the framework's ``gather`` while its siblings still run: the
        item is recorded once they have ended, with everything they add to the details (every
        judgement a cascade abstained on, not only the first), and nothing of theirs is left
        running into a record already written. Their calls were sent either way."""
        while self._flying:
            self._landed = self._landed or asyncio.Event()
            self._landed.clear()
            await self._landed.wait()

    def _client(self, stage: str) -> EvalClient:
        if isinstance(self.clients, EvalClient):
            return self.clients
        role = self.framework.role_of(stage) if self.framework else "judge"
        if role not in self.clients:  # a defect: roles_used() misses a role solve() asks
            raise KeyError(f"stage {stage!r} asks role {role!r}, which this run did not open")
        return self.clients[role]

    async def _each_member(
        self,
        stage: str,
        ask: Callable[[str], Awaitable[A]],
        asked: dict[str, Any] | None = None,
        first: tuple[Any, float] | None = None,
    ) -> tuple[PanelRule | None, list[A]]:
        """``ask(stage)``, or for a judging stage whose role is a panel, ``ask`` of each
        member's stage side by side, with the stage's rule (None: one answer, no panel). A label
        stage of the cascaded role (``asked``: its values, given where the answers are
        ``Parsed``) goes tier by tier instead: one answer, the kept tier's (``first``: the label
        and probability an NLI model gave, the answer of a cascade's NLI tier)."""
        with self._in_flight():
            return await self._members_answer(stage, ask, asked, first)

    async def _members_answer(
        self,
        stage: str,
        ask: Callable[[str], Awaitable[A]],
        asked: dict[str, Any] | None,
        first: tuple[Any, float] | None,
    ) -> tuple[PanelRule | None, list[A]]:
        rule, members = None, []
        if not isinstance(self.clients, EvalClient) and self.framework is not None:
            rule = self.framework.panel_rule(stage)
            if rule is not None:
                members = panel_members(self.framework.role_of(stage), list(self.clients))
        numbers = list(range(1, len(members) + 1))
        if self._cascaded_role(stage):
            if asked is not None and verdict_of(rule) is not None:
                tiered = await self._cascaded(stage, rule, ask, asked, first)  # type: ignore[arg-type]
                return None, [tiered]  # type: ignore[list-item]
            numbers = self._strongest_tier()  # a mean or free text: the strongest tier's
            if rule is None or len(numbers) < 2:
                return None, [await ask(member_name(stage, numbers[0]))]
        if rule is None or len(numbers) < 2:
            return None, [await ask(stage)]
        stages = [member_name(stage, k) for k in numbers]
        return rule, list(await asyncio.gather(*(ask(s) for s in stages)))

    def _cascaded_role(self, stage: str) -> bool:
        """Whether ``stage`` (not a member's own) is one of the role a cascade judges with."""
        if self.cascade is None or self.framework is None or isinstance(self.clients, EvalClient):
            return False
        return split_member(stage)[1] == 1 and self.framework.role_of(stage) == self.cascade.role

    def nli_first(self, stage: str) -> bool:
        """Whether the run's cascade takes ``stage``'s labels from an NLI model first: the
        framework gives its label and probability to ``choice`` (``first``), which asks the
        role's judges only when the model's tier does not keep it."""
        return (
            self.cascade is not None
            and self.cascade.nli_model is not None
            and self._cascaded_role(stage)
            and self._label_stage(stage)
        )

    def model_label(
        self, stage: str, values: dict[str, Any], label: Any, probability: float
    ) -> None:
        """A label of ``stage`` an NLI model gave in place of the judge, with its probability:
        with ``--confidence logprobs`` it is recorded as a lone judge's would be (kind ``nli``),
        what ``cascade calibrate`` reads as an NLI model's tier."""
        if not self.label_confidence:
            return
        entry = {"stage": stage, "asked": panels.asked_digest(values), "value": label}
        try:
            entry |= {"confidence": self._confidence(probability, stage), "kind": NLI_TIER}
        except ConfidenceRefused as exc:  # kept without one, saying why: nothing to calibrate
            entry |= {"confidence": None, "kind": NLI_TIER, "refused": str(exc)}
        self.details.setdefault("confidence", []).append(entry)

    def _confidence(self, value: Any, stage: str) -> float:
        """A confidence about to be recorded, checked: a finite probability, or refused in one
        line naming the run, the item and the stage (``ConfidenceRefused``)."""
        return checked_confidence(value, self.run_dir, self.item_id, stage)

    def _worded(self, template: PromptTemplate, stage: str) -> PromptTemplate:
        """The wording a member (``stage``: its own, ``judge#3``) asks with: with simulated
        annotators, the k-th member of its panel (of its tier, under a cascade) the stage's
        (k-1)-th paraphrase, the first its prompt; else the prompt."""
        if not self.annotators or self.framework is None:
            return template
        base, k = split_member(stage)
        position = k - 1
        if self.cascade is not None and self._cascaded_role(base):
            position = next(n.index(k) for n in self.cascade.tier_numbers() if k in n)
        if position == 0:
            return template
        return self.framework.paraphrases(base)[position - 1]  # each is there: check_wordings

    def _strongest_tier(self) -> list[int]:
        """The member numbers of the cascade's last, strongest tier. A stage of the cascaded
        role that gives no verdict (a mean score, an extraction, free text) has no agreement to
        trust: the strongest tier answers it, as a run without the cascade would ask the strong
        judge."""
        assert self.cascade is not None
        return self.cascade.tier_numbers()[-1]

    def _strongest(self, stage: str) -> str:
        """``stage`` as the strongest tier's first member asks it, for the cascaded role."""
        return (
            member_name(stage, self._strongest_tier()[0]) if self._cascaded_role(stage) else stage
        )

    async def _cascaded(
        self,
        stage: str,
        rule: PanelRule,
        ask: Callable[[str], Awaitable[Parsed]],
        asked: dict[str, Any],
        first: tuple[Any, float] | None = None,
    ) -> Parsed:
        """The judgement asked tier by tier (``runtime.contract.cascade``): each tier's members
        side by side, their labels or ratings combined by the stage's rule (an NLI model's tier:
        its label ``first``, nothing asked); kept at the first tier whose confidence reaches its
        threshold. Recorded in the details under ``cascade``: every tier asked, its members'
        answers, its verdict and confidence, and the tier that kept it (None: abstained,
        ``JudgementAbstained``; ``people``: abstained, and labelled since). A stage no tier
        answered at all is unparseable, as for one judge."""
        assert self.cascade is not None
        tiers = self.cascade.tier_numbers()
        thresholds = self.cascade.thresholds.get(stage)
        entry: dict[str, Any] = {"stage": stage, "asked": panels.asked_digest(asked), "tiers": []}
        asking = list(zip(range(1, len(tiers) + 1), tiers, thresholds or (), strict=False))
        if thresholds is None:  # not calibrated: the strongest tier alone, no guarantee claimed
            asking = [(len(tiers), tiers[-1], 0.0)]
            entry["calibrated"] = False

        def recorded(kept: Any, value: Any) -> None:
            self.details.setdefault("cascade", []).append(entry | {"kept": kept, "value": value})

        said: list[tuple[float | None, float | None]] = []
        failed: Parsed | None = None
        kinds = self.cascade.kinds(stage)
        for k, numbers, threshold in asking:
            if not numbers:  # an NLI model's tier: the label the framework scored it with
                answers, values = [], [None if first is None else first[0]]
            else:
                answers = list(await asyncio.gather(*(ask(member_name(stage, n)) for n in numbers)))
                values = [a.value if a.ok else None for a in answers]
            answered = any(v is not None for v in values)
            combined, tie = rule.combine(values) if answered else (None, False)
            # what is recorded and compared: a set as its label, any other verdict as it is
            value, values = verdict(rule, combined), [verdict(rule, v) for v in values]
            share = None if value is None else sum(v == value for v in values) / len(values)
            refused: Parsed | None = None
            if kinds[k - 1] == "logprobs":  # the lone judge's own probability of its label
                result = answers[0].result if answers[0].ok else None
                given = str(answers[0].value)  # as it said it (a rating 4, not its median 4.0)
                share = result.label_probability(given) if result is not None else None
            elif kinds[k - 1] == NLI_TIER:  # the model's probability of its label
                share = None if first is None else first[1]
            if share is not None:
                try:
                    share = self._confidence(share, stage)
                except ConfidenceRefused as exc:  # no probability: the tier keeps nothing
                    share, refused = None, Parsed("unparseable", error=str(exc))
            step = {"tier": k, "members": values, "value": value, "confidence": share}
            step |= {"refused": refused.error} if refused is not None else {}
            entry["tiers"].append(step | ({"tie": True} if tie else {}))
            said.append((share, threshold))
            failed = failed or refused or next((a for a in answers if not a.ok), None)
            if share is not None and threshold is not None and share >= threshold:
                recorded(k, value)
                outputs: list[str] = next((a.outputs for a in answers if a.ok), [])
                return Parsed("ok", combined, outputs=outputs, probability=share)
        if all(share is None for share, _ in said) and failed is not None:
            recorded(None, None)
            return Parsed("unparseable", error=failed.error, outputs=failed.outputs)
        decided = (self.people or {}).get((stage, entry["asked"]))
        if decided is not None:  # every tier abstained, and people have labelled it since
            recorded(PEOPLE, decided)
            return Parsed("ok", rule.answer(decided) if isinstance(rule, Cover) else decided)
        # what it asked, as text, for the person who labels it (an NLI pair, a passage and a
        # question): only an abstained judgement keeps it, the others are known by the digest
        entry["values"] = {name: panels.shown(value) for name, value in asked.items()}
        recorded(None, None)
        raise JudgementAbstained(stage, said)

    def _combined(
        self,
        stage: str,
        rule: PanelRule,
        answers: Sequence[Parsed | LabelScore],
        asked: dict[str, Any],
    ) -> tuple[Any, float | None]:
        """The members' answers combined by the stage's rule and kept in the details, with a
        digest of the values the prompt was rendered with (``asked``: the audits find each
        member's own answer to a judgement by it): (the combined value, or None when no member
        answered; the share of members that gave it)."""
        values = [
            (a.value if isinstance(a, Parsed) else a.score) if a.status == "ok" else None
            for a in answers
        ]
        value, tie = (None, False) if all(v is None for v in values) else rule.combine(values)
        said, shown = verdict(rule, value), [verdict(rule, v) for v in values]
        entry = panels.record(stage, shown, said, tie) | {"asked": panels.asked_digest(asked)}
        self.details.setdefault("panel", []).append(entry)
        return value, None if value is None else sum(v == said for v in shown) / len(shown)

    def _panel_parsed(
        self, stage: str, rule: PanelRule | None, answers: list[Parsed], asked: dict[str, Any]
    ) -> Parsed:
        """The answer as one ``Parsed``: a panel's combined value with the first member's
        outputs, unparseable (with a failing member's error) when no member answered."""
        if rule is None:
            return answers[0]
        value, share = self._combined(stage, rule, answers, asked)
        if value is None:
            failed = next(a for a in answers if not a.ok)
            return Parsed("unparseable", error=failed.error, outputs=failed.outputs)
        return Parsed("ok", value, outputs=answers[0].outputs, probability=share)

    async def chat(
        self, messages: list[dict], *, stage: str, template: str | None = None, **params: Any
    ) -> ChatResult:
        stage = self._strongest(stage)
        with self._in_flight():
            return await self._client(stage).chat(
                messages,
                stage=stage,
                template=template,
                meter=self.meter,
                reasoning_log=self.reasoning_log,
                **params,
            )

    async def attempt(
        self,
        template: PromptTemplate,
        stage: str,
        parse: Callable[[str], Any],
        expected: str,
        values: dict[str, Any],
        *,
        regex: str | None = None,
        max_reasks: int | None = None,
        **params: Any,
    ) -> Parsed:
        """One stage: render, constrain to ``regex`` (vLLM), parse, re-ask with the parse error,
        account; an output that stays unparseable comes back as such (the caller decides). A
        panel's members each answer; their values combine by the stage's rule."""
        rule, answers = await self._each_member(
            stage,
            lambda s: self._attempt_one(
                template, s, parse, expected, values, regex, max_reasks, params
            ),
            values,
        )
        return self._lone_confidence(
            stage, self._panel_parsed(stage, rule, answers, values), values
        )

    async def _attempt_one(
        self,
        template: PromptTemplate,
        stage: str,
        parse: Callable[[str], Any],
        expected: str,
        values: dict[str, Any],
        regex: str | None,
        max_reasks: int | None,
        params: dict[str, Any],
    ) -> Parsed:
        client, params = self._client(stage), self._with_logprobs(stage, dict(params))
        template = self._worded(template, stage)
        if regex and client.vllm_extensions and client.constrains:
            extra = dict(params.pop("extra_body", None) or {})
            params["extra_body"] = extra | {"structured_outputs": {"regex": regex}}
        return await client.parsed(
            template.messages(**values),
            parse,
            expected,
            self.max_reasks if max_reasks is None else max_reasks,
            stage=stage,
            template=template.id,
            meter=self.meter,
            reasoning_log=self.reasoning_log,
            **params,
        )

    async def ask(
        self,
        template: PromptTemplate,
        stage: str,
        parse: Callable[[str], Any],
        expected: str,
        values: dict[str, Any],
        *,
        regex: str | None = None,
        max_reasks: int | None = None,
        **params: Any,
    ) -> Parsed:
        """``attempt``, with ``StageFailed`` when the output stays unparseable."""
        parsed = await self.attempt(
            template, stage, parse, expected, values, regex=regex, max_reasks=max_reasks, **params
        )
        if not parsed.ok:
            raise StageFailed(stage, parsed)
        return parsed

    def account(self, stage: str, calls: int) -> None:
        """Work of a stage that is no model request (a cross-encoder's pairs), in the usage."""
        self.meter.setdefault(stage, StageUsage()).calls += calls

    async def choice(
        self,
        template: PromptTemplate,
        choices: list[str],
        stage: str,
        values: dict[str, Any],
        first: tuple[Any, float] | None = None,
        **params: Any,
    ) -> Parsed:
        """One of ``choices`` (constrained on vLLM), or the unparseable record: the caller
        decides what an unreadable answer means. A panel votes (``probability``: the share of
        its members that gave the label). ``first``: the label and probability an NLI model gave
        the judgement, a cascade's tier 1 where ``nli_first(stage)`` (ignored elsewhere)."""
        rule, answers = await self._each_member(
            stage, lambda s: self._choice_one(template, choices, s, values, params), values, first
        )
        return self._lone_confidence(
            stage, self._panel_parsed(stage, rule, answers, values), values
        )

    def _label_stage(self, stage: str) -> bool:
        """Whether ``stage``'s answer is a verdict a cascade keeps (a label, rating or set)."""
        return (
            self.framework is not None and verdict_of(self.framework.panel_rule(stage)) is not None
        )

    def _probable_stage(self, stage: str) -> bool:
        """Whether ``stage``'s verdict is one answer a lone judge gives a probability of (its
        tokens' logprobs): a label or a rating; a set (an alignment) is several at once, its
        confidence a panel's share only."""
        rule = self.framework.panel_rule(stage) if self.framework is not None else None
        return verdict_of(rule) in ("label", "rating")

    def _with_logprobs(self, stage: str, params: dict[str, Any]) -> dict[str, Any]:
        """A member's (``stage``: its own, ``judge#4``) label stage asks for logprobs where its
        confidence is the label's own probability: the run's ``--confidence logprobs`` for a lone
        judge, or a cascade tier calibrated on it (the other tiers' members are asked as they
        were: an endpoint that refuses logprobs is only asked for them where they are used)."""
        base, k = split_member(stage)
        if not self._probable_stage(base) or params.get("logprobs"):
            return params
        if self.cascade is not None and self._cascaded_role(base):
            wanted = self.cascade.kind_of_member(base, k) == "logprobs"
        else:
            wanted = self.label_confidence
        return params | {"logprobs": True} if wanted else params

    def _lone_confidence(self, stage: str, parsed: Parsed, values: dict[str, Any]) -> Parsed:
        """With ``--confidence logprobs``, a label one judge gave is recorded with the
        probability it gave the label (``details["confidence"]``: what ``cascade calibrate``
        reads of a tier of one judge); a panel's confidence is its share, kept with its vote."""
        if not self.label_confidence or not parsed.ok or parsed.probability is not None:
            return parsed
        if not self._probable_stage(stage) or self._cascaded_role(stage):
            return parsed
        found = parsed.result.label_probability(str(parsed.value)) if parsed.result else None
        entry = {"stage": stage, "asked": panels.asked_digest(values), "value": parsed.value}
        if found is not None:
            try:
                found = self._confidence(found, stage)
            except ConfidenceRefused as exc:  # the judgement is refused, as an odd answer is
                return Parsed("unparseable", error=str(exc), outputs=parsed.outputs)
        self.details.setdefault("confidence", []).append(entry | {"confidence": found})
        return parsed

    async def _choice_one(
        self,
        template: PromptTemplate,
        choices: list[str],
        stage: str,
        values: dict[str, Any],
        params: dict[str, Any],
    ) -> Parsed:
        params, template = self._with_logprobs(stage, params), self._worded(template, stage)
        return await self._client(stage).choice(
            template.messages(**values),
            choices,
            max_reasks=self.max_reasks,
            stage=stage,
            template=template.id,
            meter=self.meter,
            reasoning_log=self.reasoning_log,
            **params,
        )

    async def choose(
        self,
        template: PromptTemplate,
        choices: list[str],
        stage: str,
        values: dict[str, Any],
        **params: Any,
    ) -> str:
        """One of ``choices`` (constrained on vLLM); ``StageFailed`` when none can be read."""
        parsed = await self.choice(template, choices, stage, values, **params)
        if not parsed.ok:
            raise StageFailed(stage, parsed)
        return parsed.value

    async def label_score(
        self, template: PromptTemplate, stage: str, values: dict[str, Any], **params: Any
    ) -> LabelScore:
        rule, scores = await self._each_member(
            stage, lambda s: self._label_score(template, s, values, **params)
        )
        scored = scores[0]
        if rule is not None:  # each member's score, combined by the stage's rule
            value, _ = self._combined(stage, rule, scores, values)
            failed = next((s for s in scores if s.status != "ok"), scored)
            scored = failed if value is None else LabelScore("ok", value, output=scored.output)
        if scored.status != "ok":
            raise StageFailed(stage, error=scored.error)
        return scored

    async def _label_score(
        self, template: PromptTemplate, stage: str, values: dict[str, Any], **params: Any
    ) -> LabelScore:
        template = self._worded(template, stage)
        return await self._client(stage).label_score(
            template.messages(**values),
            max_reasks=self.max_reasks,
            stage=stage,
            template=template.id,
            meter=self.meter,
            reasoning_log=self.reasoning_log,
            **params,
        )

    async def run_tools(
        self,
        messages: list[dict],
        tools: list[Tool],
        *,
        stage: str,
        template: str | None = None,
        **params: Any,
    ) -> ToolRun:
        stage = self._strongest(stage)
        with self._in_flight():
            return await self._client(stage).run_tools(
                messages,
                tools,
                stage=stage,
                template=template,
                meter=self.meter,
                reasoning_log=self.reasoning_log,
                **params,
            )

    def usage(self) -> dict[str, dict[str, Any]]:
        return {stage: u.as_dict() for stage, u in self.meter.items()}

    def result(self, status: Status, score: float | None, explanation: str) -> ItemResult:
        return ItemResult(
            id=self.item_id,
            status=status,
            score=score,
            explanation=explanation,
            details=self.details,
            usage=self.usage(),
        )

    def failed(self, failure: StageFailure, status: Status, explanation: str) -> ItemResult:
        return ItemResult(
            id=self.item_id,
            status=status,
            explanation=explanation,
            details=self.details,
            usage=self.usage(),
            failure=failure,
        )
