"""The rules ``--protocol`` chooses, in one frozen object built once per run.

``paper`` follows the authors' code that produced the paper's numbers (SPEC §1 "Reference
behaviour"); ``spec`` is a plain reading of the paper. Each field belongs to one row of the
protocol table in docs/comprehensiveness.md (the prefix names the row); code asks
``rules.<field>``, never the protocol's name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Literal

Protocol = Literal["paper", "spec"]
PAPER_SEED = 42  # the reference's bootstrap seed


@dataclass(frozen=True)
class Rules:
    protocol: Protocol
    # summarisation: condense each context to the query first (``--[no-]summarise`` overrides)
    summarisation: bool
    # NLI edges: one relation per unordered pair (the more probable direction), else every
    # ordered entailment is an edge
    nli_edges_one_per_pair: bool
    # unreadable NLI label: neutral with probability 1 (counted), else the item is unparseable
    nli_unreadable_is_neutral: bool
    # relevance (NLI): one call per source text rating all its atoms, else one call per atom
    relevance_per_source: bool
    # relevance (also the Q&A refiner): every integer among the score token's alternatives
    # weighs in, else labels 1-5 only, renormalised
    relevance_any_integer: bool
    # Q&A comparisons: response-response pairs are compared too
    qa_response_pairs: bool
    # Q&A comparisons: identical = equal after lower-casing and trimming (else punctuation
    # ignored too)
    qa_identical_case_only: bool
    # Q&A comparisons: pint decides comparable quantities without a call (without --tools)
    qa_units_without_call: bool
    # Q&A comparisons: the label is the most probable of the five at the label token (else the
    # generated label)
    qa_label_by_probability: bool
    # units tool (--tools): its result decides within 1% (1e-5 for dates), else the model reads
    # it, equal within both values' stated precision
    units_tool_decides: bool
    # Q&A answer sheet: a question missing from the output is skipped (else an error)
    qa_answer_sheet_skips_missing: bool
    # E2E: a repeated statement counts as listed (else once)
    e2e_repeats_listed: bool
    # WikiContradict LMR: C if S > 1-1e-5, PC if S > 1e-5 (else exact S = 1 / 0 < S < 1 / 0)
    wikicontradict_thresholds: bool
    # WikiContradict LMR, ConflictBank, ELI5 mean: ``undefined`` scores 0 (counted), else it
    # never matches / is left out (counted)
    undefined_scored_zero: bool
    # WikiContradict LMR, ConflictBank: the bootstrap's seed
    bootstrap_seed: int
    # ConflictBank: one run per claim over the four texts (else one run against all texts and
    # one per text alone)
    conflictbank_one_run_per_claim: bool
    # pruning (--prune-below): allowed (spec only; the reference judges every pair)
    pruning_allowed: bool
    # reproduce: each evaluator as the appendix ran it (gpt-oss at effort medium without the
    # units tool, Llama / Qwen with it), else the options as given
    appendix_evaluator_settings: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rules_for(protocol: Protocol, summarise: bool | None = None) -> Rules:
    """The rules of ``protocol``; the same object for the same arguments."""
    return _rules(protocol, summarise)


@cache
def _rules(protocol: Protocol, summarise: bool | None) -> Rules:
    paper = protocol == "paper"
    return Rules(
        protocol=protocol,
        summarisation=paper if summarise is None else summarise,
        nli_edges_one_per_pair=paper,
        nli_unreadable_is_neutral=paper,
        relevance_per_source=paper,
        relevance_any_integer=paper,
        qa_response_pairs=paper,
        qa_identical_case_only=paper,
        qa_units_without_call=not paper,
        qa_label_by_probability=paper,
        units_tool_decides=paper,
        qa_answer_sheet_skips_missing=paper,
        e2e_repeats_listed=paper,
        wikicontradict_thresholds=paper,
        undefined_scored_zero=paper,
        bootstrap_seed=PAPER_SEED if paper else 0,
        conflictbank_one_run_per_claim=paper,
        pruning_allowed=not paper,
        appendix_evaluator_settings=paper,
    )
