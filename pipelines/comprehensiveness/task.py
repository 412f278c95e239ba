"""One item through one method: the record written to the run's results.jsonl."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipelines.comprehensiveness import e2e_method, nli_method, qa_method
from pipelines.comprehensiveness.common import (
    ComprehensivenessConfig,
    Context,
    Item,
    StageFailed,
    summarise_contexts,
)
from pipelines.comprehensiveness.graph import build_graph, coverage, export_graph
from serving.client import EvalClient

METHODS = {"nli": nli_method.evaluate, "qa": qa_method.evaluate}


def score_record(n_in: int, n_out: int) -> dict[str, Any]:
    total = n_in + n_out
    if total == 0:  # no relevant context statement at all: S is undefined, not 0 or 1
        return {
            "status": "undefined",
            "score": None,
            "explanation": "no relevant context statements: the score is undefined",
        }
    return {
        "status": "ok",
        "score": n_in / total,
        "explanation": f"{n_in} of {total} relevant context statements are covered",
    }


async def evaluate_item(
    client: EvalClient,
    item: Item,
    config: ComprehensivenessConfig,
    *,
    nli_judge: Any = None,
    graph_dir: Path | None = None,
) -> dict[str, Any]:
    if config.method == "nli" and nli_judge is None:
        nli_judge = nli_method.make_judge(config)  # pass one in to share a loaded cross-encoder
    ctx = Context(client, config, nli=nli_judge)
    record: dict[str, Any] = {"method": config.method, "meta": item.meta}
    try:
        contexts = item.contexts
        if config.summarise:
            contexts = await summarise_contexts(ctx, item.query, item.contexts)
            record["summaries"] = contexts
        if config.method == "e2e":
            result = await e2e_method.evaluate(ctx, item, contexts)
            record |= score_record(len(result["covered"]), len(result["uncovered"])) | result
        else:
            record |= await _graph_method(ctx, item, contexts, graph_dir)
    except StageFailed as failure:
        record |= {
            "status": "unparseable", "score": None, "failed_stage": failure.stage,
            "error": failure.error, "outputs": failure.outputs,
            "explanation": f"stage {failure.stage} stayed unparseable after re-asks",
        }  # fmt: skip
    record["usage"] = ctx.usage()
    return record


async def _graph_method(ctx, item, contexts, graph_dir) -> dict[str, Any]:
    found = await METHODS[ctx.config.method](ctx, item, contexts)
    statements = found["statements"]
    graph = build_graph(statements, found["entailments"])
    result = coverage(graph)
    text = {s.id: s.text for s in statements}
    record = score_record(len(result.covered), len(result.uncovered))
    record |= {
        "covered": [{"id": i, "text": text[i]} for i in result.covered],
        "uncovered": [{"id": i, "text": text[i]} for i in result.uncovered],
        "basis": [{"id": i, "text": text[i]} for i in result.basis],
        "statements": [dataclasses.asdict(s) for s in statements],
        "components": result.components,
        "details": found["details"],
    }
    if ctx.config.export_graphs and graph_dir is not None:
        record["graph_files"] = export_graph(graph, result, graph_dir / _safe(item.id))
    return record


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]
