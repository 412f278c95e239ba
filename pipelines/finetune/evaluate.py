"""Measuring a claim extractor against its teacher on held-out paragraphs: claim-level precision,
recall and F1 by a matcher (normalised exact match, or bidirectional NLI entailment with a
cross-encoder), claims per paragraph and the unparseable rate -- for the base model and for the
adapter side by side (one run each, same prompts, greedy decoding)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
    UserError,
)
from groundcover.inputs import ModelName, NotContent, iter_jsonl
from groundcover.models import RoleSpec, role_evaluator
from groundcover.stats import precision_recall_f1

from ..shared.claims import extract_claims, parse_claims


class EvalOptions(FrameworkOptions):
    input: InputFile = Field(description="validation.jsonl from `finetune claims data`")
    extractor: Annotated[
        str | None, NotContent("an adapter the run serves: known by the role's adapter digest")
    ] = Field(None, description="adapter (None: the base model alone)")
    matcher: Literal["exact", "nli"] = Field(
        "exact", description="how a claim is matched: exact text or mutual entailment"
    )
    nli_model: ModelName | None = Field(None, description="NLI cross-encoder (matcher nli)")
    nli_device: str = "cpu"
    limit: int | None = Field(None, ge=1, description="only the first N examples")
    list_max_items: int = Field(60, ge=1, le=500)
    line_max_chars: int = Field(300, ge=20, le=2000)

    @model_validator(mode="after")
    def _nli(self) -> EvalOptions:
        if self.matcher == "nli" and not self.nli_model:
            raise ValueError("matcher nli needs nli_model")
        return self


class Example(BaseModel):
    id: str
    paragraph: str
    claims: list[str]


def read_validation(path: Path) -> list[Example]:
    examples = []
    for lineno, row in iter_jsonl(path):
        messages = row.get("messages")
        if not isinstance(messages, list) or len(messages) < 2:
            raise UserError(f"{path}:{lineno}: field messages: needs the chat example")
        paragraph = row.get("paragraph") or _paragraph_of(messages)
        try:
            claims = parse_claims(messages[-1].get("content", ""))
        except Exception as exc:
            raise UserError(f"{path}:{lineno}: field messages: no teacher claims ({exc})") from exc
        if paragraph is None:
            raise UserError(f"{path}:{lineno}: field messages: no paragraph found in the prompt")
        examples.append(Example(id=str(row.get("id", lineno)), paragraph=paragraph, claims=claims))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples


def _paragraph_of(messages: list[dict]) -> str | None:
    """The paragraph inside the extract_claims prompt (the text after the last 'Text:')."""
    prompt = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    found = re.findall(r"^Text: (.*?)\nClaims:\s*$", prompt, re.MULTILINE | re.DOTALL)
    return found[-1].strip() if found else None


def normalise(claim: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", claim.lower()).split())


def match_exact(predicted: list[str], gold: list[str]) -> tuple[int, int]:
    """(predicted claims matched, gold claims matched) under normalised equality."""
    p, g = {normalise(c) for c in predicted}, {normalise(c) for c in gold}
    return sum(normalise(c) in g for c in predicted), sum(normalise(c) in p for c in gold)


class ClaimsEval(Framework[EvalOptions, Example]):
    name = "finetune-eval"
    Options = EvalOptions
    roles = {"extract": "the claim extractor under test (base model or adapter)"}
    stage_roles = {"claims": "extract"}

    def load(self, options: EvalOptions) -> list[Example]:
        return read_validation(options.input)[: options.limit]

    def setup(self, request, root: Path) -> Any:
        options: EvalOptions = request.options
        if options.matcher == "nli":
            from ...retrieval.nli import NliScorer

            return NliScorer(options.nli_model, device=options.nli_device)  # type: ignore[arg-type]
        return None

    async def solve(self, item: Example, ctx: ItemContext) -> ItemResult:
        predicted = await extract_claims(ctx, item.paragraph)
        if ctx.options.matcher == "nli":
            matched = await asyncio.to_thread(match_nli, ctx.resources, predicted, item.claims)
        else:
            matched = match_exact(predicted, item.claims)
        scores = precision_recall_f1(matched[0], len(predicted), matched[1], len(item.claims))
        ctx.details |= {
            "predicted": predicted,
            "teacher": item.claims,
            **scores,
            "matched": {"predicted": matched[0], "teacher": matched[1]},
        }
        if scores["f1"] is None:
            return ctx.result("undefined", None, "no claims on either side")
        explanation = (
            f"{matched[0]}/{len(predicted)} predicted claims match, "
            f"{matched[1]}/{len(item.claims)} teacher claims found"
        )
        return ctx.result("ok", scores["f1"], explanation)


def match_nli(scorer, predicted: list[str], gold: list[str]) -> tuple[int, int]:
    """A pair matches when each entails the other (argmax entailment both ways)."""
    pairs = [(p, g) for p in predicted for g in gold]
    if not pairs:
        return 0, 0
    forward = scorer.labels(pairs)
    backward = scorer.labels([(g, p) for p, g in pairs])
    both = {
        pair for pair, f, b in zip(pairs, forward, backward, strict=True) if f == b == "entailment"
    }
    return (
        sum(any((p, g) in both for g in gold) for p in predicted),
        sum(any((p, g) in both for p in predicted) for g in gold),
    )


class CompareOptions(BaseModel):
    metric: EvalOptions


class Compare(Study[CompareOptions]):
    """The base model and the adapter on the same validation set: one run each, one table."""

    name = "finetune-compare"
    Options = CompareOptions
    roles = ClaimsEval.roles

    def load(self, options: CompareOptions) -> list[Example]:
        return CLAIMS_EVAL.load(options.metric)

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        metric = request.options.metric
        model = request.role("extract")
        base = metric.model_copy(update={"extractor": None})
        without = model.model_copy(update={"adapter": None})
        plans = [
            RunPlan(
                "base", "claims-eval-base", base, framework=CLAIMS_EVAL, roles={"extract": without}
            )
        ]
        if metric.extractor:
            adapter = role_evaluator(model, RoleSpec(adapter=metric.extractor))
            plans.append(
                RunPlan(
                    "adapter",
                    "claims-eval-adapter",
                    metric,
                    framework=CLAIMS_EVAL,
                    roles={"extract": adapter},
                )
            )
        return plans

    def combine(self, outcomes: dict[str, RunOutcome], options: CompareOptions) -> dict:
        return {name: summary_row(outcome.results) for name, outcome in outcomes.items()}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        columns = ("micro P", "micro R", "micro F1", "macro F1", "claims/paragraph", "unparseable")
        table = Table("extractor", *columns, title="claims vs the teacher's")
        for name, row in combined.items():
            cells = [_fmt(row["micro"][k]) for k in ("precision", "recall", "f1")]
            table.add_row(
                name,
                *cells,
                _fmt(row["macro_f1"]),
                _fmt(row["claims_per_paragraph"]),
                f"{row['unparseable_rate']:.1%}",
            )
        console.print(table)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_row(results: Sequence[ItemResult]) -> dict[str, Any]:
    done = [r for r in results if "predicted" in r.details]
    n_pred = sum(len(r.details["predicted"]) for r in done)
    n_gold = sum(len(r.details["teacher"]) for r in done)
    m_pred = sum(r.details["matched"]["predicted"] for r in done)
    m_gold = sum(r.details["matched"]["teacher"] for r in done)
    f1s = [r.score for r in results if r.score is not None]
    return {
        "items": len(results),
        "micro": precision_recall_f1(m_pred, n_pred, m_gold, n_gold),
        "macro_f1": sum(f1s) / len(f1s) if f1s else None,
        "claims_per_paragraph": n_pred / len(done) if done else None,
        "unparseable_rate": sum(r.status == "unparseable" for r in results) / len(results)
        if results
        else 0.0,
    }


CLAIMS_EVAL = ClaimsEval()
COMPARE = Compare()
