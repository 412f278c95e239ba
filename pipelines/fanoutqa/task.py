"""FanOutQA settings: closed-book and evidence-provided generation, string metrics, LLM judge.

Evidence-provided: the decomposition's Wikipedia articles come from a user-supplied JSONL
collection ({pageid, title, text}); each article is cut into 1,024-character chunks at paragraph
or sentence boundaries, the chunks are ranked with BM25 against the question, and as many as fit
the context budget are given to the model (SPEC §4).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from index_build.chunking import char_spans
from pipelines.config import UserError
from pipelines.fanoutqa.metrics import string_metrics
from serving.client import EvalClient
from serving.templates import load_dir

PROMPTS = load_dir(Path(__file__).parent / "prompts")
Setting = Literal["closed-book", "evidence", "open-book"]
CHARS_PER_TOKEN = 4  # budget estimate when the endpoint's tokenizer is not at hand
JUDGE_PASS = set("BCE")  # SPEC §4: categories B, C and E score 1


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


def load_questions(path: Path, limit: int | None = None) -> list[Question]:
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a JSON list of questions")
    out = []
    for n, row in enumerate(rows[:limit] if limit else rows):
        if not isinstance(row, dict) or "answer" not in row:
            raise UserError(f"{path}: question #{n}: field answer: missing")
        try:
            out.append(Question.model_validate(row))
        except ValueError as exc:
            raise UserError(f"{path}: question #{n} ({row.get('id')!r}): {exc}") from exc
    return out


class Articles:
    """The article collection: pageid -> (title, text), read once from JSONL."""

    def __init__(self, path: Path):
        from pipelines.config import iter_jsonl

        self.path = path
        self.pages: dict[int, tuple[str, str]] = {}
        for lineno, row in iter_jsonl(path):
            if not isinstance(row.get("pageid"), int) or not isinstance(row.get("text"), str):
                raise UserError(f"{path}:{lineno}: need integer pageid and string text")
            self.pages[row["pageid"]] = (str(row.get("title", "")), row["text"])
        self._tools: dict[int, list] = {}

    def tools(self, budget_tokens: int) -> list:
        """search/read tools over this collection (built once per budget)."""
        if budget_tokens not in self._tools:
            self._tools[budget_tokens] = ArticleTools(self, budget_tokens).tools()
        return self._tools[budget_tokens]

    def evidence_context(self, question: Question, budget_tokens: int) -> tuple[str, dict]:
        """BM25-ranked 1,024-char chunks of the evidence articles, as many as fit the budget."""
        import bm25s

        chunks = []
        missing = [p for p in question.evidence_pageids() if p not in self.pages]
        for pageid in question.evidence_pageids():
            if pageid in self.pages:
                title, text = self.pages[pageid]
                chunks += [(title, text[s:e]) for s, e in char_spans(text, 1024)]
        if not chunks:
            return "", {"chunks": 0, "used": 0, "missing_pages": missing}
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([f"{t}\n{c}" for t, c in chunks], show_progress=False),
                        show_progress=False)  # fmt: skip
        order, _ = retriever.retrieve(
            bm25s.tokenize([question.question], show_progress=False), k=len(chunks),
            show_progress=False,
        )  # fmt: skip
        budget, parts = budget_tokens * CHARS_PER_TOKEN, []
        for row in order[0]:
            title, text = chunks[int(row)]
            piece = f"<document title={title!r}>\n{text}\n</document>"
            if len(piece) > budget:
                break
            parts.append(piece)
            budget -= len(piece)
        return "\n\n".join(parts), {"chunks": len(chunks), "used": len(parts),
                                    "missing_pages": missing}  # fmt: skip


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=300)


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pageid: int
    query: str = Field(min_length=1, max_length=300)


class ArticleTools:
    """search/read over the collection for the open-book tool loop (BM25, 1,024-char chunks,
    at most half the context budget per read)."""

    def __init__(self, articles: Articles, budget_tokens: int):
        import bm25s

        self.articles = articles
        self.ids = list(articles.pages)
        self.read_chars = budget_tokens * CHARS_PER_TOKEN // 2
        docs = [f"{t}\n{x[:1024]}" for t, x in articles.pages.values()]
        self.bm25 = bm25s.BM25()
        self.bm25.index(bm25s.tokenize(docs, show_progress=False), show_progress=False)

    def search(self, args: SearchArgs) -> list[dict]:
        import bm25s

        k = min(5, len(self.ids))
        rows, scores = self.bm25.retrieve(bm25s.tokenize([args.query], show_progress=False), k=k,
                                          show_progress=False)  # fmt: skip
        return [
            {"pageid": self.ids[int(r)], "title": self.articles.pages[self.ids[int(r)]][0],
             "snippet": self.articles.pages[self.ids[int(r)]][1][:200]}
            for r, sc in zip(rows[0], scores[0], strict=True) if sc > 0
        ]  # fmt: skip

    def read(self, args: ReadArgs) -> dict:
        if args.pageid not in self.articles.pages:
            return {"error": f"no article with pageid {args.pageid}"}
        question = Question(id="read", question=args.query, answer=None,
                            decomposition=[{"evidence": {"pageid": args.pageid}}])  # fmt: skip
        text, info = self.articles.evidence_context(question, self.read_chars // CHARS_PER_TOKEN)
        return {"pageid": args.pageid, "content": text, "chunks_used": info["used"]}

    def tools(self) -> list:
        from serving.client import Tool

        return [
            Tool("search", "Search Wikipedia articles by keywords; returns pageids and titles.",
                 SearchArgs, self.search),
            Tool("read", "Read the parts of one article (by pageid) most relevant to a query.",
                 ReadArgs, self.read),
        ]  # fmt: skip


async def answer_question(
    client: EvalClient,
    question: Question,
    setting: Setting,
    articles: Articles | None,
    context_tokens: int,
    judge: bool,
) -> dict[str, Any]:
    record: dict[str, Any] = {"setting": setting}
    if setting != "closed-book" and articles is None:
        raise UserError(f"the {setting} setting needs --articles (JSONL of pageid, title, text)")
    if setting == "open-book":
        template = PROMPTS["open_book"]
        run = await client.run_tools(
            template.messages(question=question.question),
            articles.tools(context_tokens), max_rounds=5, stage="answer-open-book",
            template=template.id,
        )  # fmt: skip
        record["tool_calls"] = [{"name": c["name"], "arguments": c["arguments"]} for c in run.calls]
        result = run.final
    else:
        if setting == "evidence":
            context, record["evidence"] = articles.evidence_context(question, context_tokens)
            template = PROMPTS["evidence"]
            messages = template.messages(question=question.question, documents=context)
        else:
            template = PROMPTS["closed_book"]
            messages = template.messages(question=question.question)
        result = await client.chat(messages, stage=f"answer-{setting}", template=template.id)
    record |= _scored(question, result)
    if judge and record["generation"]:
        record["judge"] = await judge_answer(client, question, record["generation"])
    return record


def _scored(question: Question, result) -> dict[str, Any]:
    generation = result.text.strip()
    return {
        "status": "ok" if generation else "abstained",
        "generation": generation,
        "metrics": string_metrics(question.answer, generation or None),
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
    }


def judge_letter(text: str) -> str:
    """The case letter on the last non-empty line (reasoning may come before it)."""
    from serving.parsing import ParseError

    lines = [line.strip().strip("()*.") for line in (text or "").splitlines() if line.strip()]
    if not lines or lines[-1].upper() not in tuple("ABCDEF"):
        raise ParseError("expected the case letter A-F alone on the last line")
    return lines[-1].upper()


async def judge_answer(client: EvalClient, question: Question, generation: str) -> dict:
    template = PROMPTS["judge"]
    params: dict[str, Any] = {"max_tokens": 768}
    if client.vllm_extensions:  # reasoning, then the letter on its own line
        params["extra_body"] = {"structured_outputs": {"regex": r"[^\[\]]{0,1500}\n[A-F]"}}
    verdict = await client.parsed(
        template.messages(question=question.question, reference=json.dumps(question.answer),
                          answer=generation[:4000]),  # the original trims answers at 4,000 chars
        judge_letter, "your reasoning, then the letter A-F alone on the last line", 2,
        stage="judge", template=template.id, **params,
    )  # fmt: skip
    if not verdict.ok:
        return {"status": "unparseable", "error": verdict.error, "outputs": verdict.outputs}
    return {"category": verdict.value, "score": int(verdict.value in JUDGE_PASS)}


def table_row(
    records: list[dict[str, Any]], questions: list[Question], bleurt: Any = None
) -> dict[str, Any]:
    """Paper Table 1 columns over all questions (an unanswered one scores 0 everywhere)."""
    from pipelines.fanoutqa.metrics import ROUGE_TYPES, aggregate, answer_text

    n_questions = len(questions)
    per = [r["metrics"] for r in records]
    per += [string_metrics(None, None)] * (n_questions - len(per))
    agg = aggregate(per)
    row = {"loose": agg["loose"], "strict": agg["strict"],
           **{k: agg[k]["f1"] for k in ROUGE_TYPES}, "bleurt": None}  # fmt: skip
    if bleurt is not None:
        answers = {q.id: q.answer for q in questions}
        scored = [r for r in records if r.get("generation")]
        values = bleurt.score([answer_text(answers[r["id"]]) for r in scored],
                              [r["generation"] for r in scored])  # fmt: skip
        row["bleurt"] = sum(values) / n_questions
    judged = [r["judge"]["score"] for r in records if "score" in r.get("judge", {})]
    row["gpt_judge"] = sum(judged) / n_questions if judged else None
    row["judge_unparseable"] = sum(1 for r in records if r.get("judge", {}).get("status"))
    return row
