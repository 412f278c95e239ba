"""Comprehensiveness on the runtime: one item through one method to S, the meta-evaluation
tables (LMR), the ELI5 study, and their commands (`eval comprehensiveness`, `meta-eval`, `eli5`).

Where the score comes from: ``Comprehensiveness.solve`` runs the method (``nli_method``,
``qa_method`` or ``e2e_method``); the graph methods condense their fact graph in
``graph.coverage``; every method's S is ``graph.comprehensiveness(|A_in|, |A_out|)``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from groundcover import (
    Average,
    Framework,
    InputFile,
    ItemContext,
    ItemResult,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
    UserError,
    Vote,
    not_scored,
)
from groundcover.inputs import AnswerFile, read_jsonl
from groundcover.judges import HumanLabel, SwapPair
from groundcover.models import EvalClient, EvaluatorConfig, model_name, responder_config
from groundcover.nli import PLACEMENT_FIELDS

from ..shared.answering import GENERATE, GenerateItem, GenerateOptions
from . import e2e_method, meta, nli_method, qa_method
from .common import (
    PROMPTS,
    ComprehensivenessOptions,
    Item,
    Method,
    QueryItem,
    summarise_contexts,
)
from .graph import (
    build_graph,
    comprehensiveness,
    coverage,
    coverage_by_source,
    export_graph,
    source_counts,
)
from .parsers import RELATIONS
from .rules import Rules

GRAPH_METHODS = {"nli": nli_method.evaluate, "qa": qa_method.evaluate}


class Comprehensiveness(Framework[ComprehensivenessOptions, Item]):
    name = "comprehensiveness"
    Options = ComprehensivenessOptions
    prompts = PROMPTS
    report_only = frozenset({"resamples", "nli_device"}) | PLACEMENT_FIELDS
    roles = {"judge": "every stage: atoms / questions, relevance, NLI or comparison, E2E"}
    stage_roles = {nli_method.CROSS_ENCODER_STAGE: "nli", "*": "judge"}
    # a judge panel: NLI labels by strict majority (a tie asserts no relation: neutral), spec
    # relevance scores by their mean; the other stages (extraction, coverage lists) are asked
    # of the first member
    panel_rules = {
        "nli": Vote(tie="neutral"),
        "relevance": Average("mean"),
        # Q&A: a panel's relation between two answers is its members' vote (the paper's reading
        # by the label's first-token probability is a lone judge's); a tie asserts none
        "compare": Vote(tie="neutral", labels=RELATIONS),
    }
    # responses made elsewhere (--answers): {id, response} as the items have them, or another
    # harness's log; an item without one is not scored, and counted
    answer_file = AnswerFile(answer_field="response", missing="not scored, counted")

    def identity(self, options: ComprehensivenessOptions, paths: bool = False) -> dict[str, Any]:
        """As every framework's, without ``answers`` where none is given: runs made before
        comprehensiveness took an answers file keep their identity."""
        found = super().identity(options, paths)
        if found.get("answers") is None:
            found.pop("answers", None)
        return found

    def human_labels(
        self, record: ItemResult, options: ComprehensivenessOptions
    ) -> list[HumanLabel]:
        """WikiContradict's annotators graded each response Correct / Partially correct /
        Incorrect: beside them, the label the score predicts (the meta-evaluation's rule) and
        the score itself (the grades as 1 / 0.5 / 0)."""
        label = (record.details.get("meta") or {}).get("label")
        if label not in meta.LABEL_VALUE:
            return []
        score = meta.table_score(record, options.rules)
        predicted = meta.predicted_label(score, options.rules)
        return [
            HumanLabel("label", predicted, label, order=meta.LABEL_ORDER),
            HumanLabel("score", score, meta.LABEL_VALUE[label]),
        ]

    def score_protocol(self, options: ComprehensivenessOptions) -> dict[str, Any]:
        return {"protocol": options.protocol}

    def light_setup(self, options: ComprehensivenessOptions) -> bool:
        return options.method != "nli" or options.nli_backend == "llm"

    def known_calls(self, item: Item, options: ComprehensivenessOptions) -> dict[str, int]:
        """A summary per context; E2E: one coverage call; NLI: one extraction per non-empty
        text, when the texts are the item's own (not summaries)."""
        known = {"summarise": len(item.contexts)} if options.rules.summarisation else {}
        if options.method == "e2e":
            known["coverage"] = 1
        elif options.method == "nli" and not options.rules.summarisation:
            known["extract"] = sum(bool(t.strip()) for t in [item.response, *item.contexts])
        return known

    def load(self, options: ComprehensivenessOptions) -> Sequence[Item]:
        if options.input is None:
            raise UserError("comprehensiveness: no input file given")
        if options.dataset == "wikicontradict":
            return meta.wikicontradict_items(options.input, options.limit)
        if options.dataset == "conflictbank":
            return meta.conflictbank_items(options.input, options.limit, options.rules)
        shape = Item if options.answers is None else QueryItem
        return read_jsonl(options.input, shape, limit=options.limit)

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        options = request.options
        prefix = "comprehensiveness" if options.dataset == "items" else f"meta-{options.dataset}"
        return [RunPlan("", f"{prefix}-{options.method}", options)]

    def setup(self, request: RunRequest, root: Path) -> Any:
        """The NLI judge, loaded once per run (a cross-encoder is shared by every item)."""
        options = request.options
        if options.method != "nli":
            return None
        return nli_method.make_judge(options, request.evaluator.ray_address)

    async def solve(self, item: Item, ctx: ItemContext) -> ItemResult:
        options: ComprehensivenessOptions = ctx.options
        ctx.details |= {"method": options.method, "protocol": options.protocol, "meta": item.meta}
        if ctx.answered_elsewhere:
            given = ctx.given_answer()
            if given is None:
                ctx.details["missing_answer"] = True
                explanation = "the answers file has no response for this id: not scored, counted"
                return ctx.result("abstained", None, explanation)
            item = item.model_copy(update={"response": given})
            ctx.details["answer"] = given
        contexts = item.contexts
        if options.rules.summarisation:
            contexts = await summarise_contexts(ctx, item.query, item.contexts)
            ctx.details["summaries"] = contexts
        if options.method == "e2e":
            found = await e2e_method.evaluate(ctx, item, contexts)
            ctx.details |= found
            n_in, n_out = len(found["covered"]), len(found["uncovered"])
            ctx.details["sources"] = source_counts(
                [(s["sources"], True) for s in found["covered"]]
                + [(s["sources"], False) for s in found["uncovered"]]
            )
        else:
            n_in, n_out = await graph_method(ctx, item, contexts)
        score = comprehensiveness(n_in, n_out)
        if score is None:
            explanation = "no relevant context statements: the score is undefined"
            return ctx.result("undefined", None, explanation)
        explanation = f"{n_in} of {n_in + n_out} relevant context statements are covered"
        return ctx.result("ok", score, explanation)

    def swap_pairs(self, record: ItemResult) -> list[SwapPair]:
        """The Q&A method's answer comparisons: two answers to one question, in an order."""
        if record.details.get("method") != "qa":
            return []
        return qa_method.swap_pairs(record.details)

    async def ask_swapped(self, ctx: ItemContext, pair: SwapPair) -> str:
        return await qa_method.ask_swapped(ctx, pair)

    def tables_file(self, options: ComprehensivenessOptions) -> str | None:
        return None if options.dataset == "items" else "lmr.json"

    def aggregate(
        self, results: list[ItemResult], options: ComprehensivenessOptions
    ) -> dict | None:
        if options.dataset == "items":
            return None  # plain items: the summary's mean S is the result
        tables = {"dataset": options.dataset, "method": options.method}
        if options.dataset == "wikicontradict":
            return tables | meta.lmr_wikicontradict(results, options.resamples, options.rules)
        return tables | meta.lmr_conflictbank(results, options.resamples, options.rules)

    def render(self, tables: dict[str, Any], console: Console) -> None:
        meta.print_lmr(tables, console)

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        if not tables or tables.get("lmr") is None:
            return []
        if "by_label" in tables:  # WikiContradict: overall LMR (with its BCa interval), per label
            labels = ["all", *tables["by_label"]]
            values = [tables["lmr"], *(e["lmr"] for e in tables["by_label"].values())]
            ci = tables.get("ci95") or {}
            low = [ci.get("low"), *[None] * len(tables["by_label"])]
            high = [ci.get("high"), *[None] * len(tables["by_label"])]
            spec = {
                "kind": "bars",
                "labels": labels,
                "values": values,
                "low": low,
                "high": high,
                "ylabel": "LMR",
            }
            return [("LMR per label (95% BCa for all)", spec)]
        keys = [("strict", "strict_ci95"), ("lax", "lax_ci95"), ("mean", "ci95")]
        values = [tables["strict"], tables["lax"], tables["lmr"]]
        intervals = [tables.get(c) or {} for _, c in keys]
        spec = {
            "kind": "bars",
            "labels": [k for k, _ in keys],
            "values": values,
            "low": [i.get("low") for i in intervals],
            "high": [i.get("high") for i in intervals],
            "ylabel": "LMR",
        }
        return [("ConflictBank LMR (95% BCa)", spec)]


async def graph_method(ctx: ItemContext, item: Item, contexts: list[str]) -> tuple[int, int]:
    """NLI- or Q&A-based: statements and entailments, the condensed fact graph, its coverage."""
    found = await GRAPH_METHODS[ctx.options.method](ctx, item, contexts)
    statements = found["statements"]
    graph = build_graph(statements, found["entailments"])
    result = coverage(graph)
    text = {s.id: s.text for s in statements}
    ctx.details |= {
        "sources": coverage_by_source(statements, result),
        "covered": [{"id": i, "text": text[i]} for i in result.covered],
        "uncovered": [{"id": i, "text": text[i]} for i in result.uncovered],
        "basis": [{"id": i, "text": text[i]} for i in result.basis],
        "statements": [dataclasses.asdict(s) for s in statements],
        "components": result.components,
        **found["details"],
    }
    if ctx.options.export_graphs:  # file writing off the event loop
        stem = ctx.run_dir / "graphs" / graph_name(item.id)
        written = await asyncio.to_thread(export_graph, graph, result, stem, ctx.run_dir)
        # recorded relative to the run: a reader follows them only inside the run, wherever
        # the run directory is moved or sent (``store.contained``)
        ctx.details["graph_files"] = {
            kind: Path(path).relative_to(ctx.run_dir).as_posix() for kind, path in written.items()
        }
    return len(result.covered), len(result.uncovered)


def graph_name(item_id: str) -> str:
    """The name an item's fact graph files have in ``graphs/`` (the kinds' suffixes added to
    it): the id where it is a plain name, else a plain name made of it with a digest of the
    whole id, so that two ids never share files (``q.1`` and ``q.2``, ``a/b`` and ``a_b``, ids
    past the length cut) and none is a dot-name (``..``, ``.hidden``)."""
    plain = "".join(c if c.isalnum() or c in "-_." else "_" for c in item_id)
    if plain == item_id and len(item_id) <= 120 and not item_id.startswith("."):
        return item_id
    digest = hashlib.sha256(item_id.encode()).hexdigest()[:16]
    return f"{plain.strip('.')[:100] or 'item'}-{digest}"


COMPREHENSIVENESS = Comprehensiveness()


async def evaluate_item(
    client: EvalClient,
    item: Item,
    options: ComprehensivenessOptions,
    *,
    nli_judge: Any = None,
    run_dir: Path | None = None,
) -> ItemResult:
    """One item outside a run (benchmarks, notebooks): the same solve, recorded failures too.
    Graph files are written under ``run_dir`` only when one is given."""
    from groundcover.runs import solve_item

    if run_dir is None:
        options = options.model_copy(update={"export_graphs": False})
        run_dir = Path(".")

    if options.method == "nli" and nli_judge is None:
        nli_judge = nli_method.make_judge(options)
    ctx = ItemContext(
        item.id, client, options, nli_judge, run_dir, options.max_reasks, COMPREHENSIVENESS
    )
    return await solve_item(COMPREHENSIVENESS, item, ctx)


# ---- the ELI5 study: responders answer from background texts, the evaluator scores them ------


class Eli5Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: InputFile = Field(description="JSONL: id, query, contexts (background texts)")
    responders: list[str] = Field(
        default_factory=list, description="answering MODEL or MODEL@URL (default: the answer role)"
    )
    methods: list[Method] = Field(
        default=["qa", "e2e"], min_length=1, description="the methods each answer is scored by"
    )
    metric: ComprehensivenessOptions = Field(default_factory=ComprehensivenessOptions)


class Eli5(Study[Eli5Options]):
    """Per responder: a generate run (template answer_from_texts), then one comprehensiveness
    run per method over the answers it gave; combined into the paper's Figure-6 table."""

    name = "eli5"
    Options = Eli5Options
    roles = {
        "answer": "the responders (--responder repeats it)",
        "judge": "scores every answer's comprehensiveness",
    }

    def responders(self, request: RunRequest) -> list[tuple[str, EvaluatorConfig]]:
        specs = request.options.responders
        if not specs:
            answer = request.role("answer")
            return [(model_name(answer), answer)]
        return [responder_config(spec, request.evaluator) for spec in specs]

    def load(self, options: Eli5Options) -> Sequence[GenerateItem]:
        questions = read_jsonl(options.input, GenerateItem)
        for q in questions:
            if not q.contexts:
                raise UserError(
                    f"{options.input}: record {q.id!r}: field contexts: background texts needed"
                )
        return questions

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        options: Eli5Options = request.options
        questions = {q.id: q for q in self.load(options)}
        answer_options = GenerateOptions(input=options.input, template="answer_from_texts")
        plans = []
        for name, responder in self.responders(request):
            plans.append(
                RunPlan(
                    f"answers-{name}",
                    "eli5-answers",
                    answer_options,
                    framework=GENERATE,
                    roles={"answer": responder},
                )
            )
            answered = functools.partial(_answered_items, questions, f"answers-{name}", name)
            for method in options.methods:
                metric = options.metric.model_copy(update={"method": method, "dataset": "items"})
                plans.append(
                    RunPlan(
                        f"{method}-{name}",
                        f"eli5-{method}",
                        metric,
                        framework=COMPREHENSIVENESS,
                        items=answered,
                        systems={"answer": responder},
                    )
                )
        return plans

    def combine(self, outcomes: dict[str, RunOutcome], options: Eli5Options) -> dict[str, Any]:
        table: dict[str, dict[str, Any]] = {}
        for key, answers in outcomes.items():
            if not key.startswith("answers-"):
                continue
            name = key.removeprefix("answers-")
            answered = sum(r.status == "ok" for r in answers.results)
            questions = answers.summary.items if answers.summary else len(answers.results)
            row: dict[str, Any] = {"answered": answered, "questions": questions}
            for method in options.methods:
                if f"{method}-{name}" in outcomes:
                    results = outcomes[f"{method}-{name}"].results
                    row[method] = _mean_with_ci(results, options.metric.rules)
                    if method in _eli5_paper(name):
                        row[method]["paper"] = _eli5_paper(name)[method]
            table[name] = row
        return table

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        methods = sorted({k for row in combined.values() for k in row} - {"answered", "questions"})
        title = "ELI5 comprehensiveness (mean S, 95% CI; paper value in parentheses)"
        out = Table("responder", "answered", *methods, title=title)
        for name, row in combined.items():
            cells = []
            for m in methods:
                entry = row.get(m, {})
                if entry.get("mean") is None:
                    unscored = sum(entry.get("not_scored", {}).values())
                    cells.append(f"undefined ({unscored} not scored)")
                    continue
                ci = entry["ci95"]
                paper = f" ({entry['paper']:g})" if "paper" in entry else ""
                cells.append(
                    f"{entry['mean']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}] n={entry['n']}{paper}"
                )
            out.add_row(name, f"{row['answered']}/{row['questions']}", *cells)
        console.print(out)


def _answered_items(
    questions: dict[str, GenerateItem], key: str, responder: str, outcomes: dict[str, RunOutcome]
) -> list[Item]:
    return [
        Item(
            id=r.id,
            query=questions[r.id].question,
            contexts=questions[r.id].contexts,
            response=r.details["response"],
            responder=responder,
        )
        for r in outcomes[key].results
        if r.status == "ok"
    ]


def _mean_with_ci(results: Sequence[ItemResult], rules: Rules = meta.PAPER) -> dict[str, Any]:
    """Mean S with a BCa interval. paper: an undefined answer (nothing relevant in its texts)
    counts as S = 0, as the reference scores it, and is counted; other unscored ones are left
    out and counted."""

    def score(r: ItemResult) -> float | None:
        return meta.table_score(r, rules)

    scores = [s for s in map(score, results) if s is not None]
    entry: dict[str, Any] = {"n": len(scores), "not_scored": not_scored(results, score)}
    if rules.undefined_scored_zero:
        entry["undefined_scored_as_zero"] = sum(r.status == "undefined" for r in results)
    if scores:
        entry["mean"] = sum(scores) / len(scores)
        entry["ci95"] = meta.bca_interval(scores, seed=rules.bootstrap_seed).as_dict()
    return entry


# Figure 6's values stated in the paper's text (evaluators gpt-oss-20b Q&A, Llama 4 E2E).
ELI5_PAPER = {"gpt-oss-120b": {"qa": 0.71, "e2e": 0.83}, "qwen2.5-72b": {"qa": 0.66, "e2e": 0.73}}


def _eli5_paper(responder: str) -> dict[str, float]:
    name = responder.lower().replace("_", "-").replace("qwen-2.5", "qwen2.5")
    return next((v for k, v in ELI5_PAPER.items() if k in name), {})


ELI5 = Eli5()
