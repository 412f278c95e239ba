"""GaRAGe: generate a cited answer per question, judge it, and aggregate the paper's tables.

Per item (SPEC §5): eligibility (No / Minor / Major issues against the human answer), per-sentence
support against all grounding and against the relevant passages only (unadjusted factuality and
uRAF), deflection (judge: missing / attempted), attribution P/R/F1 of parsed citations against the
human answer's citations. Aggregates: Eligibility = share without Major Issue(s); Unadjusted
Factuality / uRAF = share with every sentence supported or needing no attribution; Factuality =
eligible and factual; RAF = eligible and uRAF-factual; all on the questions that do not expect a
deflection. Deflection: true-positive rate on deflection items, false-positive rate on the rest.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.console import Console
from rich.table import Table

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    Judgement,
    PromptTemplate,
    Vote,
    load_dir,
    not_scored,
)
from groundcover.inputs import AnswerFile, GivenAnswers
from groundcover.stats import precision_recall_f1

from .data import (
    DIMENSIONS,
    Record,
    citations,
    counts,
    load_records,
    quality_band,
)

PROMPTS = load_dir(Path(__file__).parent / "prompts")
ELIGIBILITY = ["No Issues", "Minor Issue(s)", "Major Issue(s)"]
SUPPORT = ["supported", "unsupported", "contradictory", "no attribution needed"]
FACTUAL = {"supported", "no attribution needed"}
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_MARKERS = re.compile(r"\s*(\[(?:cite_)?\d+(?:\s*,\s*(?:cite_)?\d+)*\]|【\d+】)")


class GarageOptions(FrameworkOptions, GivenAnswers):
    input: InputFile = Field(Path("garage"), description="GaRAGe JSONL, or a dataset name")
    limit: int | None = Field(None, ge=1, description="only the first N records")


def sentences(answer: str) -> list[str]:
    """Sentences of the answer without citation markers (what the judge checks)."""
    clean = _MARKERS.sub("", answer or "").strip()
    return [s.strip() for s in _SENTENCE.split(clean) if s.strip()]


def attribution(predicted: set[int], gold: set[int]) -> dict[str, float | None]:
    """Citation precision / recall / F1; None where the denominator is empty (never a silent 0)."""
    hits = len(predicted & gold)
    return precision_recall_f1(hits, len(predicted), hits, len(gold))


class Garage(Framework[GarageOptions, Record]):
    name = "garage"
    Options = GarageOptions
    prompts = PROMPTS
    roles = {
        "answer": "the benchmarked model (none with --answers)",
        "judge": "eligibility, per-sentence support, deflection",
    }
    stage_roles = {"answer": "answer", "*": "judge"}
    # a judge panel: labels by strict majority; a tie gives the answer the lesser credit
    panel_rules = {
        "eligibility": Vote(tie="Major Issue(s)", order=tuple(ELIGIBILITY)),
        "support-*": Vote(tie="unsupported", labels=tuple(SUPPORT)),
        "deflection": Vote(tie="attempted", labels=("missing", "attempted")),
    }
    # answers with the benchmark's numbered citation markers; one for no record of ours is not
    # scored, a record without one is counted as such
    answer_file = AnswerFile(id_field="sample_id", missing="not scored, counted")

    def known_calls(self, item: Record, options: GarageOptions) -> dict[str, int]:
        return {"answer": 1} if options.answers is None else {}

    def roles_used(self, options: GarageOptions) -> list[str]:
        return ["answer", "judge"] if options.answers is None else ["judge"]

    def load(self, options: GarageOptions) -> list[Record]:
        return load_records(options.input, options.limit)

    def check_inputs(self, options: GarageOptions) -> None:
        print_counts(options.input, counts(self.load(options)))

    async def solve(self, record: Record, ctx: ItemContext) -> ItemResult:
        """Answer from the numbered passages (or take the answer made elsewhere), then judge.
        The item's score is its contribution to the headline rate: RAF (eligible and
        relevance-aware factual) for an answerable question, a deflection for a question that
        expects one."""
        ctx.details |= {
            "expects_deflection": record.expects_deflection,
            "dimensions": {name: record.dimension(name) for name in DIMENSIONS},
            "grounding_quality": quality_band(record.relevant_share),
            "unannotated": record.unannotated,
        }
        if ctx.answered_elsewhere:
            given = ctx.given_answer()
            if given is None:
                ctx.details["missing_answer"] = True
                return ctx.result(
                    "abstained",
                    None,
                    "the answers file has no answer for this sample_id: not scored, counted",
                )
            answer = given.strip()
        else:
            answer = await generate_answer(ctx, record)
        ctx.details["answer"] = answer
        if not answer:
            return ctx.result("abstained", None, "the model returned no text")
        deflected = (
            await ctx.choose(
                PROMPTS["deflection"],
                ["missing", "attempted"],
                "deflection",
                {"question": record.question, "answer": answer},
                max_tokens=16,
            )
            == "missing"
        )
        ctx.details["deflected"] = deflected
        ctx.details["attribution"] = attribution(
            citations(answer, len(record.grounding)), record.human_citations
        )
        if record.expects_deflection:
            verdict = "deflected, as expected" if deflected else "answered instead of deflecting"
            return ctx.result("ok", float(deflected), verdict)
        await judge_answer(ctx, record, answer)
        d = ctx.details
        explanation = (
            f"{d['eligibility']}; {sum(s['all'] in FACTUAL for s in d['sentences'])} of "
            f"{len(d['sentences'])} sentences factual against all passages, "
            f"{sum(s['relevant'] in FACTUAL for s in d['sentences'])} against the "
            f"relevant ones: RAF {int(d['raf'])}"
        )
        return ctx.result("ok", float(d["raf"]), explanation)

    def judgements(
        self, item: Record, record: ItemResult, options: GarageOptions
    ) -> list[Judgement]:
        """The judge's recorded labels: deflection, eligibility and each sentence's support
        against all passages and against the relevant ones (none for a sentence with no
        passage to rest on: a rule labelled it)."""
        d, answer = record.details, record.details.get("answer")
        if not isinstance(answer, str) or "deflected" not in d:
            return []
        found = [
            Judgement(
                "deflection",
                "0",
                "missing" if d["deflected"] else "attempted",
                {"question": item.question, "answer": answer},
            )
        ]
        if "eligibility" in d:
            asked = {"question": item.question, "reference": item.answer_generate, "answer": answer}
            found.append(Judgement("eligibility", "0", d["eligibility"], asked))
        texts = [p.text for p in item.grounding]
        relevant = [p.text for p, r in zip(item.grounding, item.relevant, strict=True) if r]
        for n, sentence in enumerate(d.get("sentences") or []):
            for stage, field, passages in (
                ("support-all", "all", texts),
                ("support-relevant", "relevant", relevant),
            ):
                if passages:
                    values = {"passages": passages, "sentence": sentence["text"]}
                    found.append(Judgement(stage, str(n), sentence[field], values))
        return found

    async def ask_judgement(
        self, ctx: ItemContext, judgement: Judgement, template: PromptTemplate | None = None
    ) -> str:
        stage = judgement.stage
        kind = "support" if stage.startswith("support-") else stage
        choices = {"deflection": ["missing", "attempted"], "eligibility": ELIGIBILITY}
        return await ctx.choose(
            template or PROMPTS[kind],
            choices.get(kind, SUPPORT),
            stage,
            judgement.values,
            max_tokens=16,
        )

    def tables_file(self, options: GarageOptions) -> str:
        return "tables.json"

    def aggregate(self, results: list[ItemResult], options: GarageOptions) -> dict[str, Any]:
        return summarise(results) | {"breakdowns": breakdowns(results)}

    def render(self, tables: dict[str, Any], console: Console) -> None:
        print_tables(tables, console)

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        if not tables:
            return []
        table2 = {k: v for k, v in tables["table2"].items() if k != "n" and v is not None}
        if not table2:
            return []
        spec = {
            "kind": "bars",
            "labels": list(table2),
            "values": list(table2.values()),
            "ylabel": "share of answerable questions",
        }
        return [("GaRAGe Table 2", spec)]


async def generate_answer(ctx: ItemContext, record: Record) -> str:
    """The answering model's answer from the numbered passages, with [n] citations."""
    template = PROMPTS["answer"]
    passages = [p.model_dump() for p in record.grounding]
    result = await ctx.chat(
        template.messages(
            question=record.question, question_date=record.question_date, passages=passages
        ),
        stage="answer",
        template=template.id,
    )
    return result.text.strip()


async def support_labels(ctx: ItemContext, passages: list[str], parts: list[str], stage: str):
    if not passages:  # nothing to rest on: every claim is unsupported, asked or not
        return ["unsupported"] * len(parts)
    return list(
        await asyncio.gather(
            *(
                ctx.choose(
                    PROMPTS["support"],
                    SUPPORT,
                    stage,
                    {"passages": passages, "sentence": s},
                    max_tokens=16,
                )
                for s in parts
            )
        )
    )


async def judge_answer(ctx: ItemContext, record: Record, answer: str) -> None:
    """Eligibility against the human answer; each sentence's support against all passages and
    against the relevant ones (unadjusted factuality, uRAF); Factuality and RAF follow."""
    eligibility = await ctx.choose(
        PROMPTS["eligibility"],
        ELIGIBILITY,
        "eligibility",
        {"question": record.question, "reference": record.answer_generate, "answer": answer},
        max_tokens=16,
    )
    parts = sentences(answer)
    texts = [p.text for p in record.grounding]
    relevant = [p.text for p, r in zip(record.grounding, record.relevant, strict=True) if r]
    all_labels, relevant_labels = await asyncio.gather(
        support_labels(ctx, texts, parts, "support-all"),
        support_labels(ctx, relevant, parts, "support-relevant"),
    )
    factual = bool(parts) and all(label in FACTUAL for label in all_labels)
    raf_factual = bool(parts) and all(label in FACTUAL for label in relevant_labels)
    eligible = eligibility != "Major Issue(s)"
    ctx.details |= {
        "eligibility": eligibility,
        "eligible": eligible,
        "sentences": [
            {"text": s, "all": a, "relevant": r}
            for s, a, r in zip(parts, all_labels, relevant_labels, strict=True)
        ],
        "unadjusted_factual": factual,
        "factual": eligible and factual,
        "uraf_factual": raf_factual,
        "raf": eligible and raf_factual,
    }


# ---- aggregation -------------------------------------------------------------------------------


def _rate(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summarise(records: list[ItemResult]) -> dict[str, Any]:
    """Table 2 (judge metrics), Table 3 (deflection), Table 4 (attribution) over ``records``.

    Items that are unparseable or abstained are counted (``not_scored``) and stay out of every
    rate's denominator, which is reported with the rate.
    """
    ok = [r.details for r in records if r.status == "ok"]
    answerable = [r for r in ok if not r["expects_deflection"]]
    deflection = [r for r in ok if r["expects_deflection"]]
    attributions = [r["attribution"] for r in answerable]
    return {
        "n": len(records),
        "not_scored": not_scored(records),
        "table2": {
            "n": len(answerable),
            "eligibility": _rate([r["eligible"] for r in answerable]),
            "unadjusted_factuality": _rate([r["unadjusted_factual"] for r in answerable]),
            "factuality": _rate([r["factual"] for r in answerable]),
            "uRAF": _rate([r["uraf_factual"] for r in answerable]),
            "RAF": _rate([r["raf"] for r in answerable]),
        },
        "table3": {
            "n_deflection_items": len(deflection),
            "true_positive_rate": _rate([r["deflected"] for r in deflection]),
            "n_answerable_items": len(answerable),
            "false_positive_rate": _rate([r["deflected"] for r in answerable]),
        },
        "table4": {
            "n": len(attributions),
            "precision": _mean([a["precision"] for a in attributions]),
            "recall": _mean([a["recall"] for a in attributions]),
            "f1": _mean([a["f1"] for a in attributions]),
        },
    }


def breakdowns(records: list[ItemResult]) -> dict[str, dict[str, Any]]:
    """The same tables per value of each question dimension and per grounding-quality band."""
    out: dict[str, dict[str, Any]] = {}

    def dimension(name: str) -> Callable[[ItemResult], Any]:
        return lambda r: r.details["dimensions"].get(name)

    keys = {name: dimension(name) for name in DIMENSIONS}
    keys["grounding_quality"] = lambda r: r.details["grounding_quality"]
    for name, key in keys.items():
        groups: dict[str, list] = {}
        for r in records:
            value = key(r)
            if value is not None:
                groups.setdefault(value, []).append(r)
        if groups:
            out[name] = {value: summarise(group) for value, group in sorted(groups.items())}
    return out


def print_counts(path: Path, found: dict[str, Any]) -> None:
    """What was read, to hold against the paper's 2,366 questions, 35,351 passages, 427
    deflections, Fast-Changing 17.5% / Slow-Changing 49.6%, Web 86.6%."""

    def shares(name: str) -> str:
        return ", ".join(f"{k} {100 * v:.1f}%" for k, v in found[name].items())

    Console(stderr=True, markup=False, emoji=False).print(
        f"{path.name}: {found['questions']} questions, {found['passages']} passages, "
        f"{found['deflection_expected']} expect a deflection, "
        f"{found['unannotated_relevance_labels']} relevance labels not annotated; "
        f"time-sensitivity {shares('time_sensitivity')}; source {shares('source')}",
        highlight=False,
        soft_wrap=True,
    )


def print_tables(tables: dict[str, Any], console: Console) -> None:
    def fmt(value):
        return "-" if value is None else f"{100 * value:.2f}"

    t2, t3, t4 = tables["table2"], tables["table3"], tables["table4"]
    out = Table(
        "Eligibility",
        "Unadj. Factuality",
        "Factuality",
        "uRAF",
        "RAF",
        title=f"GaRAGe Table 2 (n={t2['n']})",
    )
    out.add_row(
        *(fmt(t2[k]) for k in ("eligibility", "unadjusted_factuality", "factuality", "uRAF", "RAF"))
    )
    console.print(out)
    out = Table(
        "deflection TP",
        "deflection FP",
        "attr. P",
        "attr. R",
        "attr. F1",
        title="GaRAGe Tables 3-4",
    )
    out.add_row(
        fmt(t3["true_positive_rate"]),
        fmt(t3["false_positive_rate"]),
        fmt(t4["precision"]),
        fmt(t4["recall"]),
        fmt(t4["f1"]),
    )
    console.print(out)
    console.print(f"not scored: {tables['not_scored']}")


GARAGE = Garage()
