"""NLI-based comprehensiveness: atoms, revision, relevance, pairwise NLI, fact graph (SPEC §1)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Protocol

from groundcover import ItemContext, StageFailed
from groundcover.nli import placement_of

from .common import (
    LOGPROBS,
    PROMPTS,
    Item,
    formats,
    source_ids,
    weighted_scores,
)
from .graph import (
    RESPONSE,
    Judgement,
    Statement,
    edges_from_judgements,
)
from .parsers import (
    FACTUAL_TYPES,
    NLI_LABELS,
    parse_rated,
    parse_statements,
    parse_units,
)

Pair = tuple[str, str]  # (premise text, hypothesis text)
CROSS_ENCODER_STAGE = "nli-cross-encoder"  # pairs a cross-encoder judged (role "nli", no LLM)


Labelled = tuple[str, float]  # (label, its probability)


class NliJudge(Protocol):
    """(label, probability) for (premise, hypothesis) pairs; label one of NLI_LABELS."""

    name: str

    async def judge(self, ctx: ItemContext, pairs: list[Pair]) -> list[Labelled]: ...


class LlmNli:
    """The paper's choice: the evaluator LLM labels each pair (constrained to the three labels);
    the probability is that of the label's tokens. An unreadable label is neutral with
    probability 1 in the paper protocol (as in the authors' code) and fails the item in spec."""

    name = "llm"

    async def judge(
        self, ctx: ItemContext, pairs: list[Pair], first: list[Labelled] | None = None
    ) -> list[Labelled]:
        """Each pair's label; ``first``: an NLI model's labels of the pairs, the first tier of
        the run's cascade (the judge is asked only for the pairs it does not keep)."""
        template = PROMPTS["nli"]

        async def one(pair: Pair, prior: Labelled | None) -> Labelled:
            values = {"premise": pair[0], "hypothesis": pair[1]}
            # max_tokens: room for a label under any tokenizer
            parsed = await ctx.choice(
                template,
                list(NLI_LABELS),
                "nli",
                values,
                first=prior,
                max_tokens=24,
                logprobs=True,
            )
            if parsed.ok:
                probability = (
                    parsed.probability  # a panel's: the share of its members that agree
                    if parsed.probability is not None
                    else parsed.result.sequence_probability
                    if parsed.result
                    else None
                )
                return parsed.value, 1.0 if probability is None else probability
            if not ctx.options.rules.nli_unreadable_is_neutral:
                raise StageFailed("nli", parsed)
            ctx.details["nli_unreadable"] = ctx.details.get("nli_unreadable", 0) + 1
            return "neutral", 1.0

        priors: list[Labelled | None] = list(first) if first else [None] * len(pairs)
        return list(await asyncio.gather(*map(one, pairs, priors)))


class CrossEncoderNli:
    """A DeBERTa-style NLI cross-encoder (``retrieval.nli``). The pairs of every item in flight
    are pooled and scored together (``NliBatcher``), where ``config``'s placement says: here, on
    a Ray Serve app, or on Ray actors of the run's own
    (``pipelines.runtime.execution.nli_placement``: the same labels)."""

    name = "cross-encoder"

    def __init__(self, config, address: str | None = None):
        from ...retrieval.nli import NliBatcher

        model, device, batch_size = config.cross_encoder()
        self.scorer = config.open_nli(model, device, batch_size, address)
        self.batcher = NliBatcher(self.scorer)  # pools as big as the scorer asks for

    def placement(self) -> dict | None:
        return placement_of(self.scorer)

    def close(self) -> None:
        self.batcher.close()
        if hasattr(self.scorer, "close"):
            self.scorer.close()

    async def judge(self, ctx: ItemContext, pairs: list[Pair]) -> list[Labelled]:
        from ...retrieval.nli import CANONICAL

        probs = await self.batcher.rows(pairs)
        ctx.account(CROSS_ENCODER_STAGE, len(pairs))
        labelled = [(CANONICAL[row.argmax()], float(row.max())) for row in probs]
        if ctx.nli_first("nli"):  # tier 1 of the run's cascade: the judge decides the rest
            return await LlmNli().judge(ctx, pairs, first=labelled)
        for (premise, hypothesis), (label, probability) in zip(pairs, labelled, strict=True):
            values = {"premise": premise, "hypothesis": hypothesis}  # as the judge is asked
            ctx.model_label("nli", values, label, probability)
        return labelled


def make_judge(config, ray_address: str | None = None) -> NliJudge:
    judge: NliJudge = LlmNli()
    if config.nli_backend == "cross-encoder":
        judge = CrossEncoderNli(config, ray_address)
    if config.prune_below is not None:
        from .pruning import PrunedJudge, Pruner

        judge = PrunedJudge(judge, Pruner(config.prune_below, config.prune_model))
    return judge


async def atoms_of(ctx: ItemContext, text: str) -> list[str]:
    """Extract content units, keep facts and claims, revise them into self-contained atoms."""
    if not text.strip():
        return []
    units = await ctx.ask(
        PROMPTS["extract_atoms"],
        "extract",
        parse_units,
        "bullet lines '- <unit>: <Type>'",
        {"text": text},
        regex=formats(ctx.options).units,
        max_tokens=ctx.options.list_max_tokens,
    )
    factual = [u.text for u in units.value if u.type in FACTUAL_TYPES]
    if not factual:
        return []
    revised = await ctx.ask(
        PROMPTS["revise_atoms"],
        "revise",
        parse_statements,
        "one '* <statement>' per line",
        {"text": text, "statements": factual},
        regex=formats(ctx.options).statements,
        max_tokens=ctx.options.list_max_tokens,
    )
    return revised.value


async def relevance(ctx: ItemContext, query: str, statement: str) -> float:
    """spec: one call per atom, the score read from the label token's probabilities."""
    scored = await ctx.label_score(
        PROMPTS["relevance"], "relevance", {"query": query, "statement": statement}
    )
    assert scored.score is not None  # label_score raised StageFailed otherwise
    return scored.score


async def source_relevance(ctx: ItemContext, query: str, atoms: list[str]) -> list[float]:
    """paper: one call per source text rates all its atoms; each score weighs every integer
    among the top alternatives of its score token (the reference's rule)."""
    if not atoms:
        return []
    parsed = await ctx.ask(
        PROMPTS["relevance_batch"],
        "relevance",
        lambda t: parse_rated(t, atoms),
        "one line '* <statement> [Relevance: <1-5>]' per statement, in the given order",
        {"query": query, "statements": atoms},
        regex=formats(ctx.options).rated(atoms),
        max_tokens=ctx.options.list_max_tokens,
        **LOGPROBS,
    )
    scores, weighted = weighted_scores(parsed, "Relevance", parsed.value, any_integer=True)
    if not weighted:
        ctx.details["relevance_unweighted"] = ctx.details.get("relevance_unweighted", 0) + 1
    return scores


def nli_pairs(response: list[Statement], context: list[Statement]) -> list[tuple[str, str]]:
    """Ordered (premise id, hypothesis id): C->R, R->C and C->C (i != j); never R->R."""
    pairs = [(c.id, r.id) for c in context for r in response]
    pairs += [(r.id, c.id) for r in response for c in context]
    pairs += [(a.id, b.id) for a, b in itertools.permutations(context, 2)]
    return pairs


def unordered_pairs(
    response: list[Statement], context: list[Statement], relations: list[dict[str, Any]]
) -> list[tuple[Judgement, Judgement]]:
    """Both judged directions of each unordered pair, the tie-winning direction first:
    response -> context, and c_j -> c_i for context atoms i < j in id order."""
    judged = {(r["premise"], r["hypothesis"]): Judgement(**r) for r in relations}
    out = [(judged[r.id, c.id], judged[c.id, r.id]) for c in context for r in response]
    out += [(judged[b.id, a.id], judged[a.id, b.id]) for a, b in itertools.combinations(context, 2)]
    return out


async def evaluate(ctx: ItemContext, item: Item, contexts: list[str]) -> dict[str, Any]:
    ids = source_ids(contexts)
    sources = [(RESPONSE, item.response), *zip(ids, contexts, strict=True)]
    atom_lists = await asyncio.gather(*(atoms_of(ctx, text) for _, text in sources))
    response_atoms = [Statement(f"r{i}", text, RESPONSE) for i, text in enumerate(atom_lists[0], 1)]
    candidates = [
        Statement(f"{src}.a{i}", text, src)
        for (src, _), atoms in zip(sources[1:], atom_lists[1:], strict=True)
        for i, text in enumerate(atoms, 1)
    ]
    if ctx.options.rules.relevance_per_source:
        per_source = await asyncio.gather(
            *(source_relevance(ctx, item.query, atoms) for atoms in atom_lists[1:])
        )
        scores = [score for group in per_source for score in group]
    else:
        scores = await asyncio.gather(*(relevance(ctx, item.query, s.text) for s in candidates))
    context_atoms = [s for s, r in zip(candidates, scores, strict=True) if r >= ctx.options.t_rel]

    by_id = {s.id: s for s in response_atoms + context_atoms}
    pairs = nli_pairs(response_atoms, context_atoms)
    # Identical texts entail each other without a call; repeated text pairs are judged once.
    unique = sorted(
        {(by_id[p].text, by_id[h].text) for p, h in pairs if by_id[p].text != by_id[h].text}
    )
    labels = dict(zip(unique, await ctx.resources.judge(ctx, unique), strict=True))
    relations: list[dict[str, Any]] = []
    for premise, hypothesis in pairs:
        texts = (by_id[premise].text, by_id[hypothesis].text)
        label, probability = ("entailment", 1.0) if texts[0] == texts[1] else labels[texts]
        relations.append(
            {
                "premise": premise,
                "hypothesis": hypothesis,
                "label": label,
                "probability": probability,
            }
        )
    if ctx.options.rules.nli_edges_one_per_pair:
        entailments, kept = edges_from_judgements(
            unordered_pairs(response_atoms, context_atoms, relations)
        )
    else:  # spec: every ordered entailment is an edge
        entailments = [
            (r["premise"], r["hypothesis"]) for r in relations if r["label"] == "entailment"
        ]
        kept = None
    return {
        "statements": response_atoms + context_atoms,
        "entailments": entailments,
        "details": {
            "atoms": {src: atoms for (src, _), atoms in zip(sources, atom_lists, strict=True)},
            "relevance": {s.id: round(r, 4) for s, r in zip(candidates, scores, strict=True)},
            "kept_context_atoms": [s.id for s in context_atoms],
            "relations": relations,
            **({"kept_relations": kept} if kept is not None else {}),
            "nli_backend": ctx.resources.name,
            "pairs": {
                "ordered": len(pairs),
                "judged": len(unique),
                "formula": 2 * len(response_atoms) * len(context_atoms)
                + len(context_atoms) * (len(context_atoms) - 1),
            },
        },
    }
