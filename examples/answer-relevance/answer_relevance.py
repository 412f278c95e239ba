"""Answer relevance: does each answer address its question? A groundcover framework in one file.

A judge reads the question and the answer and says ``yes``, ``partly`` or ``no`` (scored 1, 0.5
and 0); a judge panel (``--role judge=A --role judge=B --role judge=C``) votes. The table counts
the verdicts and gives the mean with a 95% BCa interval.

Input: JSON Lines with ``id``, ``question`` and ``answer``. Installed (``pip install .``), this is
``groundcover eval relevance ITEMS.jsonl``, and everything a built-in framework gets comes with
it: resuming, ``--dry-run``, panels and ``groundcover agreement``, ``report``, ``compare``, the
HTML page and ``groundcover.evaluate("relevance", ...)``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    PromptTemplate,
    Vote,
)
from groundcover.inputs import RecordId, read_jsonl
from groundcover.stats import bca_interval

SCORES = {"yes": 1.0, "partly": 0.5, "no": 0.0}

# A prompt is versioned: its id (name, version and a hash of the text) enters every cache key
# and manifest, so an edited prompt is never answered from before.
PROMPT = PromptTemplate(
    name="relevance",
    version=1,
    system="You judge whether an answer addresses the question it was given.",
    user=(
        "Question: {{ question }}\n\nAnswer: {{ answer }}\n\n"
        "Does the answer address the question? Think it through if you need to, then end with "
        "one word on its own line: yes, partly or no."
    ),
)


class Item(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: RecordId
    question: str = Field(min_length=1)
    answer: str


class RelevanceOptions(FrameworkOptions):
    # InputFile: the file enters the run's identity by content (a rewritten file is a new run)
    input: InputFile = Field(description="items JSONL: id, question, answer")
    limit: int | None = Field(None, ge=1, description="only the first N items")


class Relevance(Framework[RelevanceOptions, Item]):
    """Answer relevance: does each answer address its question (yes / partly / no)?

    A judge (or a panel, by majority) labels each answer; the table counts the labels and gives
    the mean score with a 95% BCa interval."""

    name = "relevance"
    Options = RelevanceOptions
    prompts = {"relevance": PROMPT}
    roles = {"judge": "says whether each answer addresses its question"}
    panel_rules = {"relevance": Vote(tie="partly", order=("no", "partly", "yes"))}

    def load(self, options: RelevanceOptions) -> list[Item]:
        return list(read_jsonl(options.input, Item, limit=options.limit))

    def known_calls(self, item: Item, options: RelevanceOptions) -> dict[str, int]:
        return {"relevance": 1}  # what --dry-run counts before any model is asked

    async def solve(self, item: Item, ctx: ItemContext) -> ItemResult:
        # one of the labels, constrained on vLLM, re-asked when unreadable; an answer that stays
        # unreadable fails the item (recorded as such), never a silent 0
        values = {"question": item.question, "answer": item.answer}
        label = await ctx.choose(PROMPT, list(SCORES), "relevance", values)
        ctx.details["label"] = label
        return ctx.result("ok", SCORES[label], f"the judge says {label}")

    def tables_file(self, options: RelevanceOptions) -> str:
        return "relevance.json"

    def aggregate(self, results: list[ItemResult], options: RelevanceOptions) -> dict[str, Any]:
        scored = [r for r in results if r.status == "ok" and r.score is not None]
        scores = [float(r.score) for r in scored if r.score is not None]
        labels = Counter(str(r.details.get("label")) for r in scored)
        interval = bca_interval(scores).as_dict() if len(scores) > 1 else None
        return {
            "items": len(results),
            "scored": len(scores),
            "mean": sum(scores) / len(scores) if scores else None,
            "interval": interval,
            "labels": {label: labels.get(label, 0) for label in SCORES},
        }

    def render(self, tables: dict[str, Any], console: Console) -> None:
        table = Table(title="Answer relevance")
        for column in ("items", "scored", "mean", *SCORES):
            table.add_column(column, justify="right")
        mean = "-" if tables["mean"] is None else f"{tables['mean']:.3f}"
        counts = [str(tables["labels"][label]) for label in SCORES]
        table.add_row(str(tables["items"]), str(tables["scored"]), mean, *counts)
        console.print(table)


RELEVANCE = Relevance()
