"""The framework protocol: what a framework declares (``Framework``, ``Study``), the request a
run is asked with and what it gives back; the per-item context it solves in is ``context``.

A framework (in the spirit of inspect_ai's Task = dataset + solver + scorer) declares

- ``Options``: a pydantic model of its own options, a ``FrameworkOptions`` (they identify the
  run, except the names in ``report_only``, which only change how tables are computed);
- ``roles`` and ``stage_roles``: the models it asks (the system under evaluation, its judges)
  and the role of each stage; ``roles_used(options)`` the roles a run with these options needs,
  so a run scoring answers made elsewhere starts no answering model;
- ``prompts``: its versioned templates, recorded by id in every manifest;
- ``load(options)``: the items, each with an ``id``, validated before anything is written;
- ``setup(request, root)``: shared resources (NLI judge, BLEURT, indexes), built once per
  invocation and only when some item still needs solving;
- ``solve(item, ctx)``: async, one item to one ``ItemResult``; a stage that stays unparseable
  raises ``StageFailed`` and the runtime records the item as such;
- ``aggregate(results, options)``: the framework's tables from the results alone, parsed once
  and in id order (pure; `report` calls it on what is on disk, also for a partial run) and
  ``render`` to print them.

A study (FanOutQA settings, ELI5 responders x methods) is declared, not hand-looped: ``plan``
lists its runs (each a sub-directory, maybe another framework, evaluator or derived items) and
``combine`` joins their tables. A plain framework is a study of one run in the root directory.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, create_model
from rich.console import Console

from ....serving.content import file_digest
from ....serving.redact import clipped
from ....serving.templates import REASK, PromptTemplate
from ..store.manifest import RunSummary
from ..store.provenance import without_input_paths
from .answers import AnswerFile, read_answers
from .commands import Command
from .config import EvaluatorConfig, RunConfig, Strict, UserError
from .context import ItemContext
from .panels import (
    HumanLabel,
    PanelRule,
    check_panels,
    member_name,
    split_member,
)
from .results import (
    ANSWER_FIELDS,
    INPUT_FIELDS,
    REFERENCE_FIELDS,
    ItemResult,
    ItemText,
    Judgement,
    SwapPair,
    item_fields,
)
from .roles import (
    SYSTEM_ROLES,
    RoleSpec,
    expand_panels,
    role_evaluator,
)


class Identified(Protocol):
    """An item: every item a framework loads has a string id (``config.RecordId``)."""

    @property
    def id(self) -> str: ...


OptionsT = TypeVar("OptionsT", bound=BaseModel)  # a study's options model
ItemT = TypeVar("ItemT", bound=Identified)  # a framework's item, as its ``load`` returns
T = TypeVar("T")
A = TypeVar("A")  # an answer of a stage (a panel member's, or the one)


class FrameworkOptions(Strict):
    """What every framework's options have: the runtime reads these, typed."""

    max_reasks: int = Field(2, ge=0, le=5, description="re-asks of an unparseable stage")


@dataclass
class RunRequest:
    """What a command asks for: the default evaluator, per-role replacements, run-directory
    options, the study's own options."""

    evaluator: EvaluatorConfig
    run: RunConfig
    options: Any
    roles: dict[str, RoleSpec] = field(default_factory=dict)

    def role(self, name: str) -> EvaluatorConfig:
        """The evaluator of one role: ``--role``/``roles:`` if given, else the default."""
        try:
            return role_evaluator(self.evaluator, self.roles.get(name))
        except ValueError as exc:  # pydantic's ValidationError is one
            raise UserError(f"role {name}: {clipped(str(exc), 300)}") from exc


@dataclass
class RunOutcome:
    dir: Path
    results: Sequence[ItemResult]  # a list when the framework has tables, else read on use
    tables: dict[str, Any] | None
    summary: RunSummary | None  # None: a dry run, which records nothing
    framework: Framework | None = None
    estimate: dict[str, Any] | None = None  # a dry run's: what the run would still ask


@dataclass
class RunPlan:
    key: str  # sub-directory of the study root; "" is the root itself
    task: str  # the manifest's task name, e.g. "fanoutqa-evidence"
    options: Any  # this run's options
    framework: Framework | None = None  # None: the study itself
    roles: dict[str, EvaluatorConfig] = field(default_factory=dict)  # else the request's
    # the answering models whose outputs this run scores (made by an earlier run of the study):
    # a judge that is one of them is self-judging
    systems: dict[str, EvaluatorConfig] = field(default_factory=dict)
    items: Callable[[dict[str, RunOutcome]], list[Any]] | None = None  # None: the study's items


def _matching(patterns: Mapping[str, T], stage: str) -> T | None:
    """The value of ``stage`` in a stage-pattern table ("prefix*" matches by prefix)."""
    if stage in patterns:
        return patterns[stage]
    for pattern, value in patterns.items():
        if pattern.endswith("*") and stage.startswith(pattern[:-1]):
            return value
    return None


class Study(Generic[OptionsT]):
    """A study: one or more runs over the same items, planned from its options (an ELI5 table, a
    paper's grid). ``Framework`` is the study of one run solved item by item; subclass ``Study``
    only for several runs that belong together.

    Declared (class attributes; default after ``=``):

    - ``name``: the name ``groundcover eval NAME`` and the entry point use (required);
    - ``Options``: the pydantic model of its options, one flag per field (required);
    - ``roles = {"judge": "every model stage"}``: role -> what it does (``--role ROLE=...``);
    - ``paper_judges_without_reasoning = False``: its judging roles turn a model's reasoning
      off, as the paper's judges did not reason;
    - ``commands = ()``: its commands when registered as an object (none: ``eval NAME``);
    - ``source = None``: set by the runtime for a study run from its file or given as an object
      (the file, the object, the file's SHA-256: part of its runs' identity).

    Hooks (methods; what the default does):

    - ``load(options)``: the items (required);
    - ``check_inputs(options)``: read the other input files, one ``UserError`` if malformed
      (default: nothing to check);
    - ``plan(request, root)``: the runs, each in ``root / key`` (required for a ``Study``);
    - ``combine(outcomes, options)``: study-level tables (default None: each run's suffice);
    - ``render_combined(combined, console)``: print them (default: nothing);
    - ``check_roles(names)``: refuse roles it does not have (default: against ``roles``).
    """

    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]]
    # role -> what it does (the models a user can set with --role ROLE=...)
    roles: ClassVar[dict[str, str]] = {"judge": "every model stage"}
    # a study that reproduces a paper whose judges did not reason (GPT-4, Llama): its judging
    # roles run a model that can turn reasoning off with it off (``roles.judges_without_reasoning``)
    paper_judges_without_reasoning: ClassVar[bool] = False
    # the commands of a study registered as an object (none: ``eval NAME``, a flag per field of
    # its options); a plugin module declares its commands beside it instead (``registry``)
    commands: ClassVar[tuple[Command, ...]] = ()
    # set by the runtime for a study run from its file or given as an object (not installed):
    # the file, the object's name and the file's SHA-256 (``contract.plugins.from_file``)
    source: dict[str, Any] | None = None

    def check_roles(self, names: list[str]) -> None:
        unknown = [n for n in names if split_member(n)[0] not in self.roles]
        if unknown:
            raise UserError(
                f"--role {unknown[0]}: {self.name} has the roles {', '.join(self.roles)}"
            )
        check_panels(names, list(self.roles), SYSTEM_ROLES)

    def load(self, options: OptionsT) -> Sequence[Any]:
        raise NotImplementedError

    def check_inputs(self, options: OptionsT) -> None:
        """Read the input files besides the items (``load``) and stop with one ``UserError``
        if any is malformed -- before the run directory exists, so nothing is written."""

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        """The runs of the study, each in ``root / key``."""
        raise NotImplementedError

    def combine(self, outcomes: dict[str, RunOutcome], options: OptionsT) -> dict[str, Any] | None:
        """Study-level tables from the runs' outcomes (None: each run's own tables suffice)."""
        return None

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        pass


class Framework(Study[OptionsT], Generic[OptionsT, ItemT]):
    """A framework: items solved one by one, each an ``ItemResult``, summed up in tables.

    Subclass ``Framework[MyOptions, MyItem]``, implement ``load`` and ``solve``, and register the
    object in the ``groundcover.frameworks`` entry-point group (or run its file: ``groundcover eval
    my_metric.py``). Everything else has a default.

    Declared (class attributes; default after ``=``), beside ``Study``'s ``name``, ``Options``
    (a ``FrameworkOptions``) and ``roles``:

    - ``prompts = {}``: its versioned prompt templates by name (``load_dir``), recorded in the run;
    - ``stage_roles = {"*": "judge"}``: stage -> the role that answers it ("prefix*" patterns);
    - ``panel_rules = {}``: judging stage -> how a panel combines its members' answers (``Vote``,
      ``Average``); a stage without one is asked of the first member only;
    - ``stage_sampling = {}``: judging stage -> sampling it fixes whatever the run's (a paper's
      protocol, e.g. ``{"temperature": 0.0}``);
    - ``prompt_variants = {}``: judging stage -> paraphrases of its prompt (``agreement
      --paraphrase``);
    - ``answer_file = None``: how a record of an answers file (``--answers``) maps to an item;
    - ``report_only = frozenset()``: options that change reports only, not the run's identity.

    Hooks (methods; what the default does):

    - ``load(options)`` and ``solve(item, ctx)``: the items, and one item's result (required);
    - ``setup(request, root)``: resources shared by every item, in ``ctx.resources`` (None);
      ``light_setup(options)``: whether it loads no model or index (True unless overridden);
    - ``roles_used(options)``: the roles a run asks (every declared role);
    - ``known_calls(item, options)``: calls per stage known before asking ({}: estimated);
    - ``identity(options)``: what of the options identifies a run (every field, inputs by content);
    - ``score_protocol(options)``: options that change what a score means ({});
    - ``prompt_ids(options)``: the prompt ids a run records (every template's, and the re-ask's);
    - ``tables_file(options)``, ``aggregate(results, options)``, ``render(tables, console)``,
      ``figures(tables)``: the run's tables, their file, how they print and plot (none);
    - ``item_text(item, record, options)``, ``item_metrics(record)``: what a person reads of an item
      and its metrics by name (the first question-like field; the score and every number);
    - ``human_labels(record, options)``: labels the dataset's annotators gave ([]);
    - ``swap_pairs(record)``, ``ask_swapped(ctx, pair)``: judgements of two texts of one kind,
      asked again swapped (``agreement --swap-audit``; none);
    - ``judgements(item, record, options)``, ``ask_judgement(ctx, judgement, template)``:
      recorded judgements asked again (``agreement --rerun`` / ``--paraphrase``; none);
    - ``given_answers(options, ids)``, ``answer_ids(options, items)``: the answers file read (by
      ``answer_file``), and the ids it may name (the items');
    - ``role_of(stage)``, ``panel_rule(stage)``, ``sampling_of(stage)``, ``paraphrases(stage)``:
      read the declarations above for one stage (not overridden);
    - ``plan(request, root)``: its one run.
    """

    Options: ClassVar[type[FrameworkOptions]]
    prompts: ClassVar[dict[str, PromptTemplate]] = {}
    report_only: ClassVar[frozenset[str]] = frozenset()
    # how a record of an answers file (``--answers``, options from ``GivenAnswers``) maps to an
    # item; the runtime then supplies each item's answer (``ItemContext.given_answer``)
    answer_file: ClassVar[AnswerFile | None] = None
    # stage -> role; "prefix*" matches every stage that starts with prefix. A stage that is not
    # a model call (a cross-encoder) maps to the name of its backend, e.g. "nli".
    stage_roles: ClassVar[dict[str, str]] = {"*": "judge"}
    # judging stage (same patterns) -> how a panel's answers combine (``contract.panels``); a
    # stage without one is asked of a panel's first member only
    panel_rules: ClassVar[dict[str, PanelRule]] = {}
    # judging stage (same patterns) -> sampling it asks with whatever the run's (the paper's
    # protocol: CRUX rates at temperature 0): a panel of one model sampled several times is
    # refused where a panel stage fixes temperature 0 (its members could not differ)
    stage_sampling: ClassVar[dict[str, dict[str, Any]]] = {}
    # judging stage (same patterns) -> paraphrases of its prompt (``PromptTemplate`` variants,
    # the same output format and scale), asked by ``agreement --paraphrase``
    prompt_variants: ClassVar[dict[str, tuple[PromptTemplate, ...]]] = {}

    def roles_used(self, options: OptionsT) -> list[str]:
        """The roles a run with ``options`` asks (only these are opened, and identify it)."""
        return list(self.roles)

    def role_of(self, stage: str, default: str | None = None) -> str:
        """The role that answers ``stage``; an undeclared stage is ``default`` (for usage an
        older version recorded) or, without one, a ``KeyError``. A panel member's stage
        (``eligibility#2``) is answered by that member (``judge#2``)."""
        base, k = split_member(stage)
        role = _matching(self.stage_roles, base)
        if role is not None:
            return member_name(role, k)
        if default is not None:
            return default
        raise KeyError(f"{self.name}: stage {stage!r} has no declared role")

    def human_labels(self, record: ItemResult, options: OptionsT) -> list[HumanLabel]:
        """The labels the dataset's annotators gave this record (read from it), beside the
        run's own decision on the same question; none by default (``groundcover agreement``)."""
        return []

    def item_text(self, item: ItemT, record: ItemResult, options: OptionsT) -> ItemText:
        """What a person reads of the item beside its score (exports, inspect_ai logs). By
        default the item's first text field named like a question (``INPUT_FIELDS``), the
        answer the run judged (``details["answer"]``, an answer given by ``--answers``, else
        the item's ``response``) and a reference field (``REFERENCE_FIELDS``)."""
        answer = record.details.get("answer")
        return ItemText(
            input=item_fields(item, INPUT_FIELDS) or str(getattr(item, "id", "")),
            answer=answer if isinstance(answer, str) else item_fields(item, ANSWER_FIELDS),
            reference=item_fields(item, REFERENCE_FIELDS),
        )

    def item_metrics(self, record: ItemResult) -> dict[str, float | None]:
        """Each per-item metric by name, as exports and trackers show them: the score, then by
        default every number (or yes/no) the framework recorded at the top of ``details``.
        Undefined stays None (never 0)."""
        found: dict[str, float | None] = {"score": record.score}
        for key, value in record.details.items():
            if isinstance(value, bool | int | float) and key not in found:
                found[key] = float(value)
        return found

    def swap_pairs(self, record: ItemResult) -> list[SwapPair]:
        """The record's judgements whose prompt held two texts of one kind, each of which
        ``ask_swapped`` can ask again with the texts swapped (``agreement --swap-audit``).
        Default: none (a judge that reads one answer against a reference has no order to flip).
        A judgement a rule decided, not the model, is no pair."""
        return []

    async def ask_swapped(self, ctx: ItemContext, pair: SwapPair) -> Any:
        """``pair`` asked again with its two texts swapped, through ``ctx`` as the run asks;
        the verdict mapped back to the original order, so that it equals ``pair.verdict`` when
        the judge does not follow the order. An answer that stays unparseable raises
        ``StageFailed``."""
        raise NotImplementedError(f"{self.name}: swap_pairs gave pairs but ask_swapped is missing")

    def sampling_of(self, stage: str) -> dict[str, Any]:
        """The sampling parameters ``stage`` fixes (``stage_sampling``; empty: the run's)."""
        return dict(_matching(self.stage_sampling, split_member(stage)[0]) or {})

    def judgements(self, item: ItemT, record: ItemResult, options: OptionsT) -> list[Judgement]:
        """The record's judgements a model decided, each of which ``ask_judgement`` can ask
        again (``agreement --rerun``, ``--paraphrase``). Default: none. A verdict a rule gave,
        or one that stayed unparseable, is no judgement."""
        return []

    async def ask_judgement(
        self, ctx: ItemContext, judgement: Judgement, template: PromptTemplate | None = None
    ) -> Any:
        """``judgement`` asked again through ``ctx`` as the run asked it (the same stage,
        parser, constraint and re-asks), with ``template`` in place of the stage's own prompt
        when given (one of ``paraphrases``); its verdict in the recorded verdict's terms. An
        answer that stays unparseable raises ``StageFailed``."""
        raise NotImplementedError(
            f"{self.name}: judgements gave judgements but ask_judgement is missing"
        )

    def paraphrases(self, stage: str) -> tuple[PromptTemplate, ...]:
        """Rewordings of ``stage``'s prompt with its output format and scale
        (``prompt_variants``), for ``agreement --paraphrase``."""
        return tuple(_matching(self.prompt_variants, split_member(stage)[0]) or ())

    def panel_rule(self, stage: str) -> PanelRule | None:
        """How a panel's answers to ``stage`` combine (None: the first member answers alone;
        always None for a member's own stage)."""
        return _matching(self.panel_rules, stage) if split_member(stage)[1] == 1 else None

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        return [RunPlan("", self.name, request.options)]

    def given_answers(
        self, options: OptionsT, item_ids: Collection[str] | None = None
    ) -> dict[str, str] | None:
        """The run's answers made elsewhere (id -> answer), None where it has no answers file;
        read and checked against ``item_ids`` with one-line errors."""
        path = getattr(options, "answers", None) if self.answer_file is not None else None
        if self.answer_file is None or path is None:
            return None
        return read_answers(Path(path), self.answer_file, item_ids)

    def answer_ids(self, options: OptionsT, items: Sequence[ItemT]) -> Collection[str]:
        """The ids an answers file may name (default: the items')."""
        return [str(item.id) for item in items]

    def identity(self, options: OptionsT, paths: bool = False) -> dict[str, Any]:
        """The options a run's answers depend on. The files and directories they name are in
        the identity by content (``provenance.input_records``), not by path: a moved input
        with the same content is the same run (``paths``: as runs made before kept them). The
        answers file's digest stays here too, where those runs keep it."""
        found = options.model_dump(mode="json", exclude=set(self.report_only))
        if not paths:
            found = without_input_paths(found, options)
        path = getattr(options, "answers", None) if self.answer_file else None
        if path is not None:
            found["answers_sha256"] = file_digest(path)
        return found

    def light_setup(self, options: OptionsT) -> bool:
        """``setup`` loads no model or index (files at most): a dry run may call it and replay
        the items against the response cache. True by default where ``setup`` is not
        overridden (there is nothing to load)."""
        return type(self).setup is Framework.setup

    def known_calls(self, item: ItemT, options: OptionsT) -> dict[str, int]:
        """Per stage, the calls this item makes whatever the models answer (re-asks of an
        unparseable output not counted); stages left out depend on model output and are
        estimated from recorded items (``--dry-run``)."""
        return {}

    def score_protocol(self, options: OptionsT) -> dict[str, Any]:
        """The options that change what a score means (a rule set chosen by a flag): runs that
        differ in them are not compared item by item."""
        return {}

    def prompt_ids(self, options: OptionsT) -> dict[str, str]:
        """Ids of the templates a run with ``options`` uses (recorded; part of its identity)."""
        return {name: t.id for name, t in self.prompts.items()} | {"reask": REASK.id}

    def setup(self, request: RunRequest, root: Path) -> Any:
        return None

    def load(self, options: OptionsT) -> Sequence[ItemT]:
        raise NotImplementedError

    async def solve(self, item: ItemT, ctx: ItemContext) -> ItemResult:
        raise NotImplementedError

    def tables_file(self, options: OptionsT) -> str | None:
        """File name the run's tables are written to (None: no tables, ``aggregate`` is not
        called and the records stay on disk)."""
        return None

    def aggregate(self, results: list[ItemResult], options: OptionsT) -> dict[str, Any] | None:
        """The tables, from every record parsed once (in id order)."""
        return None

    def render(self, tables: dict[str, Any], console: Console) -> None:
        pass

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        """Plots of the tables for the HTML report, as (title, spec) pairs that
        ``reports.pages.plots.draw`` renders (none by default)."""
        return []


def request_model(study: Study) -> type[Strict]:
    """The whole configuration of a study's command: evaluator, run, and the study's options
    under its own name (the YAML file uses the same sections)."""
    fields: dict[str, Any] = {
        "evaluator": (EvaluatorConfig, Field(default_factory=EvaluatorConfig)),
        "roles": (
            Annotated[dict[str, RoleSpec], BeforeValidator(expand_panels)],
            Field(default_factory=dict),
        ),
        "run": (RunConfig, Field(default_factory=RunConfig)),
        study.name: (study.Options, ...),
    }
    return create_model(f"{study.name.title()}Config", __base__=Strict, **fields)
