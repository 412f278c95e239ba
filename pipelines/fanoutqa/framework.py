"""FanOutQA on the runtime: closed-book, evidence-provided and open-book answers, string metrics
equal to the original scorer, BLEURT and the A-F model judge; one run per setting, joined into
the paper's Table 1.

The article collection is a retrieval index (`index_build`, 1,024-character chunks cut at
paragraph / sentence boundaries, BM25), built once per collection into the run directory or
given with ``--index``. Evidence-provided: the decomposition's articles' chunks ranked by BM25
against the question, as many as fit the context budget. Open-book: ``search`` and ``read`` tools
over the same index (at most half the budget per read). BM25 statistics are the collection's,
where the original baseline indexed each question's articles on their own (SPEC §4 ranks with
BM25 without fixing the statistics; the chunks are the same).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.table import Table

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    ItemText,
    Judgement,
    ParseError,
    PromptTemplate,
    RunOutcome,
    RunPlan,
    RunRequest,
    StageFailed,
    UserError,
    Vote,
    load_dir,
    not_scored,
)
from groundcover.inputs import (
    AnswerFile,
    GivenAnswers,
    IndexDir,
    InputDir,
    describe_validation,
    iter_jsonl,
    read_text,
)
from groundcover.judges import JudgementAbstained, load_variants
from groundcover.models import EvaluatorConfig, Tool

from ...serving.launch.registry import UnknownModelError, resolve
from .metrics import (
    ROUGE_TYPES,
    aggregate,
    answer_text,
    string_metrics,
)

PROMPTS = load_dir(Path(__file__).parent / "prompts")
VARIANTS = load_variants(Path(__file__).parent / "prompts")  # paraphrases (agreement)
Setting = Literal["closed-book", "evidence", "open-book"]
CHARS_PER_TOKEN = 4  # budget estimate when the endpoint's tokenizer is not at hand
JUDGE_PASS = set("BCE")  # SPEC §4: categories B, C and E score 1
CHUNKING = {"by": "chars", "size": 1024, "overlap": 0}
TABLE_COLUMNS = ["loose", "strict", "rouge1", "rouge2", "rougeL", "bleurt", "gpt_judge"]
# spaCy (normalisation) and BLEURT (torch) leave the event loop, one at a time.
CPU_WORK = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanoutqa-cpu")


class Question(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    question: str = Field(min_length=1)
    answer: Any
    decomposition: list[dict] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)

    def evidence_pageids(self) -> list[int]:
        ids: list[int] = []

        def walk(subs: list[dict]) -> None:
            for sub in subs:
                evidence = sub.get("evidence") or {}
                if "pageid" in evidence and evidence["pageid"] not in ids:
                    ids.append(int(evidence["pageid"]))
                walk(sub.get("decomposition") or [])

        walk(self.decomposition)
        return ids


def load_json(path: Path) -> Any:
    """A whole JSON file, or one line naming what is wrong with it."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply") from None


def load_questions(path: Path, limit: int | None = None) -> list[Question]:
    rows = load_json(path)
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a JSON list of questions")
    out: list[Question] = []
    seen: set[str] = set()
    for n, row in enumerate(rows[:limit] if limit else rows):
        if not isinstance(row, dict):
            raise UserError(f"{path}: question #{n}: not a JSON object")
        record = f"{path}: question #{n} ({row.get('id')!r})"
        if "answer" not in row:
            raise UserError(f"{record}: field answer: missing")
        try:
            question = Question.model_validate(row)
        except ValidationError as exc:
            raise UserError(f"{record}: {describe_validation(exc)}") from exc
        if question.id in seen:
            raise UserError(f"{record}: field id: duplicate")
        seen.add(question.id)
        out.append(question)
    if not out:
        raise UserError(f"{path}: no questions")
    return out


class FanoutOptions(FrameworkOptions, GivenAnswers):
    input: InputFile | None = Field(
        Path("fanoutqa-dev"), description="questions JSON, or a dataset name (fanoutqa-dev)"
    )
    settings: list[Setting] = Field(
        default=["closed-book"], min_length=1, description="the settings to answer in"
    )
    articles: InputFile | None = Field(None, description="JSONL {pageid, title, text}")
    index: IndexDir | None = Field(None, description="index of the articles (chars, 1024)")
    context_tokens: int | None = Field(None, ge=256, description="evidence budget in tokens")
    judge: bool = Field(False, description="also run the A-F model judge")
    bleurt: InputDir | None = Field(None, description="BLEURT PyTorch checkpoint (absent if unset)")
    limit: int | None = Field(None, ge=1, description="only the first N questions")


# ---- the article collection as an index --------------------------------------------------------


def check_articles(path: Path) -> None:
    """Every line a JSON object with an integer pageid and a string text (the ids evidence uses)."""
    for lineno, row in iter_jsonl(path):
        if not isinstance(row.get("pageid"), int) or not isinstance(row.get("text"), str):
            raise UserError(f"{path}:{lineno}: need integer pageid and string text")


def open_article_index(options: FanoutOptions, root: Path):
    """The given index, or one built (once) into the study root from ``--articles``."""
    from ...index_build.build import BuildError, IndexSpec, build_index
    from ...index_build.corpus import CorpusError
    from ...retrieval.index import IndexError_, SearchIndex

    path = options.index or root / "articles-index"
    try:
        if options.index is None and not (path / "manifest.json").is_file():
            assert options.articles is not None  # plan() refused a setting without either
            spec = IndexSpec(chunk_by="chars", chunk_size=1024, dense_model=None)
            build_index(options.articles, path, spec)
        return SearchIndex.load(path, expect={"chunking": CHUNKING})
    except (BuildError, CorpusError, IndexError_) as exc:
        raise UserError(str(exc)) from exc


@dataclass
class ArticleIndex:
    """Evidence chunks and the search / read tools, over the index (no article in memory)."""

    index: Any  # retrieval.index.SearchIndex

    def passages(self, query: str, pageids: list[int], budget_chars: int) -> tuple[str, dict]:
        """The chunks of these articles ranked by BM25 against ``query``, in rank order while
        they fit ``budget_chars``."""
        docs = [str(p) for p in pageids]
        missing = [p for p, d in zip(pageids, docs, strict=True) if d not in self.index.doc_rows]
        hits = self.index.bm25_within(query, docs)
        parts = []
        for hit in hits:
            piece = f"<document title={hit.title!r}>\n{hit.text}\n</document>"
            if len(piece) > budget_chars:
                break
            parts.append(piece)
            budget_chars -= len(piece)
        info = {
            "chunks": len(hits),
            "used": len(parts),
            "missing_pages": missing,
            "chunk_ids": [h.chunk_id for h in hits[: len(parts)]],
        }
        return "\n\n".join(parts), info

    def search(self, args: SearchArgs) -> list[dict]:
        hits = self.index.search([args.query], k=50, mode="bm25")[0]
        best: dict[str, Any] = {}
        for hit in hits:
            if hit.score > 0:
                best.setdefault(hit.doc_id, hit)
        return [
            {"pageid": int(h.doc_id), "title": h.title, "snippet": h.text[:200]}
            for h in list(best.values())[:5]
        ]

    def tools(self, budget_tokens: int) -> list[Tool]:
        read_chars = budget_tokens * CHARS_PER_TOKEN // 2  # at most half the budget per read

        def read(args: ReadArgs) -> dict:
            if str(args.pageid) not in self.index.doc_rows:
                return {"error": f"no article with pageid {args.pageid}"}
            text, info = self.passages(args.query, [args.pageid], read_chars)
            return {"pageid": args.pageid, "content": text, "chunks_used": info["used"]}

        return [
            Tool(
                "search",
                "Search Wikipedia articles by keywords; returns pageids and titles.",
                SearchArgs,
                self.search,
            ),
            Tool(
                "read",
                "Read the parts of one article (by pageid) most relevant to a query.",
                ReadArgs,
                read,
            ),
        ]


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=300)


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pageid: int
    query: str = Field(min_length=1, max_length=300)


# ---- the framework -----------------------------------------------------------------------------


@dataclass
class Resources:
    articles: ArticleIndex | None
    bleurt: Any


class FanOutQA(Framework[FanoutOptions, Question]):
    name = "fanoutqa"
    Options = FanoutOptions
    prompts = PROMPTS
    roles = {
        "answer": "the benchmarked model (none with --answers)",
        "judge": "the A-F judge (--judge)",
    }
    stage_roles = {"answer-*": "answer", "judge": "judge"}
    # a judge panel: the case letter by strict majority; a tie is case D (they disagree: 0)
    panel_rules = {"judge": Vote(tie="D", labels=tuple("ABCDEF"))}
    prompt_variants = {"judge": VARIANTS["judge"]}
    # the official submission format; a question without an answer scores 0 everywhere, as the
    # official scorer counts it, and an answer for no question of ours is not scored
    answer_file = AnswerFile(layout="json-list", missing="0 in every column")

    def roles_used(self, options: FanoutOptions) -> list[str]:
        return ["answer"] * (options.answers is None) + ["judge"] * options.judge

    def light_setup(self, options: FanoutOptions) -> bool:
        return options.settings[0] == "closed-book" and options.bleurt is None

    def known_calls(self, item: Question, options: FanoutOptions) -> dict[str, int]:
        """One answer per question, except open book (its tool rounds depend on the model)."""
        setting = options.settings[0]
        if options.answers is not None or setting == "open-book":
            return {}
        return {f"answer-{setting}": 1}

    def item_text(self, item: Question, record: ItemResult, options: FanoutOptions) -> ItemText:
        """The question, the generation scored and the reference answer (as the dataset has
        it: a string, a list or a mapping, written as JSON unless a string)."""
        if isinstance(item.answer, str):
            reference = item.answer
        else:  # text as text (Exupéry, not Exup\u00e9ry)
            reference = json.dumps(item.answer, ensure_ascii=False)
        return ItemText(item.question, record.details.get("generation"), reference)

    def judgements(
        self, item: Question, record: ItemResult, options: FanoutOptions
    ) -> list[Judgement]:
        """The A-F judge's verdict on the generation (none where it stayed unreadable)."""
        verdict = (record.details.get("judge") or {}).get("category")
        generation = record.details.get("generation")
        if verdict is None or not generation:
            return []
        return [Judgement("judge", "0", verdict, judge_values(item, generation))]

    async def ask_judgement(
        self, ctx: ItemContext, judgement: Judgement, template: PromptTemplate | None = None
    ) -> str:
        return await ask_judge(ctx, judgement.values, template)

    def item_metrics(self, record: ItemResult) -> dict[str, float | None]:
        """Loose and strict accuracy, ROUGE-1/2/L F1, BLEURT and the judge's score where the
        run has them (the paper's Table 1 columns, per question)."""
        metrics = record.details.get("metrics") or {}
        found: dict[str, float | None] = {"score": record.score}
        if metrics:
            found |= {"loose": metrics["loose"], "strict": float(metrics["strict"])}
            found |= {f"{k}_f1": metrics["rouge"][k]["f1"] for k in ROUGE_TYPES}
        if "bleurt" in record.details:
            found["bleurt"] = record.details["bleurt"]
        if "judge" in record.details:
            found["judge"] = record.details["judge"].get("score")
        return found

    def load(self, options: FanoutOptions) -> list[Question]:
        if options.input is None:
            raise UserError("eval fanoutqa: give --data FILE or a dataset name (fanoutqa-dev)")
        return load_questions(options.input, options.limit)

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        """One run per setting, in ``<root>/<setting>``; each run's options hold only what
        changes its answers, so adding a setting later resumes the others. Answers made
        elsewhere (``--answers``) are one run, ``<root>/answers``, and no model answers."""
        options: FanoutOptions = request.options
        if options.answers is not None:
            if options.settings != ["closed-book"]:
                raise UserError("--answers scores answers made elsewhere: drop --setting")
            run_options = options.model_copy(update={"settings": ["closed-book"]})
            return [RunPlan("answers", "fanoutqa-answers", run_options)]
        needs_articles = [s for s in options.settings if s != "closed-book"]
        if needs_articles and options.articles is None and options.index is None:
            raise UserError(
                f"the {needs_articles[0]} setting needs --articles (JSONL of pageid, "
                "title, text) or --index"
            )
        if options.bleurt is not None and not (options.bleurt / "config.json").is_file():
            raise UserError(f"--bleurt {options.bleurt}: no checkpoint (config.json) there")
        to_build = options.index is None and not (root / "articles-index").is_dir()
        if options.articles is not None and to_build:
            check_articles(options.articles)
        budget = options.context_tokens or max(512, model_window(request.role("answer")) - 1024)
        plans = []
        for setting in dict.fromkeys(options.settings):
            closed = setting == "closed-book"
            run_options = options.model_copy(
                update={
                    "settings": [setting],
                    "context_tokens": None if closed else budget,
                    "articles": None if closed else options.articles,
                    "index": None if closed else options.index,
                }
            )
            plans.append(RunPlan(setting, f"fanoutqa-{setting}", run_options))
        return plans

    def setup(self, request: RunRequest, root: Path) -> Resources:
        options: FanoutOptions = request.options
        articles = None
        if options.settings[0] != "closed-book":
            articles = ArticleIndex(open_article_index(options, root))
        bleurt = None
        if options.bleurt is not None:
            from .bleurt import Bleurt

            bleurt = Bleurt(str(options.bleurt))
        # spaCy (the metrics' normalisation) loads here, once, not inside the first item: its two
        # seconds would count against that item and, with --drivers, every driver's first
        from .metrics import spacy_pipeline

        spacy_pipeline()
        return Resources(articles, bleurt)

    async def solve(self, question: Question, ctx: ItemContext) -> ItemResult:
        options: FanoutOptions = ctx.options
        if ctx.answered_elsewhere:
            ctx.details["setting"] = "answers"
            given = ctx.given_answer()
            if given is None:  # the official scorer counts it 0 in every column
                metrics = string_metrics(question.answer, None)
                ctx.details |= {"missing_answer": True, "metrics": metrics}
                return ctx.result(
                    "abstained",
                    0.0,
                    "the submission has no answer for this "
                    "question: every metric is 0, as the official scorer counts it",
                )
            generation = given.strip()
        else:
            ctx.details["setting"] = options.settings[0]
            result = await generate(ctx, question, options.settings[0], options.context_tokens)
            generation = result.text.strip()
        loop = asyncio.get_running_loop()
        metrics = await loop.run_in_executor(
            CPU_WORK, string_metrics, question.answer, generation or None
        )
        ctx.details |= {"generation": generation, "metrics": metrics}
        if ctx.resources.bleurt is not None and generation:
            scores = await loop.run_in_executor(
                CPU_WORK, ctx.resources.bleurt.score, [answer_text(question.answer)], [generation]
            )
            ctx.details["bleurt"] = scores[0]
        if options.judge and generation:
            ctx.details["judge"] = await judge_answer(ctx, question, generation)
        if not generation:
            return ctx.result("abstained", 0.0, "the model returned no answer: every metric is 0")
        explanation = (
            f"found {metrics['loose']:.0%} of the reference answer strings "
            f"({'all' if metrics['strict'] else 'not all'})"
        )
        return ctx.result("ok", metrics["loose"], explanation)

    def tables_file(self, options: FanoutOptions) -> str:
        return "table1.json"

    def aggregate(self, results: list[ItemResult], options: FanoutOptions) -> dict[str, Any]:
        return table_row(results)

    def render(self, tables: dict[str, Any], console: Console) -> None:
        print_table({tables["setting"]: tables}, console)

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        if not tables or not tables.get("n"):
            return []
        columns = [c for c in TABLE_COLUMNS if tables.get(c) is not None]
        spec = {
            "kind": "bars",
            "labels": columns,
            "values": [tables[c] for c in columns],
            "ylabel": tables.get("setting") or "",
        }
        return [(f"FanOutQA {tables.get('setting')} (Table 1 columns)", spec)]

    def combine(self, outcomes: dict[str, RunOutcome], options: FanoutOptions) -> dict[str, Any]:
        return {key: outcome.tables for key, outcome in outcomes.items()}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        if len(combined) > 1:  # one setting: its run printed this very table already
            print_table(combined, console)


def model_window(ev: EvaluatorConfig) -> int:
    try:
        return ev.max_model_len or resolve(ev.model).max_model_len
    except UnknownModelError:
        return 4096


async def generate(ctx: ItemContext, question: Question, setting: str, budget: int | None):
    """The setting's answer: the question alone, with evidence, or after a search/read loop."""
    if setting == "open-book":
        template = PROMPTS["open_book"]
        run = await ctx.run_tools(
            template.messages(question=question.question),
            ctx.resources.articles.tools(budget),
            max_rounds=5,
            stage="answer-open-book",
            template=template.id,
        )
        ctx.details["tool_calls"] = [
            {"name": c["name"], "arguments": c["arguments"]} for c in run.calls
        ]
        return run.final
    if setting == "evidence":
        assert budget is not None  # plan() sets it for every setting but closed-book
        context, ctx.details["evidence"] = await asyncio.to_thread(
            ctx.resources.articles.passages,
            question.question,
            question.evidence_pageids(),
            budget * CHARS_PER_TOKEN,
        )
        template = PROMPTS["evidence"]
        messages = template.messages(question=question.question, documents=context)
    else:
        template = PROMPTS["closed_book"]
        messages = template.messages(question=question.question)
    return await ctx.chat(messages, stage=f"answer-{setting}", template=template.id)


def judge_letter(text: str) -> str:
    """The case letter on the last non-empty line (reasoning may come before it)."""
    lines = [line.strip().strip("()*.") for line in (text or "").splitlines() if line.strip()]
    if not lines or lines[-1].upper() not in tuple("ABCDEF"):
        raise ParseError("expected the case letter A-F alone on the last line")
    return lines[-1].upper()


def judge_values(question: Question, generation: str) -> dict[str, str]:
    """What the A-F judge's prompt is rendered with (the original trims answers at 4,000
    characters)."""
    return {
        "question": question.question,
        "reference": json.dumps(question.answer),
        "answer": generation[:4000],
    }


async def ask_judge(
    ctx: ItemContext, values: dict[str, str], template: PromptTemplate | None = None
) -> str:
    """The case letter A-F (``template``: a paraphrase of the judge's prompt);
    ``StageFailed`` when it stays unreadable."""
    verdict = await ctx.ask(
        template or PROMPTS["judge"],
        "judge",
        judge_letter,
        "your reasoning, then the letter A-F alone on the last line",
        values,
        regex=r"[^\[\]]{0,1500}\n[A-F]",
        max_tokens=768,  # reasoning, then the letter
    )
    return str(verdict.value)


async def judge_answer(ctx: ItemContext, question: Question, generation: str) -> dict:
    """The A-F judge; an unreadable verdict is recorded, and so is one a judge cascade
    abstained on (the string metrics still stand either way)."""
    try:
        category = await ask_judge(ctx, judge_values(question, generation))
    except StageFailed as failure:
        return {"status": "unparseable", "failure": failure.failure().model_dump()}
    except JudgementAbstained as abstained:  # no tier confident: never a 0, offered for labels
        return {"status": "unjudged", "error": abstained.error}
    return {"category": category, "score": int(category in JUDGE_PASS)}


def table_row(results: list[ItemResult]) -> dict[str, Any]:
    """Paper Table 1 columns over the recorded questions (an unanswered one scores 0 everywhere;
    BLEURT and the judge count a missing value as 0, and the table says how many)."""
    n = len(results)
    setting = results[0].details.get("setting") if results else None
    if n == 0:
        return {"setting": setting, "n": 0} | dict.fromkeys(TABLE_COLUMNS)
    per = [r.details.get("metrics") or string_metrics(None, None) for r in results]
    agg = aggregate(per)
    bleurt = [r.details["bleurt"] for r in results if "bleurt" in r.details]
    judged = [r.details["judge"]["score"] for r in results if "score" in r.details.get("judge", {})]
    # a verdict a judge cascade abstained on is no verdict, never a 0: out of the judge's mean,
    # counted beside it (the paper's 0 for a missing verdict is for unanswered or unreadable)
    unjudged = sum(r.details.get("judge", {}).get("status") == "unjudged" for r in results)
    return {
        "setting": setting,
        "n": n,
        "loose": agg["loose"],
        "strict": agg["strict"],
        **{k: agg[k]["f1"] for k in ROUGE_TYPES},
        "bleurt": sum(bleurt) / n if bleurt else None,
        "gpt_judge": sum(judged) / (n - unjudged) if judged else None,
        **({"judge_unjudged": unjudged} if unjudged else {}),  # a cascade run's only
        "judge_unparseable": sum(
            r.details.get("judge", {}).get("status") == "unparseable" for r in results
        ),
        "unanswered": sum(r.status == "abstained" for r in results),  # scored 0, as the original
        "not_scored": not_scored(results),
    }


def print_table(rows: dict[str, dict[str, Any]], console: Console) -> None:
    out = Table("setting", "n", *TABLE_COLUMNS, title="FanOutQA (paper Table 1 columns)")
    for name, row in rows.items():
        cells = ["absent" if row.get(c) is None else f"{row[c]:.3f}" for c in TABLE_COLUMNS]
        out.add_row(name, str(row["n"]), *cells)
    console.print(out)


FANOUTQA = FanOutQA()
