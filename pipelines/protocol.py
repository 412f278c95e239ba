"""The framework protocol: what a framework declares, and the per-item context it solves in.

A framework (in the spirit of inspect_ai's Task = dataset + solver + scorer) declares

- ``Options``: a pydantic model of its own options (they identify the run, except the names in
  ``report_only``, which only change how tables are computed);
- ``prompts``: its versioned templates, recorded by id in every manifest;
- ``load(options)``: the items, each with an ``id``, validated before anything is written;
- ``setup(request, root)``: shared resources (NLI judge, BLEURT, indexes), built once per
  invocation and only when some item still needs solving;
- ``solve(item, ctx)``: async, one item to one ``ItemResult``; a stage that stays unparseable
  raises ``StageFailed`` and the runtime records the item as such;
- ``aggregate(results, options)``: the framework's tables from the results alone (pure; `report`
  calls it on what is on disk, also for a partial run) and ``render`` to print them.

A study (FanOutQA settings, ELI5 responders x methods) is declared, not hand-looped: ``plan``
lists its runs (each a sub-directory, maybe another framework, evaluator or derived items) and
``combine`` joins their tables. A plain framework is a study of one run in the root directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel
from rich.console import Console

from pipelines.config import EvaluatorConfig, RunConfig
from pipelines.results import ItemResult, StageFailed, StageFailure, Status
from serving.client import ChatResult, EvalClient, LabelScore, Parsed, StageUsage, Tool, ToolRun
from serving.templates import REASK, PromptTemplate


@dataclass
class RunRequest:
    """What a command asks for: the evaluator, run-directory options, the study's own options."""

    evaluator: EvaluatorConfig
    run: RunConfig
    options: Any


@dataclass
class RunOutcome:
    dir: Path
    results: list[ItemResult]
    tables: dict[str, Any] | None
    summary: dict[str, Any]
    framework: Framework | None = None


@dataclass
class RunPlan:
    key: str  # sub-directory of the study root; "" is the root itself
    task: str  # the manifest's task name, e.g. "fanoutqa-evidence"
    options: Any  # this run's options
    framework: Framework | None = None  # None: the study itself
    evaluator: EvaluatorConfig | None = None  # None: the request's evaluator
    items: Callable[[dict[str, RunOutcome]], list[Any]] | None = None  # None: the study's items


class Study:
    name: ClassVar[str]
    Options: ClassVar[type[BaseModel]]

    def load(self, options: Any) -> list[Any]:
        raise NotImplementedError

    def check_inputs(self, options: Any) -> None:
        """Read the input files besides the items (``load``) and stop with one ``UserError``
        if any is malformed -- before the run directory exists, so nothing is written."""

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        """The runs of the study, each in ``root / key``."""
        raise NotImplementedError

    def combine(self, outcomes: dict[str, RunOutcome], options: Any) -> dict[str, Any] | None:
        """Study-level tables from the runs' outcomes (None: each run's own tables suffice)."""
        return None

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        pass


class Framework(Study):
    prompts: ClassVar[dict[str, PromptTemplate]] = {}
    report_only: ClassVar[frozenset[str]] = frozenset()

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        return [RunPlan("", self.name, request.options)]

    def identity(self, options: Any) -> dict[str, Any]:
        return options.model_dump(mode="json", exclude=set(self.report_only))

    def prompt_ids(self, options: Any) -> dict[str, str]:
        """Ids of the templates a run with ``options`` uses (recorded; part of its identity)."""
        return {name: t.id for name, t in self.prompts.items()} | {"reask": REASK.id}

    def setup(self, request: RunRequest, root: Path) -> Any:
        return None

    async def solve(self, item: Any, ctx: ItemContext) -> ItemResult:
        raise NotImplementedError

    def tables_file(self, options: Any) -> str | None:
        """File name the run's tables are written to (None: no tables)."""
        return None

    def aggregate(self, results: list[ItemResult], options: Any) -> dict[str, Any] | None:
        return None

    def render(self, tables: dict[str, Any], console: Console) -> None:
        pass

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        """Plots of the tables for the HTML report, as (title, spec) pairs that
        ``pipelines.plots.draw`` renders (none by default)."""
        return []


@dataclass
class ItemContext:
    """One item's view of the runtime: the client with per-item accounting, the run's options
    and shared resources, and ``details`` that are recorded even when a stage fails."""

    item_id: str
    client: EvalClient
    options: Any
    resources: Any = None
    run_dir: Path = Path(".")
    max_reasks: int = 2
    meter: dict[str, StageUsage] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    async def chat(self, messages: list[dict], *, stage: str, template: str | None = None,
                   **params: Any) -> ChatResult:  # fmt: skip
        return await self.client.chat(
            messages, stage=stage, template=template, meter=self.meter, **params
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
        """One stage: render, constrain to ``regex`` (vLLM), parse, re-ask with the parse error,
        account; ``StageFailed`` when the output stays unparseable."""
        if regex and self.client.vllm_extensions:
            extra = dict(params.pop("extra_body", None) or {})
            params["extra_body"] = extra | {"structured_outputs": {"regex": regex}}
        parsed = await self.client.parsed(
            template.messages(**values), parse, expected,
            self.max_reasks if max_reasks is None else max_reasks,
            stage=stage, template=template.id, meter=self.meter, **params,
        )  # fmt: skip
        if not parsed.ok:
            raise StageFailed(stage, parsed)
        return parsed

    async def choice(self, template: PromptTemplate, choices: list[str], stage: str,
                     values: dict[str, Any], **params: Any) -> Parsed:  # fmt: skip
        """One of ``choices`` (constrained on vLLM), or the unparseable record: the caller
        decides what an unreadable answer means."""
        return await self.client.choice(
            template.messages(**values), choices, max_reasks=self.max_reasks, stage=stage,
            template=template.id, meter=self.meter, **params,
        )  # fmt: skip

    async def choose(self, template: PromptTemplate, choices: list[str], stage: str,
                     values: dict[str, Any], **params: Any) -> str:  # fmt: skip
        """One of ``choices`` (constrained on vLLM); ``StageFailed`` when none can be read."""
        parsed = await self.choice(template, choices, stage, values, **params)
        if not parsed.ok:
            raise StageFailed(stage, parsed)
        return parsed.value

    async def label_score(self, template: PromptTemplate, stage: str, values: dict[str, Any],
                          **params: Any) -> LabelScore:  # fmt: skip
        scored = await self.client.label_score(
            template.messages(**values), max_reasks=self.max_reasks, stage=stage,
            template=template.id, meter=self.meter, **params,
        )  # fmt: skip
        if scored.status != "ok":
            raise StageFailed(stage, error=scored.error)
        return scored

    async def run_tools(self, messages: list[dict], tools: list[Tool], *, stage: str,
                        template: str | None = None, **params: Any) -> ToolRun:  # fmt: skip
        return await self.client.run_tools(
            messages, tools, stage=stage, template=template, meter=self.meter, **params
        )

    def usage(self) -> dict[str, dict[str, Any]]:
        return {stage: u.as_dict() for stage, u in self.meter.items()}

    def result(self, status: Status, score: float | None, explanation: str) -> ItemResult:
        return ItemResult(
            id=self.item_id, status=status, score=score, explanation=explanation,
            details=self.details, usage=self.usage(),
        )  # fmt: skip

    def failed(self, failure: StageFailure, status: Status, explanation: str) -> ItemResult:
        return ItemResult(
            id=self.item_id, status=status, explanation=explanation, details=self.details,
            usage=self.usage(), failure=failure,
        )  # fmt: skip
