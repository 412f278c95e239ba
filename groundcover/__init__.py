"""groundcover: grounding and coverage of long-form and retrieval-augmented answers.

The public face, for users and framework authors alike; every other module is internal and may
move. Run a framework from Python::

    import groundcover

    done = groundcover.evaluate("garage", options={"input": "examples/garage.jsonl"})
    print(done.only.summary.mean_score)

Write one (``docs/write-a-framework.md``): subclass ``Framework`` with a ``FrameworkOptions``
model, ask the judge through the ``ItemContext`` its ``solve`` gets, return ``ItemResult`` s, and
register the object in the ``groundcover.frameworks`` entry-point group (or run its file:
``groundcover eval my_metric.py``). The names here are what a framework author needs; the rest
of the face is in modules by theme:

- ``groundcover.inputs``: option fields known by content, answers files, JSON Lines readers;
- ``groundcover.judges``: panels, human labels, judgements the audits ask again, parsing;
- ``groundcover.models``: the evaluator client, evaluator configuration, roles;
- ``groundcover.runs``: run directories as the runtime reads and writes them;
- ``groundcover.stats``, ``groundcover.grids``, ``groundcover.nli``: metric helpers, paper
  grids, where a cross-encoder runs;
- ``groundcover.testing``: a scripted judge for exact-score tests.

Names load when first used (``_PUBLIC``: name -> module), so ``import groundcover`` costs
nothing a command's ``--help`` would notice.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

# name -> the module (under this package) it comes from
_PUBLIC = {
    "Evaluation": "pipelines.api",
    "evaluate": "pipelines.api",
    "score_item": "pipelines.api",
    "Command": "pipelines.runtime.contract.commands",
    "Flag": "pipelines.runtime.contract.commands",
    "flags": "pipelines.runtime.contract.commands",
    "UserError": "pipelines.runtime.contract.errors",
    "Average": "pipelines.runtime.contract.panels",
    "Cover": "pipelines.runtime.contract.panels",
    "Vote": "pipelines.runtime.contract.panels",
    "Framework": "pipelines.runtime.contract.protocol",
    "FrameworkOptions": "pipelines.runtime.contract.protocol",
    "ItemContext": "pipelines.runtime.contract.context",
    "RunOutcome": "pipelines.runtime.contract.protocol",
    "RunPlan": "pipelines.runtime.contract.protocol",
    "RunRequest": "pipelines.runtime.contract.protocol",
    "Study": "pipelines.runtime.contract.protocol",
    "ItemResult": "pipelines.runtime.contract.results",
    "ItemText": "pipelines.runtime.contract.results",
    "Judgement": "pipelines.runtime.contract.results",
    "StageFailed": "pipelines.runtime.contract.results",
    "not_scored": "pipelines.runtime.contract.results",
    "InputFile": "pipelines.runtime.store.provenance",
    "ParseError": "serving.parsing",
    "PromptTemplate": "serving.templates",
    "load_dir": "serving.templates",
}
# Names the face exported before it was regrouped by theme (0.1.0's first face): each still
# imports from here, with a DeprecationWarning naming its home, until REMOVED_IN. name -> (the
# module it comes from, where to import it now)
REMOVED_IN = "0.3.0"
_MOVED = {
    **{
        name: (theme, f"groundcover.{theme}")
        for theme, names in {
            "inputs": (
                "AnswerFile Content GivenAnswers IndexDir InputDir ModelName NotContent RecordId "
                "Strict describe_validation iter_jsonl read_jsonl read_text"
            ),
            "judges": "HumanLabel SwapPair bullet_list load_variants",
            "models": "EvalClient EvaluatorConfig RoleSpec Tool model_name responder_config "
            "role_evaluator",
            "runs": "MANIFEST RESULTS atomic_write_json read_manifest results_by_id solve_item",
            "stats": "Interval bca_interval paired_test precision_recall_f1",
            "grids": "ModelGrid Published cell_text published_row",
            "nli": "NLI_PLACEMENT NliPlacement PLACEMENT_FIELDS placement_of",
        }.items()
        for name in names.split()
    },
    # no longer public at all: internal modules, which may move without notice
    "LabelScore": ("serving.client", "groundcover.serving.client (internal)"),
    "Parsed": ("serving.client", "groundcover.serving.client (internal)"),
    "bullets": ("serving.parsing", "groundcover.judges.bullet_list"),
    "extract_json": ("serving.parsing", "groundcover.serving.parsing (internal)"),
    "StageFailure": (
        "pipelines.runtime.contract.results",
        "groundcover.pipelines.runtime.contract.results (internal)",
    ),
    "Status": (
        "pipelines.runtime.contract.results",
        "groundcover.pipelines.runtime.contract.results (internal)",
    ),
    "PanelRule": (
        "pipelines.runtime.contract.panels",
        "groundcover.judges.Vote | groundcover.judges.Average | groundcover.judges.Cover",
    ),
}
# the public modules by theme (their own ``__all__`` each)
_THEMES = ("inputs", "judges", "models", "runs", "stats", "grids", "nli", "testing")

if TYPE_CHECKING:  # the same names, for type checkers (tests/test_contract.py holds them equal)
    from .pipelines.api import Evaluation as Evaluation
    from .pipelines.api import evaluate as evaluate
    from .pipelines.api import score_item as score_item
    from .pipelines.runtime.contract.commands import Command as Command
    from .pipelines.runtime.contract.commands import Flag as Flag
    from .pipelines.runtime.contract.commands import flags as flags
    from .pipelines.runtime.contract.context import ItemContext as ItemContext
    from .pipelines.runtime.contract.errors import UserError as UserError
    from .pipelines.runtime.contract.panels import Average as Average
    from .pipelines.runtime.contract.panels import Cover as Cover
    from .pipelines.runtime.contract.panels import Vote as Vote
    from .pipelines.runtime.contract.protocol import Framework as Framework
    from .pipelines.runtime.contract.protocol import FrameworkOptions as FrameworkOptions
    from .pipelines.runtime.contract.protocol import RunOutcome as RunOutcome
    from .pipelines.runtime.contract.protocol import RunPlan as RunPlan
    from .pipelines.runtime.contract.protocol import RunRequest as RunRequest
    from .pipelines.runtime.contract.protocol import Study as Study
    from .pipelines.runtime.contract.results import ItemResult as ItemResult
    from .pipelines.runtime.contract.results import ItemText as ItemText
    from .pipelines.runtime.contract.results import Judgement as Judgement
    from .pipelines.runtime.contract.results import StageFailed as StageFailed
    from .pipelines.runtime.contract.results import not_scored as not_scored
    from .pipelines.runtime.store.provenance import InputFile as InputFile
    from .serving.parsing import ParseError as ParseError
    from .serving.templates import PromptTemplate as PromptTemplate
    from .serving.templates import load_dir as load_dir

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None and name in _MOVED:
        return _moved(name)
    if module is None:
        raise AttributeError(f"module 'groundcover' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def _moved(name: str) -> Any:
    """A name of the earlier face: warned of on every import (never cached here, so each module
    that still uses it is told), then handed over."""
    module, home = _MOVED[name]
    warnings.warn(
        f"groundcover.{name} has moved: import it from {home}; the old name goes in "
        f"groundcover {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*__all__, *_THEMES, "__version__"])
