"""groundcover: grounding and coverage of long-form and retrieval-augmented answers.

The public face, for users and framework authors alike; every other module is internal and may
move. Run a framework from Python::

    import groundcover

    done = groundcover.evaluate("garage", options={"input": "examples/garage.jsonl"})
    print(done.only.summary.mean_score)

Write one (``docs/write-a-framework.md``): subclass ``Framework`` with a ``FrameworkOptions``
model, ask the judge through the ``ItemContext`` its ``solve`` gets, return ``ItemResult`` s,
and register the object in the ``groundcover.frameworks`` entry-point group. The built-in
frameworks import only these names from the runtime (``tests/test_contract.py`` holds them to it).

Names load when first used, so ``import groundcover`` costs nothing a command's ``--help``
would notice; the imports under ``TYPE_CHECKING`` below are the one list of what is public.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the Python API
    from .pipelines.api import Evaluation, evaluate, score_item

    # answers made elsewhere (``--answers``)
    from .pipelines.runtime.contract.answers import AnswerFile, GivenAnswers

    # commands and flags, declared as data (the CLI builds them from the options' fields)
    from .pipelines.runtime.contract.commands import NLI_PLACEMENT, Command, Flag, flags

    # configuration, readers and the one-line error
    from .pipelines.runtime.contract.config import (
        EvaluatorConfig,
        RecordId,
        Strict,
        UserError,
        describe_validation,
        iter_jsonl,
        read_jsonl,
        read_text,
    )

    # judge panels: how members' answers combine, and human labels beside a run's decision
    from .pipelines.runtime.contract.panels import Average, HumanLabel, PanelRule, Vote

    # a framework, its options and the per-item context it solves in; studies of several runs
    from .pipelines.runtime.contract.protocol import (
        Framework,
        FrameworkOptions,
        ItemContext,
        RunOutcome,
        RunPlan,
        RunRequest,
        Study,
    )

    # per-item results and statuses
    from .pipelines.runtime.contract.results import (
        ItemResult,
        ItemText,
        Judgement,
        StageFailed,
        StageFailure,
        Status,
        SwapPair,
        not_scored,
    )

    # which model plays which role
    from .pipelines.runtime.contract.roles import (
        RoleSpec,
        model_name,
        responder_config,
        role_evaluator,
    )

    # paper grids: one run per model, the published values beside ours
    from .pipelines.runtime.execution.grid import ModelGrid, Published, cell_text, published_row

    # where a cross-encoder runs (in process, a Ray Serve app, Ray Data)
    from .pipelines.runtime.execution.nli_placement import (
        PLACEMENT_FIELDS,
        NliPlacement,
        placement_of,
    )

    # one item solved outside a run (a study that solves items of another framework)
    from .pipelines.runtime.execution.solve import solve_item

    # metric helpers
    from .pipelines.runtime.stats import (
        Interval,
        bca_interval,
        paired_test,
        precision_recall_f1,
    )

    # which option fields are inputs known by content (the run's identity)
    from .pipelines.runtime.store.provenance import (
        Content,
        IndexDir,
        InputDir,
        InputFile,
        ModelName,
        NotContent,
    )

    # what a run directory holds
    from .pipelines.runtime.store.run_dir import (
        MANIFEST,
        RESULTS,
        atomic_write_json,
        read_manifest,
        results_by_id,
    )

    # the evaluator client a stage asks through, and prompt templates
    from .serving.client import EvalClient, LabelScore, Parsed, Tool
    from .serving.parsing import ParseError, bullet_list, bullets, extract_json
    from .serving.templates import PromptTemplate, load_dir, load_variants

__all__ = [
    "MANIFEST",
    "NLI_PLACEMENT",
    "PLACEMENT_FIELDS",
    "RESULTS",
    "AnswerFile",
    "Average",
    "Command",
    "Content",
    "EvalClient",
    "Evaluation",
    "EvaluatorConfig",
    "Flag",
    "Framework",
    "FrameworkOptions",
    "GivenAnswers",
    "HumanLabel",
    "IndexDir",
    "InputDir",
    "InputFile",
    "Interval",
    "ItemContext",
    "ItemResult",
    "ItemText",
    "Judgement",
    "LabelScore",
    "ModelGrid",
    "ModelName",
    "NliPlacement",
    "NotContent",
    "PanelRule",
    "ParseError",
    "Parsed",
    "PromptTemplate",
    "Published",
    "RecordId",
    "RoleSpec",
    "RunOutcome",
    "RunPlan",
    "RunRequest",
    "StageFailed",
    "StageFailure",
    "Status",
    "Strict",
    "Study",
    "SwapPair",
    "Tool",
    "UserError",
    "Vote",
    "atomic_write_json",
    "bca_interval",
    "bullet_list",
    "bullets",
    "cell_text",
    "describe_validation",
    "evaluate",
    "extract_json",
    "flags",
    "iter_jsonl",
    "load_dir",
    "load_variants",
    "model_name",
    "not_scored",
    "paired_test",
    "placement_of",
    "precision_recall_f1",
    "published_row",
    "read_jsonl",
    "read_manifest",
    "read_text",
    "responder_config",
    "results_by_id",
    "role_evaluator",
    "score_item",
    "solve_item",
]

__version__ = "0.1.0"


@cache
def _where() -> dict[str, str]:
    """Public name -> its module, read from the ``TYPE_CHECKING`` imports of this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.asname or alias.name: f"{__name__}.{node.module}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    module = _where().get(name)
    if module is None:
        raise AttributeError(f"module 'groundcover' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
