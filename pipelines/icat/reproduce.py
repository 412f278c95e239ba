"""Reproducing ICAT's Table 3: S_fact and, for ICAT-M / -S / -A, S_cov and ICAT_1 per system and
knowledge source (a corpus index, web snippets), the paper's values beside ours.

One ordinary ICAT run per source under ``<root>/<source>/`` (all three variants, beta = 1), so the
table resumes source by source. The queries and qrels default to the TREC Web Track 2009-2012
topics and diversity qrels by name (``trec-web-topics``); the corpus (ClueWeb09-B in the paper) and
the systems' responses are the user's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import InputFile, RunOutcome, RunPlan, RunRequest, Study
from groundcover.grids import Published, cell_text, published_row
from groundcover.inputs import IndexDir, ModelName

from .framework import ICAT, IcatOptions

COLUMNS = (
    "S_fact",
    "ICAT-M S_cov",
    "ICAT-M_1",
    "ICAT-S S_cov",
    "ICAT-S_1",
    "ICAT-A S_cov",
    "ICAT-A_1",
)
# Table 3 by source and system name fragment; the alignment model was Llama-3.1-70B.
PAPER_TABLE3: Published = {
    "corpus": {
        "gpt-4": (0.343, 0.416, 0.327, 0.453, 0.346, 0.463, 0.354),
        "llama-3 70b": (0.327, 0.451, 0.335, 0.464, 0.355, 0.466, 0.354),
        "mixtral-8x22b": (0.344, 0.370, 0.297, 0.414, 0.342, 0.409, 0.339),
        "openchat": (0.340, 0.413, 0.329, 0.429, 0.348, 0.424, 0.347),
    },
    "web": {
        "gpt-4": (0.363, 0.436, 0.347, 0.473, 0.366, 0.483, 0.374),
        "llama-3 70b": (0.347, 0.471, 0.355, 0.484, 0.375, 0.486, 0.374),
        "mixtral-8x22b": (0.364, 0.390, 0.317, 0.434, 0.362, 0.429, 0.359),
        "openchat": (0.360, 0.433, 0.349, 0.449, 0.368, 0.444, 0.367),
    },
}


class ReproduceIcatOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: InputFile = Field(description="responses JSONL: query_id, response, system")
    queries: InputFile = Field(Path("trec-web-topics"), description="queries JSONL or dataset name")
    qrels: InputFile = Field(Path("trec-web-topics/qrels.jsonl"), description="subtopic qrels")
    index: IndexDir | None = Field(None, description="corpus index (`index build`): source corpus")
    snippets: InputFile | None = Field(None, description="web snippets per claim: source web")
    nli_model: ModelName = Field(description="NLI cross-encoder name or path")
    retrieval: Literal["dense", "bm25", "hybrid"] = Field(
        "dense", description="how a claim's evidence is retrieved from the corpus"
    )
    k: int = Field(10, ge=1, le=1000, description="snippets per claim")
    limit: int | None = Field(None, ge=1, description="only the first N responses")

    @model_validator(mode="after")
    def _a_source(self) -> ReproduceIcatOptions:
        if self.index is None and self.snippets is None:
            raise ValueError("give --index (corpus) and/or --snippets (web)")
        return self

    def sources(self) -> dict[str, IcatOptions]:
        """Per knowledge source, the ICAT run's options: every variant, beta = 1."""
        common = self.model_dump(exclude={"index", "snippets"})
        found = {"corpus": {"index": self.index}, "web": {"snippets": self.snippets}}
        return {
            name: IcatOptions(**common, **source, variants=["m", "s", "a"], betas=[1.0])
            for name, source in found.items()
            if next(iter(source.values())) is not None
        }


def row_of(entry: dict[str, Any]) -> dict[str, float | None]:
    """One system's Table 3 cells from an ICAT run's ``systems`` entry."""
    values = [entry["s_fact"]["mean"]]
    for variant in ("ICAT-M", "ICAT-S", "ICAT-A"):
        values += [entry[variant]["s_cov"]["mean"], entry[variant]["icat"]["1.0"]["mean"]]
    return dict(zip(COLUMNS, values, strict=True))


class ReproduceIcat(Study[ReproduceIcatOptions]):
    name = "reproduce-icat"
    paper_judges_without_reasoning = True  # the paper's models are Llama 3.x (no reasoning)
    Options = ReproduceIcatOptions
    roles = ICAT.roles
    framework = ICAT

    def load(self, options: ReproduceIcatOptions) -> Any:
        return self.framework.load(next(iter(options.sources().values())))

    def check_inputs(self, options: ReproduceIcatOptions) -> None:
        self.framework.check_inputs(next(iter(options.sources().values())))

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        return [
            RunPlan(source, "icat", cell, framework=self.framework)
            for source, cell in request.options.sources().items()
        ]

    def combine(
        self, outcomes: dict[str, RunOutcome], options: ReproduceIcatOptions
    ) -> dict[str, Any]:
        rows = []
        for source, outcome in outcomes.items():
            for system, entry in ((outcome.tables or {}).get("systems") or {}).items():
                row: dict[str, Any] = {"source": source, "system": system, "ours": row_of(entry)}
                if (published := published_row(system, source, PAPER_TABLE3, COLUMNS)) is not None:
                    row["paper"] = published
                rows.append(row)
        return {"rows": rows}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        title = "ICAT Table 3 (beta = 1; the paper's value in parentheses)"
        table = Table("source", "system", *COLUMNS, title=title)
        for row in combined["rows"]:
            ours, paper = row["ours"], row.get("paper") or {}
            cells = [cell_text(ours[c], paper.get(c)) for c in COLUMNS]
            table.add_row(row["source"], row["system"], *cells)
        console.print(table)


REPRODUCE_ICAT = ReproduceIcat()
