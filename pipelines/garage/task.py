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
from pathlib import Path
from typing import Any

from pipelines.garage.data import DIMENSIONS, Record, citations, quality_band
from serving.client import EvalClient
from serving.templates import load_dir

PROMPTS = load_dir(Path(__file__).parent / "prompts")
ELIGIBILITY = ["No Issues", "Minor Issue(s)", "Major Issue(s)"]
SUPPORT = ["supported", "unsupported", "contradictory", "no attribution needed"]
FACTUAL = {"supported", "no attribution needed"}
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_MARKERS = re.compile(r"\s*(\[\d+(?:\s*,\s*\d+)*\]|【\d+】)")


def sentences(answer: str) -> list[str]:
    """Sentences of the answer without citation markers (what the judge checks)."""
    clean = _MARKERS.sub("", answer or "").strip()
    return [s.strip() for s in _SENTENCE.split(clean) if s.strip()]


def attribution(predicted: set[int], gold: set[int]) -> dict[str, float | None]:
    """Citation precision / recall / F1; None where the denominator is empty (never a silent 0)."""
    hits = len(predicted & gold)
    precision = hits / len(predicted) if predicted else None
    recall = hits / len(gold) if gold else None
    f1 = (2 * precision * recall / (precision + recall) if precision and recall
          else 0.0 if precision is not None and recall is not None else None)  # fmt: skip
    return {"precision": precision, "recall": recall, "f1": f1}


class JudgeFailed(Exception):
    def __init__(self, stage: str, parsed):
        self.stage, self.parsed = stage, parsed
        super().__init__(f"{stage}: {parsed.error}")


async def _choose(client: EvalClient, name: str, choices: list[str], stage: str, **values) -> str:
    template = PROMPTS[name]
    parsed = await client.choice(template.messages(**values), choices, stage=stage,
                                 template=template.id, max_tokens=16)  # fmt: skip
    if not parsed.ok:
        raise JudgeFailed(stage, parsed)
    return parsed.value


async def support_labels(client, passages: list[str], answer_sentences: list[str], stage: str):
    if not passages:  # nothing to rest on: every claim is unsupported, asked or not
        return ["unsupported"] * len(answer_sentences)
    return list(await asyncio.gather(*(
        _choose(client, "support", SUPPORT, stage, passages=passages, sentence=s)
        for s in answer_sentences
    )))  # fmt: skip


async def evaluate_record(client: EvalClient, record: Record) -> dict[str, Any]:
    template = PROMPTS["answer"]
    passages = [p.model_dump() for p in record.grounding]
    result = await client.chat(
        template.messages(question=record.question, question_date=record.question_date,
                          passages=passages),
        stage="answer", template=template.id,
    )  # fmt: skip
    answer = result.text.strip()
    out: dict[str, Any] = {
        "answer": answer, "expects_deflection": record.expects_deflection,
        "dimensions": {name: record.dimension(name) for name in DIMENSIONS},
        "grounding_quality": quality_band(record.relevant_share),
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
    }  # fmt: skip
    if not answer:
        return out | {"status": "abstained", "explanation": "the model returned no text"}
    try:
        deflected = await _choose(client, "deflection", ["missing", "attempted"], "deflection",
                                  question=record.question, answer=answer) == "missing"  # fmt: skip
        out["deflected"] = deflected
        out["attribution"] = attribution(citations(answer, len(record.grounding)),
                                         record.human_citations)  # fmt: skip
        if not record.expects_deflection:
            eligibility = await _choose(
                client, "eligibility", ELIGIBILITY, "eligibility", question=record.question,
                reference=record.answer_generate, answer=answer,
            )  # fmt: skip
            parts = sentences(answer)
            texts = [p.text for p in record.grounding]
            relevant = [p.text for p, r in zip(record.grounding, record.evidence_relevant,
                                              strict=True) if r]  # fmt: skip
            all_labels, relevant_labels = await asyncio.gather(
                support_labels(client, texts, parts, "support-all"),
                support_labels(client, relevant, parts, "support-relevant"),
            )
            factual = bool(parts) and all(label in FACTUAL for label in all_labels)
            raf_factual = bool(parts) and all(label in FACTUAL for label in relevant_labels)
            eligible = eligibility != "Major Issue(s)"
            out |= {
                "eligibility": eligibility, "eligible": eligible,
                "sentences": [{"text": s, "all": a, "relevant": r}
                              for s, a, r in zip(parts, all_labels, relevant_labels, strict=True)],
                "unadjusted_factual": factual, "factual": eligible and factual,
                "uraf_factual": raf_factual, "raf": eligible and raf_factual,
            }  # fmt: skip
    except JudgeFailed as failure:
        return out | {"status": "unparseable", "failed_stage": failure.stage,
                      "error": failure.parsed.error, "outputs": failure.parsed.outputs}  # fmt: skip
    return out | {"status": "ok"}


# ---- aggregation -------------------------------------------------------------------------------


def _rate(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Table 2 (judge metrics), Table 3 (deflection), Table 4 (attribution) over ``records``.

    Items that are unparseable or abstained are counted (``not_scored``) and stay out of every
    rate's denominator, which is reported with the rate.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    answerable = [r for r in ok if not r["expects_deflection"]]
    deflection = [r for r in ok if r["expects_deflection"]]
    attributions = [r["attribution"] for r in answerable]
    return {
        "n": len(records),
        "not_scored": {s: sum(r.get("status") == s for r in records)
                       for s in ("unparseable", "abstained")},
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
    }  # fmt: skip


def breakdowns(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The same tables per value of each question dimension and per grounding-quality band."""
    out: dict[str, dict[str, Any]] = {}
    keys = {name: lambda r, n=name: r["dimensions"].get(n) for name in DIMENSIONS}
    keys["grounding_quality"] = lambda r: r["grounding_quality"]
    for name, key in keys.items():
        groups: dict[str, list] = {}
        for r in records:
            value = key(r)
            if value is not None:
                groups.setdefault(value, []).append(r)
        if groups:
            out[name] = {value: summarise(group) for value, group in sorted(groups.items())}
    return out
