"""`groundcover eval crux`: Cov, α-nDCG and Den of a TREC run's top-k contexts per topic.

Where the score comes from: ``Crux.solve`` takes one topic's ranked passages, rates on the fly
the (passage, sub-question) pairs the ratings file lacks (``rate``; cached by the response cache,
so no pair is rated twice across runs) or counts them 0 with ``--no-rate``, and computes the
metrics with ``metrics`` against P** from the ratings file. The item's score is Cov(Z).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import (
    Average,
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    Judgement,
    PromptTemplate,
    StageFailed,
    load_dir,
    not_scored,
)
from groundcover.inputs import AnswerFile, GivenAnswers, IndexDir, ModelName, Strict
from groundcover.judges import load_variants

from . import data, metrics

PROMPTS = load_dir(Path(__file__).parent / "prompts")
VARIANTS = load_variants(Path(__file__).parent / "prompts")  # paraphrases (agreement)


class CruxOptions(FrameworkOptions, GivenAnswers):
    input: InputFile | None = Field(None, description="TREC run file")
    index: IndexDir | None = Field(None, description="or: retrieve in place from this index")
    mode: Literal["bm25", "dense", "hybrid"] = Field(
        "bm25", description="retrieval in place from the index"
    )
    depth: int = Field(20, ge=1, description="passages retrieved per topic in place")
    mmr: float | None = Field(None, gt=0, le=1, description="MMR lambda (in place)")
    reranker: ModelName | None = Field(None, description="cross-encoder reranking (in place)")
    topics: InputFile = Field(description="topics JSONL: topic, query, questions")
    passages: InputFile = Field(description="passages JSONL: id, topic, text")
    ratings: InputFile | None = Field(None, description="ratings JSONL (exchange format)")
    k: int | None = Field(None, ge=1, description="top-k of the run (default: |P**| per topic)")
    eta: int = Field(metrics.ETA, ge=1, le=5, description="answerable at rating >= eta")
    rate: bool = Field(True, description="rate unrated pairs with the evaluator (else count 0)")
    tokenizer: ModelName | None = Field(None, description="HF tokenizer for Den (default: words)")
    generate: bool = Field(False, description="write a RAG answer from Z, then rate it")
    answer_tokens: int = Field(512, ge=16, description="token cap of a generated answer")

    @model_validator(mode="after")
    def _one_source(self) -> CruxOptions:
        if (self.input is None) == (self.index is None):
            raise ValueError("give a run file or an index to retrieve from (exactly one)")
        return self


class TopicItem(Strict):
    id: str
    ranked: list[str]


class Resources:
    def __init__(self, options: CruxOptions):
        self.topics = data.load_topics(options.topics)
        self.passages = data.load_passages(options.passages, self.topics)
        self.ratings = data.load_ratings(options.ratings, self.topics)
        self.tokens = metrics.token_counter(options.tokenizer)


@dataclass
class Texts:
    """The sub-questions and passage texts a run's ratings were asked with."""

    topics: dict[str, Any]
    passages: dict[str, dict[str, str]]


@functools.lru_cache(maxsize=4)
def _read_texts(topics: str, passages: str) -> Texts:
    found = data.load_topics(Path(topics))
    return Texts(found, data.load_passages(Path(passages), found))


def _texts(options: CruxOptions) -> Texts:
    """Read once per run's files (an audit asks for them record by record)."""
    return _read_texts(str(options.topics), str(options.passages))


# the paper's rater: greedy, a few tokens (a panel of one model sampled apart cannot differ here)
RATE_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8}


async def rate(
    ctx: ItemContext,
    question: str,
    text: str,
    stage: str = "rate",
    template: PromptTemplate | None = None,
) -> tuple[int, str | None]:
    """The judge at temperature 0 with a few output tokens; the first digit is the rating. An
    answer without one (or with 6-9 on the 0-5 scale) is re-asked; still none -> -1, counted 0
    as the authors count it, and counted in ``details["unreadable"]`` (never silently).
    ``template``: a paraphrase of the rating prompt (``agreement --paraphrase``)."""
    parsed = await ctx.attempt(
        template or PROMPTS["rate"],
        stage,
        metrics.read_rating,
        "a rating from 0 to 5",
        {"question": question, "text": text},
        **RATE_SAMPLING,
    )
    if not parsed.ok:
        ctx.details["unreadable"] = ctx.details.get("unreadable", 0) + 1
        return -1, parsed.outputs[-1]
    # no output: people rated it (a rating every tier of a judge cascade abstained on)
    return parsed.value, parsed.outputs[-1] if parsed.outputs else None


class Crux(Framework[CruxOptions, TopicItem]):
    name = "crux"
    Options = CruxOptions
    prompts = PROMPTS
    roles = {
        "rate": "answerability of passages and answers (the paper: a 70B rater)",
        "generate": "the RAG answer from Z (--generate; the paper: an 8B generator)",
    }
    stage_roles = {"rate": "rate", "rate_answer": "rate", "answer": "generate"}
    # a rating panel: the median of the 0-5 ratings (ordinal)
    panel_rules = {
        "rate": Average("median", level="ordinal"),
        "rate_answer": Average("median", level="ordinal"),
    }
    stage_sampling = {"rate": RATE_SAMPLING, "rate_answer": RATE_SAMPLING}
    prompt_variants = {"rate": VARIANTS["rate"], "rate_answer": VARIANTS["rate"]}
    # the results to rate, per topic; a topic the topics file lacks is refused
    answer_file = AnswerFile(id_field="topic", unknown="error", missing="no Cov(y)")

    def answer_ids(self, options: CruxOptions, items: Sequence[Any]) -> list[str]:
        return list(data.load_topics(options.topics))

    def roles_used(self, options: CruxOptions) -> list[str]:
        rates = options.rate or options.generate or options.answers is not None
        return ["rate"] * rates + ["generate"] * options.generate

    def load(self, options: CruxOptions) -> list[TopicItem]:
        topics = data.load_topics(options.topics)
        if options.input is not None:
            run = data.load_run(options.input, topics)
        else:  # our retrieval pipeline in place: each topic's query against the index
            from ...retrieval.index import CrossEncoderReranker, SearchIndex

            index = SearchIndex.load(options.index)  # type: ignore[arg-type]
            queries = [t.query for t in topics.values()]
            reranker = CrossEncoderReranker(options.reranker) if options.reranker else None
            hits = index.search(
                queries, options.depth, options.mode, mmr=options.mmr, reranker=reranker
            )
            run = {t: [h.doc_id for h in found] for t, found in zip(topics, hits, strict=True)}
            index.close()
        return [TopicItem(id=t, ranked=list(dict.fromkeys(docs))) for t, docs in run.items()]

    def check_inputs(self, options: CruxOptions) -> None:
        topics = data.load_topics(options.topics)
        data.load_passages(options.passages, topics)
        data.load_ratings(options.ratings, topics)

    def setup(self, request, root: Path) -> Resources:
        return Resources(request.options)

    def judgements(
        self, item: TopicItem, record: ItemResult, options: CruxOptions
    ) -> list[Judgement]:
        """The ratings the run's rater gave: of passages (``rate``) and of the answer
        (``rate_answer``), each with its sub-question and text (none that stayed unreadable)."""
        texts = _texts(options)
        questions = texts.topics[item.id].questions
        passages = texts.passages.get(item.id) or {}
        found = []
        for rated in record.details.get("rated") or []:
            pid, q, rating = rated["passage_id"], rated["question"], rated["rating"]
            if rating >= 0 and pid in passages:
                values = {"question": questions[q], "text": passages[pid]}
                found.append(Judgement("rate", f"{pid}|{q}", rating, values))
        answer = record.details.get("answer")
        for q, rating in enumerate(record.details.get("answer_ratings") or []):
            if rating >= 0 and isinstance(answer, str):
                values = {"question": questions[q], "text": answer}
                found.append(Judgement("rate_answer", f"y|{q}", rating, values))
        return found

    async def ask_judgement(
        self, ctx: ItemContext, judgement: Judgement, template: PromptTemplate | None = None
    ) -> float:
        values = judgement.values
        parsed = await ctx.attempt(
            template or PROMPTS["rate"],
            judgement.stage,
            metrics.read_rating,
            "a rating from 0 to 5",
            values,
            **RATE_SAMPLING,
        )
        if not parsed.ok:
            raise StageFailed(judgement.stage, parsed)
        return parsed.value

    async def solve(self, item: TopicItem, ctx: ItemContext) -> ItemResult:
        options: CruxOptions = ctx.options
        res: Resources = ctx.resources
        topic = res.topics[item.id]
        n = len(topic.questions)
        known = res.ratings[item.id]
        questions = metrics.answerable(known, n, options.eta)
        in_file = res.passages[item.id]  # file order is P**'s tie order
        order = [p for p in in_file if p in known] + [p for p in known if p not in in_file]
        best = metrics.oracle(known, order, questions, options.eta)
        depth = options.k or len(best)
        context = item.ranked[:depth]
        ctx.details |= {
            "topic": item.id,
            "answerable": questions,
            "oracle": best,
            "context": context,
            "depth": depth,
        }
        if not questions:
            return ctx.result("undefined", None, "no answerable sub-question for this topic")
        ratings = {pid: list(known.get(pid, [-1] * n)) for pid in context}
        missing = [(pid, q) for pid in context for q in questions if ratings[pid][q] < 0]
        ctx.details["unrated"] = len(missing)
        if missing and options.rate:
            texts = res.passages[item.id]
            unknown = [pid for pid, _ in missing if pid not in texts]
            if unknown:
                ctx.details["no_text"] = sorted(set(unknown))
            jobs = [(pid, q) for pid, q in missing if pid in texts]
            found = await asyncio.gather(
                *(rate(ctx, topic.questions[q], texts[pid]) for pid, q in jobs)
            )
            rated = []
            for (pid, q), (value, raw) in zip(jobs, found, strict=True):
                ratings[pid][q] = value
                rated.append({"passage_id": pid, "question": q, "rating": value, "output": raw})
            ctx.details["rated"] = rated
        cov = metrics.coverage(context, ratings, questions, options.eta)
        oracle_cov = metrics.coverage(best, known, questions, options.eta)
        texts = res.passages[item.id]
        tokens = res.tokens(" ".join(texts.get(p, "") for p in context))
        oracle_tokens = res.tokens(" ".join(texts.get(p, "") for p in best))
        den = metrics.density(cov, tokens, oracle_cov, oracle_tokens)
        full = {**known, **ratings}
        ndcg = metrics.alpha_ndcg(
            {item.id: context}, {item.id: full}, {item.id: questions}, {item.id: depth}, options.eta
        )
        ctx.details |= {
            "cov": cov,
            "alpha_ndcg": ndcg.get(item.id, 0.0),
            "den": den,
            "tokens": tokens,
            "oracle_tokens": oracle_tokens,
        }
        answer = await self._answer(ctx, item, topic.query, [texts.get(p, "") for p in context])
        if answer is not None:
            await self._rate_answer(ctx, topic, answer, questions, oracle_cov, oracle_tokens)
        unreadable = ctx.details.get("unreadable", 0)
        note = f"; {unreadable} ratings unreadable after re-asks (counted 0)" if unreadable else ""
        return ctx.result(
            "ok",
            cov,
            f"{round((cov or 0) * len(questions))} of {len(questions)} "
            f"answerable sub-questions covered by the top {depth}{note}",
        )

    async def _answer(
        self, ctx: ItemContext, item: TopicItem, query: str, context: list[str]
    ) -> str | None:
        """The result y: given in --answers, or written from Z with --generate, else None."""
        if ctx.options.generate:
            parsed = await ctx.ask(
                PROMPTS["answer"],
                "answer",
                lambda t: t.strip(),
                "the answer",
                {"query": query, "passages": context},
                max_tokens=ctx.options.answer_tokens,
            )
            return parsed.value
        return ctx.given_answer() if ctx.answered_elsewhere else None

    async def _rate_answer(
        self,
        ctx: ItemContext,
        topic: data.Topic,
        answer: str,
        questions: list[int],
        oracle_cov: float | None,
        oracle_tokens: int,
    ) -> None:
        """Cov(y) and Den(y): y rated against every answerable sub-question like a passage."""
        found = await asyncio.gather(
            *(rate(ctx, topic.questions[q], answer, "rate_answer") for q in questions)
        )
        row = [-1] * len(topic.questions)
        for q, (value, _) in zip(questions, found, strict=True):
            row[q] = value
        cov_y = metrics.coverage(["y"], {"y": row}, questions, ctx.options.eta)
        tokens_y = ctx.resources.tokens(answer)
        ctx.details |= {
            "answer": answer,
            "answer_ratings": row,
            "cov_y": cov_y,
            "den_y": metrics.density(cov_y, tokens_y, oracle_cov, oracle_tokens),
            "answer_tokens": tokens_y,
        }

    def tables_file(self, options: CruxOptions) -> str:
        return "crux.json"

    def aggregate(self, results: list[ItemResult], options: CruxOptions) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            values = [r.details[key] for r in results if r.details.get(key) is not None]
            return sum(values) / len(values) if values else None

        return {
            "topics": len(results),
            "undefined_topics": sum(r.status == "undefined" for r in results),
            "not_scored": not_scored(results),
            "cov": mean("cov"),
            "alpha_ndcg": mean("alpha_ndcg"),
            "den": mean("den"),
            "cov_y": mean("cov_y"),
            "den_y": mean("den_y"),
            "unrated_pairs": sum(r.details.get("unrated", 0) for r in results),
            "rated_now": sum(len(r.details.get("rated", [])) for r in results),
            "counted_zero": 0
            if options.rate
            else sum(r.details.get("unrated", 0) for r in results),
            "unreadable_ratings": sum(r.details.get("unreadable", 0) for r in results),
        }

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        if not tables:
            return []
        keys = [k for k in ("cov", "alpha_ndcg", "den", "cov_y", "den_y") if tables.get(k)]
        if not keys:
            return []
        spec = {
            "kind": "bars",
            "labels": keys,
            "values": [tables[k] for k in keys],
            "ylabel": "mean over topics",
        }
        return [("CRUX context (and answer) metrics", spec)]

    def render(self, tables: dict[str, Any], console: Console) -> None:
        table = Table("measure", "value", title="CRUX (mean over topics)")
        for key in ("cov", "alpha_ndcg", "den", "cov_y", "den_y"):
            value = tables[key]
            table.add_row(key, "-" if value is None else f"{value:.4f}")
        for key in (
            "topics",
            "undefined_topics",
            "unrated_pairs",
            "rated_now",
            "counted_zero",
            "unreadable_ratings",
        ):
            table.add_row(key, str(tables.get(key, 0)))
        console.print(table)


CRUX = Crux()
