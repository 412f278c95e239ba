"""`groundcover crux build`: CRUX evaluation data from multi-document summarisation records.

Per record {"id", "summary", "documents": [...]} (one item of a resumable run): an open-ended
query from the summary, n sub-questions, documents over 1,024 words cut into 512-word pieces,
each piece rewritten into up to 3 standalone passages (temperature 0.7, top-p 0.95), every
(passage, sub-question) pair rated, the answerable filter, P** and graded qrels for eta = 1..5.
Ratings go through the response cache, so a killed build re-asks nothing it already has.
At the end of every invocation the exchange files are rewritten from the records: topics.jsonl,
passages.jsonl, ratings.jsonl, qrels-eta{1..5}.txt (TREC qrels) and data_card.json -- the inputs
of `eval crux`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.console import Console

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    ParseError,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
    UserError,
)
from groundcover.inputs import Strict, iter_jsonl
from groundcover.judges import bullet_list
from groundcover.runs import atomic_write_json
from groundcover.serving.files import write_atomic

from . import metrics
from .framework import PROMPTS, rate

LONG_DOC, PIECE = 1024, 512  # words
BUILD_ROLES = {"writer": "the query, sub-questions and passages", "rate": "answerability ratings"}


class BuildOptions(FrameworkOptions):
    input: InputFile = Field(description='JSONL: {"id", "summary", "documents": [...]}')
    questions: int = Field(10, ge=1, le=50, description="sub-questions per topic (DUC: 15)")
    limit: int | None = Field(None, ge=1, description="only the first N records")


class Record(Strict):
    id: str
    summary: str
    documents: list[str]


def read_records(path: Path) -> list[Record]:
    records, seen = [], set()
    for lineno, row in iter_jsonl(path):
        rid = str(row.get("id", lineno))
        where = f"{path}:{lineno}: record {rid!r}"
        if not isinstance(row.get("summary"), str) or not row["summary"].strip():
            raise UserError(f"{where}: field summary: missing or not a string")
        documents = row.get("documents")
        if (
            not isinstance(documents, list)
            or not documents
            or not all(isinstance(d, str) and d.strip() for d in documents)
        ):
            raise UserError(f"{where}: field documents: needs a list of non-empty strings")
        if rid in seen:
            raise UserError(f"{where}: duplicate id")
        if ":" in rid or "#" in rid:  # they separate the parts of a passage id
            raise UserError(f"{where}: field id: contains ':' or '#'")
        seen.add(rid)
        records.append(Record(id=rid, summary=row["summary"], documents=documents))
    if not records:
        raise UserError(f"{path}: no records")
    return records


def pieces(document: str) -> list[str]:
    """The document itself, or 512-word pieces when it is longer than 1,024 words."""
    words = document.split()
    if len(words) <= LONG_DOC:
        return [document]
    return [" ".join(words[i : i + PIECE]) for i in range(0, len(words), PIECE)]


def parse_passages(text: str) -> list[str]:
    """Up to 3 passages separated by '###' lines."""
    parts = [" ".join(p.split()) for p in (text or "").split("###")]
    parts = [p for p in parts if p]
    if not parts:
        raise ParseError("expected up to 3 passages separated by lines '###'")
    return parts[:3]


class Build(Framework[BuildOptions, Record]):
    name = "crux-build"
    Options = BuildOptions
    prompts = PROMPTS
    roles = BUILD_ROLES
    stage_roles = {
        "query": "writer",
        "subquestions": "writer",
        "passages": "writer",
        "rate": "rate",
    }

    def load(self, options: BuildOptions) -> list[Record]:
        return read_records(options.input)[: options.limit]

    async def solve(self, item: Record, ctx: ItemContext) -> ItemResult:
        n = ctx.options.questions
        query, questions = await asyncio.gather(
            ctx.ask(
                PROMPTS["query"],
                "query",
                lambda t: t.strip(),
                "the request",
                {"summary": item.summary},
            ),
            ctx.ask(
                PROMPTS["subquestions"],
                "subquestions",
                bullet_list,
                "one '- <question>' per line",
                {"summary": item.summary, "n": n},
                regex=rf"(- [^\n]{{1,200}}\n){{1,{n}}}",
            ),
        )
        sub = questions.value[:n]
        passages: dict[str, str] = {}
        for d, document in enumerate(item.documents):
            written = await asyncio.gather(
                *(
                    ctx.ask(
                        PROMPTS["passages"],
                        "passages",
                        parse_passages,
                        "passages separated by lines '###'",
                        {"text": piece},
                        temperature=0.7,
                        top_p=0.95,
                    )
                    for piece in pieces(document)
                )
            )
            texts = [p for parsed in written for p in parsed.value]
            passages |= {f"{item.id}:{d}#{k}": t for k, t in enumerate(texts)}
        pairs = [(pid, q) for pid in passages for q in range(len(sub))]
        found = await asyncio.gather(*(rate(ctx, sub[q], passages[pid]) for pid, q in pairs))
        ratings = {pid: [-1] * len(sub) for pid in passages}
        for (pid, q), (value, _) in zip(pairs, found, strict=True):
            ratings[pid][q] = value
        kept = metrics.answerable(ratings, len(sub))
        best = metrics.oracle(ratings, list(passages), kept)
        ctx.details |= {
            "query": query.value,
            "questions": sub,
            "passages": passages,
            "ratings": ratings,
            "answerable": kept,
            "oracle": best,
            "unreadable_ratings": sum(v == -1 for v, _ in found),
        }
        if not kept:
            return ctx.result("undefined", None, "no passage answers any sub-question")
        explanation = (
            f"{len(kept)} of {len(sub)} sub-questions answerable from "
            f"{len(passages)} passages; |P**| = {len(best)}"
        )
        return ctx.result("ok", len(kept) / len(sub), explanation)


class BuildStudy(Study[BuildOptions]):
    name = "crux-build-data"
    Options = BuildOptions
    roles = BUILD_ROLES

    def load(self, options: BuildOptions) -> list[Record]:
        return BUILD.load(options)

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        return [RunPlan("records", "crux-build", request.options, framework=BUILD)]

    def combine(self, outcomes: dict[str, RunOutcome], options: BuildOptions) -> dict:
        outcome = outcomes["records"]
        return write_exchange(outcome.dir.parent, outcome.results)

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        console.print(
            f"CRUX data: {combined['topics']} topics, {combined['passages']} passages, "
            f"{combined['ratings']} ratings in {combined['dir']}"
        )


def write_exchange(root: Path, records: Sequence[ItemResult]) -> dict[str, Any]:
    """The exchange files from the finished records (sub-questions kept only if answerable,
    renumbered 0..m-1 in their order)."""
    topics, passages, ratings = [], [], []
    qrels: dict[int, list[str]] = {eta: [] for eta in range(1, 6)}
    for record in sorted(records, key=lambda r: r.id):
        if record.status != "ok":
            continue
        d = record.details
        kept = d["answerable"]
        topics.append(
            {
                "topic": record.id,
                "query": d["query"],
                "questions": [d["questions"][q] for q in kept],
            }
        )
        for pid, text in d["passages"].items():
            passages.append({"id": pid, "topic": record.id, "text": text})
            for new, q in enumerate(kept):
                ratings.append(
                    {
                        "topic": record.id,
                        "passage_id": pid,
                        "question": new,
                        "rating": d["ratings"][pid][q],
                    }
                )
        for eta in qrels:
            answerable = metrics.answerable(d["ratings"], len(d["questions"]), eta)
            best = metrics.oracle(d["ratings"], list(d["passages"]), answerable, eta)
            grades = metrics.graded_qrels(d["ratings"], best, answerable) if answerable else {}
            qrels[eta] += [f"{record.id} 0 {pid} {g}" for pid, g in grades.items()]
    files = {"topics.jsonl": topics, "passages.jsonl": passages, "ratings.jsonl": ratings}
    for name, rows in files.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        write_atomic(root / name, text, within=root)
    for eta, lines in qrels.items():
        write_atomic(root / f"qrels-eta{eta}.txt", "".join(ln + "\n" for ln in lines), within=root)
    not_ok = sum(r.status != "ok" for r in records)
    card = {
        "dir": str(root),
        "topics": len(topics),
        "passages": len(passages),
        "ratings": len(ratings),
        "records_not_ok": not_ok,
    }
    atomic_write_json(root / "data_card.json", card, within=root)
    return card


BUILD = Build()
BUILD_STUDY = BuildStudy()
