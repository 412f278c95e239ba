"""The first step of every invocation: what it will do, decided before anything is written.

The study's roles and inputs are checked, its items loaded, its runs listed (K seeded repeats
of one run, with ``--repeats``), each run's models chosen per role and asked for at their
endpoints, the drivers' limits checked and the prices read. Whatever is wrong stops here with
one line; what comes out is a ``StudyPlan`` the dry run estimates and the run solves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget.costs import ModelPrice, load_prices, require_prices
from ..contract.config import EvaluatorConfig, UserError
from ..contract.protocol import Framework, RunPlan, RunRequest, Study
from ..contract.roles import judges_without_reasoning
from .drivers import check_drivers
from .identity import members_apart, plan_roles, role_records, study_root
from .model_content import ask_endpoints
from .repeats import repeat_plans
from .solve import console


@dataclass
class StudyPlan:
    """What one invocation of a study will do: its items, where its runs live, and per run the
    evaluator of each role (resolved by content) and the prices of their models."""

    study: Study[Any]
    request: RunRequest
    items: Sequence[Any]
    root: Path
    runs: list[RunPlan]
    roles: list[dict[str, EvaluatorConfig]]  # per run, in the order of ``runs``
    prices: dict[str, ModelPrice]
    cache: Path | None  # the response cache (None: --no-cache)

    @property
    def repeats(self) -> bool:
        return self.request.run.repeats > 1


def plan_study(
    study: Study[Any], request: RunRequest, *, probe: bool, dry_run: bool, no_cache: bool
) -> StudyPlan:
    """The study's plan; ``probe``: ask each endpoint for its models (not a caller's own
    client), ``dry_run``: an endpoint that does not answer is a note, not an error."""
    study.check_roles(list(request.roles))
    if getattr(study, "source", None) and request.run.drivers > 1:
        raise UserError(
            f"--drivers {request.run.drivers}: driver processes find a framework by its entry "
            f"point, and {study.name} runs from its file: install it as a package "
            "(docs/write-a-framework.md) to spread it over drivers"
        )
    items = study.load(request.options)
    study.check_inputs(request.options)
    if isinstance(study, Framework):  # an answers file: read and checked before anything is written
        study.given_answers(request.options, set(study.answer_ids(request.options, items)))
    root = study_root(study, request, items)
    runs = study.plan(request, root)
    if request.run.repeats > 1:
        runs = repeat_plans(study, request, runs)
    frameworks: list[Any] = [run.framework or study for run in runs]
    roles = [plan_roles(fw, run, request) for fw, run in zip(frameworks, runs, strict=True)]
    if study.paper_judges_without_reasoning:
        roles = [judges_without_reasoning(r) for r in roles]
    roles, notes = ask_endpoints(roles, probe=probe, tolerate=dry_run)
    roles = [members_apart(fw, r, request.run) for fw, r in zip(frameworks, roles, strict=True)]
    for note in notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    check_drivers(request, roles)
    prices = load_prices(request.run.prices)
    if request.run.max_cost is not None:
        require_prices(
            [role_records(fw, found) for fw, found in zip(frameworks, roles, strict=True)], prices
        )
    cache = None if no_cache else request.run.cache
    return StudyPlan(study, request, items, root, runs, roles, prices, cache)
