"""ICAT on the runtime (SPEC §2): claims -> grounding -> aspects and alignment -> scores.

Where the score comes from: ``Icat.solve`` extracts the claims (``extract_claims``), grounds them
(``grounding.Grounder``: retrieval + NLI), then per variant finds the covered aspects
(``covered_m`` from qrels, ``covered_llm`` by LLM alignment for ICAT-S/A) and computes S_fact,
S_cov and ICAT_β with ``scoring``. ``Icat.aggregate`` macro-averages per system and variant.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console
from rich.table import Table

from groundcover import (
    Cover,
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    Judgement,
    ParseError,
    PromptTemplate,
    UserError,
    load_dir,
    not_scored,
)
from groundcover.inputs import IndexDir, ModelName
from groundcover.judges import cover_label, load_variants
from groundcover.nli import PLACEMENT_FIELDS, NliPlacement, placement_of
from groundcover.serving.redact import clipped

from ..shared.claims import CLAIMS_PROMPT, extract_claims
from . import data, scoring
from .grounding import (
    ClaimGrounding,
    EntailmentModel,
    Grounder,
    NliBatcher,
)

# ICAT's prompts, with the claim extraction it shares with the claim extractors' fine-tuning
PROMPTS = load_dir(Path(__file__).parent / "prompts") | {"extract_claims": CLAIMS_PROMPT}
VARIANTS = load_variants(Path(__file__).parent / "prompts")  # paraphrases (agreement, panels)
NLI_STAGE = "nli-cross-encoder"  # snippet-claim pairs the NLI model judged (no LLM call)
Variant = Literal["m", "s", "a"]
NAMES = {"m": "ICAT-M", "s": "ICAT-S", "a": "ICAT-A"}


class IcatOptions(FrameworkOptions, NliPlacement):
    input: InputFile = Field(description="responses JSONL: query_id, response (id, system)")
    queries: InputFile = Field(description="queries JSONL: query_id, query, subtopics")
    qrels: InputFile | None = Field(None, description="qrels JSONL (ICAT-M)")
    index: IndexDir | None = Field(None, description="corpus index built by `index build`")
    snippets: InputFile | None = Field(None, description="web snippets per claim (JSONL)")
    variants: list[Variant] = Field(
        default=["s", "a"], min_length=1, description="ICAT-M / -S / -A, e.g. m,s,a"
    )
    betas: list[float] = Field(
        default_factory=lambda: [1.0], min_length=1, description="beta of ICAT_beta, e.g. 0.5,1,2"
    )
    k: int = Field(10, ge=1, le=1000, description="snippets per claim")
    retrieval: Literal["dense", "bm25", "hybrid"] = Field(
        "dense", description="how a claim's evidence is retrieved from the corpus"
    )
    nli_model: ModelName = Field(description="NLI cross-encoder (DeBERTa-v3 MNLI/FEVER/ANLI)")
    nli_device: str = "cpu"
    nli_batch: int = Field(32, ge=1)
    threshold: float = Field(scoring.THRESHOLD, gt=0, lt=1, description="P(entailment) >")
    max_aspects: int = Field(10, ge=1, le=50)
    list_max_items: int = Field(60, ge=1, le=500, description="most claims per response (vLLM)")
    line_max_chars: int = Field(300, ge=20, le=2000)
    limit: int | None = Field(None, ge=1, description="only the first N responses")

    def cross_encoder(self) -> tuple[str, str, int]:
        return self.nli_model, self.nli_device, self.nli_batch

    @model_validator(mode="after")
    def _sources(self) -> IcatOptions:
        if (self.index is None) == (self.snippets is None):
            raise ValueError("give exactly one knowledge source: index or snippets")
        if "m" in self.variants and self.qrels is None:
            raise ValueError("variant m (ICAT-M) needs qrels")
        if any(b <= 0 for b in self.betas):
            raise ValueError("betas must be positive")
        return self


class Resources:
    """Shared by the items of a run: the grounder (index + NLI batcher), qrels, ICAT-A aspects."""

    def __init__(self, grounder: Grounder, qrels: dict[str, dict[str, set[str]]]):
        self.grounder, self.qrels = grounder, qrels
        self.aspects: dict[str, asyncio.Task] = {}

    def placement(self) -> dict[str, Any] | None:
        return placement_of(self.grounder.batcher.model)

    def close(self) -> None:
        self.grounder.batcher.close()
        if hasattr(self.grounder.batcher.model, "close"):
            self.grounder.batcher.model.close()


# ---- aspects and alignment -------------------------------------------------------------------


def parse_aspects(text: str, limit: int) -> list[str]:
    """ICAT-A aspects: JSON lines {"topic": "..."}; repeated ones once; at most ``limit``."""
    found: list[str] = []
    for raw in re.findall(r"\{[^{}]*\}", text or ""):
        try:
            topic = json.loads(raw).get("topic")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(topic, str) and topic.strip() and topic.strip() not in found:
            found.append(topic.strip())
    if not found:
        raise ParseError('expected lines {"topic": "<aspect>"}')
    return found[:limit]


async def generated_aspects(ctx: ItemContext, item: data.Response) -> list[data.Subtopic]:
    """ICAT-A's aspects of the query: generated once per query and run, shared by its items."""
    resources: Resources = ctx.resources
    if item.query_id not in resources.aspects:
        resources.aspects[item.query_id] = asyncio.ensure_future(_generate(ctx, item.query))
    else:
        ctx.details["aspects_shared"] = True
    return await resources.aspects[item.query_id]


async def _generate(ctx: ItemContext, query: str) -> list[data.Subtopic]:
    options: IcatOptions = ctx.options
    topic = rf'\{{"topic": "[^"\n\\]{{1,{options.line_max_chars}}}"\}}\n'
    parsed = await ctx.ask(
        PROMPTS["generate_aspects"],
        "aspects",
        lambda t: parse_aspects(t, options.max_aspects),
        'one {"topic": "<aspect>"} per line',
        {"query": query, "max_aspects": options.max_aspects},
        regex=rf"({topic}){{1,{options.max_aspects}}}",
    )
    return [data.Subtopic(id=str(n), text=t) for n, t in enumerate(parsed.value, 1)]


def alignment_regex(n_aspects: int, n_claims: int) -> str:
    line = (
        r'\{"topic_id": [1-9][0-9]?, "evidence": \[[1-9][0-9]{0,2}(, [1-9][0-9]{0,2}){0,19}\]\}\n'
    )
    return rf"({line}){{0,{n_aspects}}}"


ALIGNMENT_EXPECTED = 'lines {"topic_id": <aspect number>, "evidence": [<claim numbers>]}'


async def align(
    ctx: ItemContext,
    stage: str,
    values: dict[str, Any],
    template: PromptTemplate | None = None,
) -> Any:
    """The alignment of ``values`` (query, aspects, grounded claims) as ``stage`` asks it: its
    ``Parsed`` answer, or ``StageFailed`` when it stays unreadable."""
    n_aspects, n_claims = len(values["aspects"]), len(values["claims"])
    return await ctx.ask(
        template or PROMPTS["align_aspects"],
        stage,
        lambda t: scoring.parse_alignment(t, n_aspects, n_claims),
        ALIGNMENT_EXPECTED,
        values,
        regex=alignment_regex(n_aspects, n_claims),
    )


async def covered_llm(
    ctx: ItemContext,
    item: data.Response,
    aspects: list[data.Subtopic],
    claims: list[str],
    stage: str,
) -> tuple[list[str], dict[str, Any]]:
    """ICAT-S/A: the LLM aligns the grounded claims (numbered 1..n) with the aspects (numbered
    1..m, mapped back to their real ids); no grounded claim covers nothing, without a call."""
    if not claims:
        return [], {"aspects": [a.id for a in aspects], "covered": [], "note": "no grounded claim"}
    values = {"query": item.query, "aspects": [a.text for a in aspects], "claims": claims}
    parsed = await align(ctx, stage, values)
    found: scoring.Alignment = parsed.value
    covered = [aspects[n - 1].id for n in found.covered]
    evidence = {
        aspects[n - 1].id: [claims[i - 1] for i in found.evidence[n]] for n in found.covered
    }
    return covered, {
        "aspects": [a.id for a in aspects],
        "covered": covered,
        "evidence": evidence,
        "ignored": found.ignored,
    }


def covered_m(
    item: data.Response, grounding: list[ClaimGrounding], qrels: dict[str, dict[str, set[str]]]
) -> tuple[list[str], dict[str, Any]]:
    """ICAT-M: the subtopics the qrels of this query give the document of each grounded claim's
    first entailing snippet."""
    query_qrels = qrels.get(item.query_id, {})
    covered_ids = scoring.covered_by_qrels((g.supporting_doc for g in grounding), query_qrels)
    covered = [s.id for s in item.subtopics if s.id in covered_ids]
    via = {
        s: sorted(
            {
                g.supporting_doc or ""
                for g in grounding
                if g.grounded and s in query_qrels.get(g.supporting_doc or "", set())
            }
        )
        for s in covered
    }
    return covered, {"aspects": [s.id for s in item.subtopics], "covered": covered, "via": via}


# ---- the framework ---------------------------------------------------------------------------


class Icat(Framework[IcatOptions, data.Response]):
    name = "icat"
    Options = IcatOptions
    prompts = PROMPTS
    report_only = frozenset({"nli_device", "nli_batch"}) | PLACEMENT_FIELDS
    roles = {
        "extract": "the claims of a response (--extractor NAME: an adapter on --model)",
        "judge": "ICAT-A's aspects and ICAT-S/A's alignment",
    }
    stage_roles = {"claims": "extract", NLI_STAGE: "nli", "aspects": "judge", "align_*": "judge"}
    # an alignment's verdict is the set of aspects covered: a panel (and a cascade's tier)
    # covers an aspect where a strict majority of its members do; the aspects are generated
    # text, with no verdict to agree on: the first member (a cascade's strongest tier) asks them
    panel_rules = {"align_*": Cover(kind=scoring.Alignment)}
    prompt_variants = {"align_*": VARIANTS["align_aspects"]}

    def roles_used(self, options: IcatOptions) -> list[str]:
        return ["extract"] + ["judge"] * bool({"s", "a"} & set(options.variants))

    def item_metrics(self, record: ItemResult) -> dict[str, float | None]:
        """S_fact, then per variant S_cov and ICAT at each beta (``icat_m.s_cov``,
        ``icat_m.icat_1``); undefined stays None."""
        found: dict[str, float | None] = {"score": record.score}
        found["s_fact"] = record.details.get("s_fact")
        for variant, scores in (record.details.get("variants") or {}).items():
            name = NAMES.get(variant, variant).lower().replace("-", "_")
            found[f"{name}.s_cov"] = scores.get("s_cov")
            for beta, value in (scores.get("icat") or {}).items():
                found[f"{name}.icat_{beta}"] = value
        return found

    def load(self, options: IcatOptions) -> list[data.Response]:
        queries = data.load_queries(options.queries)
        need = bool({"m", "s"} & set(options.variants))
        return data.load_responses(options.input, queries, need)[: options.limit]

    def check_inputs(self, options: IcatOptions) -> None:
        if options.snippets is not None:
            data.load_snippets(options.snippets)
        if "m" in options.variants and options.qrels is not None:
            data.load_qrels(options.qrels, set())

    def setup(self, request, root: Path) -> Resources:
        options: IcatOptions = request.options
        ev = request.evaluator
        index = web = None
        if options.index is not None:
            from ...retrieval.index import IndexError_, SearchIndex

            try:
                index = SearchIndex.load(options.index)
            except IndexError_ as exc:
                raise UserError(str(exc)) from exc
        else:
            web = data.load_snippets(options.snippets)  # type: ignore[arg-type]
        qrels: dict[str, dict[str, set[str]]] = {}
        if "m" in options.variants:
            wanted = {i.query_id for i in self.load(options)}
            qrels, where = data.load_qrels(options.qrels, wanted)  # type: ignore[arg-type]
            if index is not None:
                for (qid, doc), lineno in sorted(where.items(), key=lambda kv: kv[1]):
                    if doc not in index.doc_rows:
                        raise UserError(
                            f"{options.qrels}:{lineno}: record {qid!r}: field doc_id: "
                            f"{doc!r} is not in the index {options.index}"
                        )
        nli = NliBatcher(self.nli(options, ev.ray_address))
        grounder = Grounder(nli, options.k, index, options.retrieval, web, options.threshold)
        return Resources(grounder, qrels)

    def nli(self, options: IcatOptions, ray_address: str | None = None) -> EntailmentModel:
        """The NLI cross-encoder (``retrieval.nli``), loaded once per run."""
        from ...retrieval.nli import NliModelError

        try:  # here, on a Serve app or on Ray actors: the same numbers
            return options.open_nli(*options.cross_encoder(), ray_address)
        except (OSError, NliModelError) as exc:
            raise UserError(f"NLI model {options.nli_model!r}: {clipped(str(exc), 200)}") from exc

    async def solve(self, item: data.Response, ctx: ItemContext) -> ItemResult:
        options: IcatOptions = ctx.options
        ctx.details |= {"query_id": item.query_id, "system": item.system}
        seconds = ctx.details.setdefault("seconds", {})  # wall time per stage (bench_icat)
        started = time.perf_counter()
        claims = await extract_claims(ctx, item.response)
        ctx.details["claims"] = claims
        seconds["claims"] = round(time.perf_counter() - started, 4)
        if not claims:
            return ctx.result("undefined", None, "no claims in the response: ICAT is undefined")
        started = time.perf_counter()
        grounding = await ctx.resources.grounder.ground(claims)
        seconds["grounding"] = round(time.perf_counter() - started, 4)
        ctx.account(NLI_STAGE, sum(len(g.snippets) for g in grounding))
        ctx.details["grounding"] = [g.record() for g in grounding]
        grounded = [g.claim for g in grounding if g.grounded]
        s_fact = len(grounded) / len(claims)
        ctx.details["s_fact"] = s_fact
        variants: dict[str, Any] = {}
        for variant in options.variants:
            started = time.perf_counter()
            variants[variant] = await self._variant(ctx, item, variant, grounding, grounded)
            seconds[NAMES[variant]] = round(time.perf_counter() - started, 4)
        ctx.details["variants"] = variants
        primary = variants[options.variants[0]]
        name = NAMES[options.variants[0]]
        if primary["s_cov"] is None:
            return ctx.result("undefined", None, f"{name}: no aspects, S_cov is undefined")
        beta = options.betas[0]
        explanation = (
            f"{len(grounded)} of {len(claims)} claims grounded (S_fact {s_fact:.3f}); "
            f"{name}: {len(primary['covered'])} of {len(primary['aspects'])} aspects covered "
            f"(S_cov {primary['s_cov']:.3f}); ICAT_{beta:g} {primary['icat'][str(beta)]:.3f}"
        )
        return ctx.result("ok", primary["icat"][str(beta)], explanation)

    async def _variant(self, ctx, item, variant, grounding, grounded) -> dict[str, Any]:
        if variant == "m":
            covered, found = covered_m(item, grounding, ctx.resources.qrels)
        else:
            aspects = item.subtopics if variant == "s" else await generated_aspects(ctx, item)
            if variant == "a":
                found_aspects = [a.text for a in aspects]
                ctx.details["generated_aspects"] = found_aspects
            covered, found = await covered_llm(ctx, item, aspects, grounded, f"align_{variant}")
        s_cov = scoring.ratio(len(covered), len(found["aspects"]))
        s_fact = ctx.details["s_fact"]
        icat = {
            str(b): None if s_cov is None else scoring.icat_beta(s_fact, s_cov, b)
            for b in ctx.options.betas
        }
        return found | {"s_cov": s_cov, "icat": icat}

    def judgements(
        self, item: data.Response, record: ItemResult, options: IcatOptions
    ) -> list[Judgement]:
        """The alignments the run's judge made (ICAT-S/A), each asked of the query, the aspects
        and the grounded claims it was asked with; its verdict the covered aspects' numbers as
        a set's label. An alignment with no grounded claim was no call."""
        grounded = [g["claim"] for g in record.details.get("grounding") or [] if g["grounded"]]
        variants = record.details.get("variants") or {}
        found = []
        for variant in ("s", "a"):
            done = variants.get(variant)
            if not done or not grounded or "evidence" not in done:
                continue
            if variant == "s":
                texts = {s.id: s.text for s in item.subtopics}
                aspects = [texts.get(i) for i in done["aspects"]]
            else:
                aspects = list(record.details.get("generated_aspects") or [])
            if None in aspects or len(aspects) != len(done["aspects"]):
                continue  # the inputs changed since: not the judgement the run made
            numbers = {aspect_id: n for n, aspect_id in enumerate(done["aspects"], 1)}
            verdict = cover_label(numbers[i] for i in done["covered"])
            values = {"query": item.query, "aspects": aspects, "claims": grounded}
            found.append(Judgement(f"align_{variant}", variant, verdict, values))
        return found

    async def ask_judgement(
        self, ctx: ItemContext, judgement: Judgement, template: PromptTemplate | None = None
    ) -> str:
        parsed = await align(ctx, judgement.stage, judgement.values, template)
        return cover_label(parsed.value.covers())

    def tables_file(self, options: IcatOptions) -> str:
        return "icat.json"

    def aggregate(self, results: list[ItemResult], options: IcatOptions) -> dict[str, Any]:
        return {
            "betas": options.betas,
            "variants": options.variants,
            "systems": table3(results, options),
        }

    def render(self, tables: dict[str, Any], console: Console) -> None:
        render_table3(tables, console)

    def figures(self, tables: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        """ICAT_β over the β sweep, one line per system and variant (the paper's Figure 3)."""
        if not tables or len(tables["betas"]) < 2:
            return []
        series = {}
        for system, row in tables["systems"].items():
            for v in tables["variants"]:
                sweep = row[NAMES[v]]["icat"]
                series[f"{system} {NAMES[v]}"] = [sweep[str(b)]["mean"] for b in tables["betas"]]
        spec = {
            "kind": "lines",
            "x": tables["betas"],
            "series": series,
            "xlabel": "β",
            "ylabel": "ICAT_β",
        }
        return [("ICAT_β sweep", spec)]


def _per_query(values: list[tuple[str, float | None]]) -> list[float | None]:
    """One value per query: the mean of its items' defined values (None if none is defined)."""
    by_query: dict[str, list[float]] = {}
    for qid, value in values:
        by_query.setdefault(qid, [])
        if value is not None:
            by_query[qid].append(value)
    return [sum(v) / len(v) if v else None for _, v in sorted(by_query.items())]


def _column(records: list[ItemResult], get) -> dict[str, Any]:
    pairs = [(r.details.get("query_id", r.id), get(r)) for r in records]
    mean, n, undefined = scoring.macro_average(_per_query(pairs))
    return {"mean": mean, "queries": n, "undefined_queries": undefined}


def _variant_value(record: ItemResult, variant: str, beta: float | None = None) -> float | None:
    """S_cov (beta None) or ICAT_beta of one variant in one record; None if it has none."""
    found = record.details.get("variants", {}).get(variant)
    if not found:
        return None
    return found["s_cov"] if beta is None else found["icat"].get(str(beta))


def table3(results: list[ItemResult], options: IcatOptions) -> dict[str, Any]:
    """Per system: S_fact and, per variant, S_cov and ICAT_β for every β, each the mean of
    per-query values (macro average); undefined values are counted, never averaged in."""
    systems: dict[str, list[ItemResult]] = {}
    for r in results:
        systems.setdefault(r.details.get("system", "response"), []).append(r)
    out: dict[str, Any] = {}
    for system, records in sorted(systems.items()):
        row: dict[str, Any] = {
            "items": len(records),
            "statuses": {
                s: sum(r.status == s for r in records) for s in sorted({r.status for r in records})
            },
            "not_scored": not_scored(records),
            "s_fact": _column(records, lambda r: r.details.get("s_fact")),
        }
        for v in options.variants:
            row[NAMES[v]] = {
                "s_cov": _column(records, lambda r, v=v: _variant_value(r, v)),
                "icat": {
                    str(b): _column(records, lambda r, v=v, b=b: _variant_value(r, v, b))
                    for b in options.betas
                },
            }
        out[system] = row
    return out


def render_table3(tables: dict[str, Any], console: Console) -> None:
    beta = str(tables["betas"][0])
    names = [NAMES[v] for v in tables["variants"]]
    columns = ["system", "S_fact"] + [c for n in names for c in (f"{n} S_cov", f"{n}_{beta}")]
    out = Table(*columns, title="ICAT (macro-averaged over queries)")
    fmt = lambda e: "-" if e["mean"] is None else f"{e['mean']:.3f}"  # noqa: E731
    for system, row in tables["systems"].items():
        cells = [fmt(row["s_fact"])]
        for n in names:
            cells += [fmt(row[n]["s_cov"]), fmt(row[n]["icat"][beta])]
        out.add_row(system, *cells)
    console.print(out)


ICAT = Icat()
