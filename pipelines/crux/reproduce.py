"""Reproducing CRUX's retrieval experiments (Table 1 layout): our retrieval systems x top-k, each
cell an ordinary CRUX run retrieving in place, the paper's values beside the systems we share;
Cov(Z) by answerability threshold (Table 2's analysis); with --generate, Cov(y) and Den(y) and the
Kendall tau over systems between context and answer metrics.

Cells live under ``<root>/<system>-k<k>/`` (threshold cells ``...-eta<n>``), so the grid resumes
cell by cell. Without --index the passages are indexed once under ``<root>/index``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import InputFile, RunOutcome, RunPlan, RunRequest, Study, UserError
from groundcover.inputs import IndexDir, InputDir, ModelName
from groundcover.serving.files import make_dirs, write_atomic

from . import data
from .framework import CRUX, CruxOptions, TopicItem

# Table 1 (Cov(Z), alpha-nDCG, Cov(y), Den(Z), Den(y)), percent, for the systems we share.
PAPER = {
    "duc": {
        "oracle": (100, 80.6, 64.6, 100, 93.8),
        "bm25": (44.4, 35.7, 35.8, 61.2, 53.4),
        "dense": (52.1, 45.2, 41.7, 70.3, 60.5),
        "bm25+mmr": (45.6, 36.7, 36.4, 65.8, 57.2),
        "dense+mmr": (42.7, 35.1, 33.8, 62.6, 53.5),
        "bm25+rerank": (49.0, 42.5, 38.4, 67.9, 57.9),
        "dense+rerank": (49.3, 42.9, 39.9, 69.3, 59.7),
        "tau": (0.676, 0.724, None, 0.733, None),
    },
    "multi-news": {
        "oracle": (100, 80.6, 61.8, 100, 84.7),
        "bm25": (39.3, 35.4, 38.2, 50.6, 60.0),
        "dense": (43.1, 36.6, 36.6, 55.4, 58.3),
        "bm25+mmr": (41.4, 35.2, 37.9, 52.9, 58.9),
        "dense+mmr": (39.0, 33.5, 36.1, 51.3, 57.6),
        "bm25+rerank": (45.3, 39.8, 41.2, 58.2, 63.0),
        "dense+rerank": (45.1, 40.3, 40.4, 57.8, 62.4),
        "tau": (0.838, 0.800, None, 0.810, None),
    },
}
COLUMNS = ("cov", "alpha_ndcg", "cov_y", "den", "den_y")
MMR = 0.7
ETAS = range(1, 6)


class ReproduceCruxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # a missing file is also given by --data (the command line says so)
    supplied_by: ClassVar[dict[str, str]] = {f: "data" for f in ("topics", "passages", "ratings")}

    data: InputDir | None = Field(
        None, description="folder of `crux build` output: topics, passages, ratings"
    )
    topics: InputFile = Field(description="topics JSONL (exchange format) or dataset name")
    passages: InputFile = Field(description="passages JSONL (exchange format)")
    ratings: InputFile | None = Field(None, description="ratings JSONL (exchange format)")
    index: IndexDir | None = Field(None, description="an index of the passages (default: built)")
    reranker: ModelName | None = Field(None, description="cross-encoder: adds the +rerank systems")
    ks: list[str] = Field(
        default=["pstar", "10", "20"], min_length=1, description="top-k values (pstar: |P**|)"
    )
    generate: bool = Field(False, description="RAG answers: Cov(y), Den(y) and Kendall's tau")
    paper: Literal["duc", "multi-news"] | None = Field(
        None, description="the paper's values beside ours for this dataset"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_folder(cls, given: Any) -> Any:
        """``data``: each of topics, passages and ratings not given is its file in the folder."""
        if not isinstance(given, dict) or given.get("data") is None:
            return given
        folder = Path(given["data"])
        found = {
            name: folder / f"{name}.jsonl"
            for name in ("topics", "passages", "ratings")
            if given.get(name) is None and (folder / f"{name}.jsonl").is_file()
        }
        return given | found

    @field_validator("ks")
    @classmethod
    def _ks(cls, value: list[str]) -> list[str]:
        for k in value:
            if k != "pstar" and not (k.isdigit() and int(k) > 0):
                raise ValueError(f"k must be pstar or a positive number, got {k!r}")
        return value

    def systems(self) -> dict[str, dict[str, Any]]:
        base: dict[str, dict[str, Any]] = {m: {"mode": m} for m in ("bm25", "dense", "hybrid")}
        out = dict(base)
        for name, spec in base.items():
            out[f"{name}+mmr"] = spec | {"mmr": MMR}
            if self.reranker:
                out[f"{name}+rerank"] = spec | {"reranker": self.reranker}
        return out

    def cell(self, index: Path, system: dict[str, Any], k: str, eta: int | None = None):
        extra = {"eta": eta} if eta is not None else {"generate": self.generate}
        return CruxOptions(
            index=index,
            topics=self.topics,
            passages=self.passages,
            ratings=self.ratings,
            rate=False,
            depth=20,
            k=None if k == "pstar" else int(k),
            **system,
            **extra,
        )


def _items(cell: CruxOptions, outcomes: dict[str, RunOutcome]) -> list[TopicItem]:
    return CRUX.load(cell)


def build_passage_index(options: ReproduceCruxOptions, out: Path) -> None:
    """The passages as one index (a passage is one chunk): BM25 and dense."""
    from ...index_build.build import IndexSpec, build_index

    topics = data.load_topics(options.topics)
    rows = data.load_passages(options.passages, topics)
    make_dirs(out.parent)
    corpus = out.parent / "corpus.jsonl"
    text = "".join(
        json.dumps({"id": pid, "contents": text}, ensure_ascii=False) + "\n"
        for by_topic in rows.values()
        for pid, text in by_topic.items()
    )
    write_atomic(corpus, text, within=out.parent)
    build_index(corpus, out, IndexSpec(chunk_size=100_000, chunk_overlap=0))


class ReproduceCrux(Study[ReproduceCruxOptions]):
    name = "reproduce-crux"
    paper_judges_without_reasoning = True  # the paper judged with Llama-3.1-70B-Instruct
    Options = ReproduceCruxOptions
    roles = {
        "generate": "the RAG answer from Z (--generate)",
        "rate": "answerability of the generated answers (--generate)",
    }

    def load(self, options: ReproduceCruxOptions) -> list[TopicItem]:
        return [TopicItem(id=t, ranked=[]) for t in data.load_topics(options.topics)]

    def check_inputs(self, options: ReproduceCruxOptions) -> None:
        topics = data.load_topics(options.topics)
        data.load_passages(options.passages, topics)
        data.load_ratings(options.ratings, topics)

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        options: ReproduceCruxOptions = request.options
        index = options.index or root / "index"
        if not (index / "manifest.json").is_file():
            if options.index is not None:
                raise UserError(f"--index {index}: not an index directory (no manifest.json)")
            build_passage_index(options, index)
        plans = []
        for name, system in options.systems().items():
            cells = [(f"{name}-k{k}", options.cell(index, system, k)) for k in options.ks]
            first = options.ks[0]
            cells += [
                (f"{name}-k{first}-eta{eta}", options.cell(index, system, first, eta))
                for eta in ETAS
            ]
            for key, cell in cells:
                items = functools.partial(_items, cell)  # the cell's own retrieval, when it runs
                plans.append(RunPlan(key, "crux", cell, framework=CRUX, items=items))
        return plans

    def combine(self, outcomes: dict[str, RunOutcome], options: ReproduceCruxOptions) -> dict:
        rows, by_eta = [], {}
        for name in options.systems():
            for k in options.ks:
                tables = outcomes[f"{name}-k{k}"].tables or {}
                rows.append({"system": name, "k": k} | {c: tables.get(c) for c in COLUMNS})
            first = options.ks[0]
            by_eta[name] = {
                str(eta): (outcomes[f"{name}-k{first}-eta{eta}"].tables or {}).get("cov")
                for eta in ETAS
            }
        tau = kendall(rows, options.ks[0]) if options.generate else None
        return {"paper": options.paper, "rows": rows, "cov_by_eta": by_eta, "kendall_tau": tau}

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        paper = PAPER.get(combined["paper"] or "", {})
        title = "CRUX Table 1 layout (x100; the paper's value in parentheses)"
        table = Table("system", "k", "Cov(Z)", "α-nDCG", "Cov(y)", "Den(Z)", "Den(y)", title=title)
        for row in combined["rows"]:
            published = paper.get(row["system"]) if row["k"] == "pstar" else None
            cells = []
            for i, key in enumerate(COLUMNS):
                text = "-" if row[key] is None else f"{100 * row[key]:.1f}"
                if published and published[i] is not None:
                    text += f" ({published[i]:.1f})"
                cells.append(text)
            table.add_row(row["system"], row["k"], *cells)
        console.print(table)
        eta = Table(
            "system", *(f"eta {e}" for e in ETAS), title="Cov(Z) by answerability threshold (x100)"
        )
        for name, values in combined["cov_by_eta"].items():
            eta.add_row(name, *("-" if v is None else f"{100 * v:.1f}" for v in values.values()))
        console.print(eta)
        for pair, tau in (combined.get("kendall_tau") or {}).items():
            console.print(
                f"Kendall tau over systems, {pair}: {'-' if tau is None else f'{tau:.3f}'}"
            )


def kendall(rows: list[dict[str, Any]], k: str) -> dict[str, float | None]:
    """Table 1's last row: over the systems at ``k``, Kendall's tau between a context metric and
    the answer metric it should predict."""
    from scipy import stats

    at_k = [r for r in rows if r["k"] == k]
    out: dict[str, float | None] = {}
    for context, answer in (("cov", "cov_y"), ("alpha_ndcg", "cov_y"), ("den", "den_y")):
        pairs = [
            (r[context], r[answer])
            for r in at_k
            if r[context] is not None and r[answer] is not None
        ]
        tau = stats.kendalltau(*zip(*pairs, strict=True)).statistic if len(pairs) > 2 else None
        out[f"{context} vs {answer}"] = None if tau is None else float(tau)
    return out


REPRODUCE_CRUX = ReproduceCrux()
