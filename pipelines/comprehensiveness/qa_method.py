"""Q&A-based comprehensiveness: questions, refinement, answers per source, comparison (SPEC §1)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
from typing import Any

from groundcover import ItemContext
from groundcover.judges import SwapPair

from ...serving.client import marker_label_scores
from .common import (
    LABELS,
    LOGPROBS,
    PROMPTS,
    Item,
    formats,
    source_ids,
    weighted_scores,
)
from .graph import RESPONSE, Statement
from .parsers import (
    RELATIONS,
    AnswerSheet,
    parse_answers,
    parse_relation,
    parse_scored_items,
    parse_statements,
)
from .rules import Rules
from .units import (
    deterministic_relation,
    relation_of,
    units_tool,
)

# Relation -> entailment edges between (first, second) answers.
EDGES = {
    "equivalent": [(0, 1), (1, 0)],
    "first implies second": [(0, 1)],
    "second implies first": [(1, 0)],
    "contradictory": [],
    "neutral": [],
}


async def mine(ctx: ItemContext, query: str, text: str) -> list[str]:
    if not text.strip():
        return []
    parsed = await ctx.ask(
        PROMPTS["mine_questions"],
        "mine",
        parse_statements,
        "one '* <question>' per line",
        {"query": query, "text": text},
        regex=formats(ctx.options).questions,
        max_tokens=ctx.options.list_max_tokens,
    )
    return parsed.value


async def refine(ctx: ItemContext, query: str, raw: list[str]) -> tuple[list[str], list[dict]]:
    if not raw:
        return [], []
    parsed = await ctx.ask(
        PROMPTS["refine_questions"],
        "refine",
        lambda t: parse_scored_items(t, "Relevance"),
        "lines '* <question> [Relevance: <1-5>]'",
        {"query": query, "questions": raw},
        regex=formats(ctx.options).refined,
        max_tokens=ctx.options.list_max_tokens,
        **LOGPROBS,
    )
    items = parsed.value
    # paper: every integer among the top alternatives weighs in, as in the reference
    ints = [n for _, n in items]
    any_integer = ctx.options.rules.relevance_any_integer
    scores, weighted = weighted_scores(parsed, "Relevance", ints, any_integer=any_integer)
    scored = [
        {"question": q, "relevance": round(s, 4), "weighted": weighted}
        for (q, _), s in zip(items, scores, strict=True)
    ]
    unique: dict[str, None] = {}
    for entry in scored:
        if entry["relevance"] >= ctx.options.t_rel:
            unique.setdefault(entry["question"], None)
    return list(unique), scored


async def answer(ctx: ItemContext, questions: list[str], text: str) -> dict[int, list[dict]]:
    """Known answers per question index from one source, with (weighted) confidences."""
    if not text.strip():
        return {}
    parsed = await ctx.ask(
        PROMPTS["answer_questions"],
        "answer",
        lambda t: parse_answers(
            t, questions, require_all=not ctx.options.rules.qa_answer_sheet_skips_missing
        ),
        "for each question its line, then 'A: <answer> [Confidence: <1-5>]' joined by ' | '",
        {"text": text, "questions": questions},
        regex=formats(ctx.options).answers(questions),
        max_tokens=ctx.options.list_max_tokens,
        **LOGPROBS,
    )
    sheet: AnswerSheet = parsed.value
    tokens = parsed.result.token_logprobs if parsed.result else []
    markers = marker_label_scores(tokens, "Confidence", LABELS)
    weighted = len(markers) == sheet.markers and all(m.status == "ok" for m in markers)
    out: dict[int, list[dict]] = {}
    for qi, group in sorted(sheet.by_question.items()):
        for a in group:
            if a.unknown:
                continue
            marked = markers[a.position].score if weighted else None
            conf = float(a.confidence) if marked is None else marked
            out.setdefault(qi, []).append(
                {"text": a.text, "confidence": round(conf, 4), "weighted": weighted}
            )
    return out


async def compare(ctx: ItemContext, question: str, first: str, second: str) -> dict[str, Any]:
    """Relation of two answers to one question: deterministic for identical texts (paper: equal
    after lower-casing and trimming; spec: also ignoring punctuation) and, in the spec protocol
    without tools, for comparable quantities; otherwise the model, with the units tool if on.
    paper: a units-tool result decides the label, and the model's label is the most probable
    of the five at the label's first token."""
    rules: Rules = ctx.options.rules
    same = (
        first.strip().lower() == second.strip().lower()
        if rules.qa_identical_case_only
        else _norm(first) == _norm(second)
    )
    if same:
        return {"relation": "equivalent", "method": "identical"}
    if not ctx.options.tools and rules.qa_units_without_call:
        relation = deterministic_relation(first, second)
        if relation:
            return {"relation": relation, "method": "units"}
    template = PROMPTS["compare_answers"]
    values = {"question": question, "first": first, "second": second, "tools": ctx.options.tools}
    if ctx.options.tools:
        run = await ctx.run_tools(
            template.messages(**values),
            [units_tool(relative=rules.units_tool_decides)],
            max_rounds=2,
            stage="compare",
            template=template.id,
        )
        decided = _tool_decision(run.calls) if rules.units_tool_decides else None
        if decided:
            return {"relation": decided, "method": "tool", "tool_calls": run.calls}
        try:
            return {
                "relation": parse_relation(run.final.text),
                "method": "llm+tool",
                "tool_calls": run.calls,
            }
        except ValueError:
            pass  # fall through to the plain re-asking path
    parsed = await ctx.ask(
        template,
        "compare",
        parse_relation,
        "a last line '<answer 1> - <answer 2> [<relation>]'",
        values,
        regex=formats(ctx.options).relation,
        max_tokens=ctx.options.list_max_tokens,
        **(LOGPROBS if rules.qa_label_by_probability else {}),
    )
    if not rules.qa_label_by_probability:
        return {"relation": parsed.value, "method": "llm"}
    tokens = parsed.result.token_logprobs if parsed.result else []
    relation, probabilities = relation_by_probability(tokens, parsed.value)
    out = {"relation": relation, "method": "llm", "probabilities": probabilities}
    return out | ({"generated": parsed.value} if relation != parsed.value else {})


def relation_by_probability(
    tokens: list[dict[str, Any]], generated: str
) -> tuple[str, dict[str, float]]:
    """The most probable of the five relations at the first token of the final '[<relation>]':
    each top alternative there counts for the one relation it begins (a token that begins
    several, or none, counts for none). Without alternatives, the generated relation stands."""
    text = "".join(t.get("token", "") for t in tokens)
    start = text.rfind("[") + 1
    if not start:
        return generated, {}
    offset = 0
    for position in tokens:
        token = position.get("token", "")
        if offset + len(token) > start:
            break
        offset += len(token)
    else:
        return generated, {}
    cut = start - offset  # the label begins this far into the token (e.g. the token "[equ")
    prefix = token[:cut]
    probabilities: dict[str, float] = {}
    for alt in position.get("top_logprobs") or []:
        alt_token = alt.get("token", "")
        if alt.get("logprob") is None or not alt_token.startswith(prefix):
            continue
        head = alt_token[cut:].lstrip().lower()
        matches = [r for r in RELATIONS if head and r.startswith(head)]
        if len(matches) == 1:
            probabilities[matches[0]] = probabilities.get(matches[0], 0.0) + math.exp(
                alt["logprob"]
            )
    if not probabilities:
        return generated, {}
    best = max(probabilities, key=lambda r: (probabilities[r], r == generated))
    return best, {r: round(p, 6) for r, p in probabilities.items()}


def _tool_decision(calls: list[dict[str, Any]]) -> str | None:
    """The relation the last readable units-tool result gives, if any."""
    for call in reversed(calls):
        try:
            outcome = json.loads(call["result"])
        except (TypeError, ValueError):
            continue
        if isinstance(outcome, dict) and (relation := relation_of(outcome)):
            return relation
    return None


async def evaluate(ctx: ItemContext, item: Item, contexts: list[str]) -> dict[str, Any]:
    ids = source_ids(contexts)
    sources = [(RESPONSE, item.response), *zip(ids, contexts, strict=True)]
    mined = await asyncio.gather(*(mine(ctx, item.query, text) for _, text in sources))
    raw = list(dict.fromkeys(q for qs in mined for q in qs))
    questions, refined = await refine(ctx, item.query, raw)
    answered = await asyncio.gather(*(answer(ctx, questions, text) for _, text in sources))

    statements: list[Statement] = []
    per_question: dict[int, list[Statement]] = {}
    answer_records = []
    for (src, _), by_question in zip(sources, answered, strict=True):
        for qi, answers in sorted(by_question.items()):
            for k, a in enumerate(answers, 1):
                kept = a["confidence"] >= ctx.options.t_conf
                sid = f"q{qi + 1}.{'r' if src == RESPONSE else src}.{k}"
                answer_records.append(
                    {"id": sid, "question": qi + 1, "source": src, **a, "kept": kept}
                )
                if kept:
                    statement = Statement(sid, a["text"], src)
                    statements.append(statement)
                    per_question.setdefault(qi, []).append(statement)

    comparisons = []
    jobs = []
    for qi, group in sorted(per_question.items()):
        for first, second in itertools.combinations(group, 2):
            if (
                first.source == second.source == RESPONSE
                and not ctx.options.rules.qa_response_pairs
            ):
                continue  # spec: response-response relations are not compared
            jobs.append((qi, first, second))
    outcomes = await asyncio.gather(
        *(compare(ctx, questions[qi], s.text, t.text) for qi, s, t in jobs)
    )
    entailments = []
    for (qi, first, second), outcome in zip(jobs, outcomes, strict=True):
        comparisons.append({"question": qi + 1, "first": first.id, "second": second.id, **outcome})
        pair = (first.id, second.id)
        entailments += [(pair[i], pair[j]) for i, j in EDGES[outcome["relation"]]]
    return {
        "statements": statements,
        "entailments": entailments,
        "details": {
            "mined_questions": {src: qs for (src, _), qs in zip(sources, mined, strict=True)},
            "refined_questions": refined,
            "questions": questions,
            "answers": answer_records,
            "comparisons": comparisons,
        },
    }


# A relation read with the two answers swapped, in the original order.
MIRRORED = {
    "first implies second": "second implies first",
    "second implies first": "first implies second",
}


def swap_pairs(details: dict[str, Any]) -> list[SwapPair]:
    """The recorded answer comparisons the model decided (not a rule: identical text, units,
    the units tool), each with its question and two answers."""
    questions = details.get("questions") or []
    texts = {a["id"]: a["text"] for a in details.get("answers") or []}
    pairs = []
    for c in details.get("comparisons") or []:
        if c.get("method") not in ("llm", "llm+tool"):
            continue
        question = questions[c["question"] - 1]
        both = {"question": question, "first": texts[c["first"]], "second": texts[c["second"]]}
        pairs.append(SwapPair("compare", f"{c['first']}|{c['second']}", c["relation"], both))
    return pairs


async def ask_swapped(ctx: ItemContext, pair: SwapPair) -> str:
    """The comparison asked with the second answer first, its relation read back in the
    original order."""
    texts = pair.texts
    outcome = await compare(ctx, texts["question"], texts["second"], texts["first"])
    return MIRRORED.get(outcome["relation"], outcome["relation"])


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()
