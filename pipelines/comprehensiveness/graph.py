"""Fact graphs and the coverage logic shared by the NLI- and Q&A-based metrics (SPEC §1).

Nodes are statements (atoms or answers) from the response or from a context text; an edge u -> v
means u entails v. Strongly connected components are logically equivalent statements: the graph
is condensed, each component represented by the most frequent text among its context members
(response members only when it has no context member). A context component is covered when some
response statement reaches it by a path.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from groundcover.serving.files import atomic_file, make_dirs, write_atomic

RESPONSE = "response"


@dataclass(frozen=True)
class Statement:
    id: str
    text: str
    source: str  # "response" or a context id such as "c1"

    @property
    def from_context(self) -> bool:
        return self.source != RESPONSE


@dataclass
class Coverage:
    covered: list[str]  # representative statement ids of covered context components
    uncovered: list[str]
    basis: list[str]  # minimal subset of `uncovered` that would complete the response
    components: dict[str, list[str]]  # representative id -> member ids
    membership: dict[str, str] = field(default_factory=dict)  # statement id -> representative

    @property
    def score(self) -> float | None:
        return comprehensiveness(len(self.covered), len(self.uncovered))


def source_counts(nodes: list[tuple[list[str], bool]]) -> dict[str, dict[str, int]]:
    """Per context source: its context nodes and how many are covered. ``nodes`` holds, per
    context node, the sources it comes from and whether it is covered (ConflictBank's S_X =
    covered / nodes of X counts nodes, not components)."""
    counts: dict[str, dict[str, int]] = {}
    for sources, covered in nodes:
        for source in sources:
            entry = counts.setdefault(source, {"nodes": 0, "covered": 0})
            entry["nodes"] += 1
            entry["covered"] += int(covered)
    return dict(sorted(counts.items()))


def coverage_by_source(statements: list[Statement], result: Coverage) -> dict[str, dict[str, int]]:
    """Per context source, its statements (nodes) and how many lie in a covered component."""
    covered = set(result.covered)
    return source_counts(
        [([s.source], result.membership[s.id] in covered) for s in statements if s.from_context]
    )


def comprehensiveness(n_in: int, n_out: int) -> float | None:
    """S = |A_in| / (|A_in| + |A_out|), the score of every method; None when both are empty
    (undefined, never 0 or 1)."""
    total = n_in + n_out
    return n_in / total if total else None


@dataclass(frozen=True)
class Judgement:
    """One judged direction of a pair: premise -> hypothesis, its label and that label's
    probability (exp of the mean log-probability of the label's tokens)."""

    premise: str
    hypothesis: str
    label: str
    probability: float


def edges_from_judgements(
    pairs: list[tuple[Judgement, Judgement]],
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """The paper protocol's rule (the authors' code): one relation per unordered pair.

    Each pair comes as (preferred, other): both directions judged, ``preferred`` being the one a
    tie goes to (response -> context; for contexts c_i, c_j with i < j, c_j -> c_i). Both saying
    entailment is an equivalence (edges both ways). Otherwise the more probable direction is kept
    whatever its label, so a confident neutral overrules a less confident entailment; only a kept
    entailment becomes an edge. Returns the edges and, per pair, what was kept and why.
    """
    edges: list[tuple[str, str]] = []
    kept: list[dict[str, Any]] = []
    for preferred, other in pairs:
        if preferred.label == other.label == "entailment":
            edges += [(preferred.premise, preferred.hypothesis), (other.premise, other.hypothesis)]
            kept.append(
                {"pair": [preferred.premise, preferred.hypothesis], "relation": "equivalence"}
            )
            continue
        winner = other if other.probability > preferred.probability else preferred
        if winner.label == "entailment":
            edges.append((winner.premise, winner.hypothesis))
        kept.append(
            {
                "pair": [preferred.premise, preferred.hypothesis],
                "kept": [winner.premise, winner.hypothesis],
                "relation": winner.label,
                "probability": winner.probability,
            }
        )
    return edges, kept


def build_graph(statements: list[Statement], entailments: list[tuple[str, str]]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for statement in statements:
        graph.add_node(statement.id, text=statement.text, source=statement.source)
    for premise, hypothesis in entailments:
        if premise not in graph or hypothesis not in graph:
            raise KeyError(f"edge {premise}->{hypothesis} names an unknown statement")
        graph.add_edge(premise, hypothesis, relation="entailment")
    return graph


def _representative(graph: nx.DiGraph, members: list[str]) -> str:
    """Mode of the member texts, context members first; ties go to the earliest added node."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    members = sorted(members, key=order.__getitem__)
    context = [m for m in members if graph.nodes[m]["source"] != RESPONSE]
    pool = context or members
    counts = Counter(graph.nodes[m]["text"] for m in pool)
    best = max(counts.values())
    return next(m for m in pool if counts[graph.nodes[m]["text"]] == best)


def coverage(graph: nx.DiGraph) -> Coverage:
    condensed = nx.condensation(graph)
    components: dict[int, list[str]] = {
        c: list(condensed.nodes[c]["members"]) for c in condensed.nodes
    }
    representative = {c: _representative(graph, m) for c, m in components.items()}
    is_context = {c: graph.nodes[representative[c]]["source"] != RESPONSE for c in components}
    has_response = {
        c: any(graph.nodes[m]["source"] == RESPONSE for m in members)
        for c, members in components.items()
    }
    reached: set[int] = set()
    for c in components:
        if has_response[c]:
            reached |= {c} | nx.descendants(condensed, c)
    order = {node: i for i, node in enumerate(graph.nodes)}

    def ordered(cs: set[int]) -> list[str]:
        return sorted((representative[c] for c in cs), key=order.__getitem__)

    covered = {c for c in components if is_context[c] and c in reached}
    uncovered = {c for c in components if is_context[c] and c not in reached}
    basis = {c for c in uncovered if not (nx.ancestors(condensed, c) & uncovered)}
    return Coverage(
        covered=ordered(covered),
        uncovered=ordered(uncovered),
        basis=ordered(basis),
        components={
            representative[c]: sorted(m, key=order.__getitem__) for c, m in components.items()
        },
        membership={m: representative[c] for c, ms in components.items() for m in ms},
    )


def export_graph(
    graph: nx.DiGraph, result: Coverage, stem: Path, within: Path | None = None
) -> dict[str, str]:
    """Write node-link JSON and GraphML (with coverage attributes) next to each other
    (``within``: the run directory, where a linked folder or file is refused)."""
    annotated = graph.copy()
    covered, uncovered, basis = set(result.covered), set(result.uncovered), set(result.basis)
    for node in annotated.nodes:
        rep = result.membership[node]
        annotated.nodes[node]["component"] = rep
        annotated.nodes[node]["status"] = (
            "covered" if rep in covered else "uncovered" if rep in uncovered else "response"
        )
        annotated.nodes[node]["basis"] = rep in basis
    make_dirs(stem.parent, within=within)
    paths = {  # added to the name, never in place of a part of it (``q.1``, ``q.2``)
        "node_link": str(stem.with_name(f"{stem.name}.json")),
        "graphml": str(stem.with_name(f"{stem.name}.graphml")),
    }
    data: dict[str, Any] = nx.node_link_data(annotated, edges="edges")
    text = json.dumps(data, ensure_ascii=False, indent=1)
    write_atomic(Path(paths["node_link"]), text, within=within)
    with atomic_file(Path(paths["graphml"]), "wb", within=within) as handle:
        nx.write_graphml(xml_safe(annotated), handle)
    return paths


# Characters XML 1.0 cannot hold (C0 controls but tab, newline, return; the two non-characters;
# lone surrogates). A model's text may carry them; the JSON export keeps them as they are.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def xml_safe(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy whose string attributes GraphML can hold: each character XML 1.0 forbids becomes
    U+FFFD. (With lxml installed networkx refuses them; without it, it writes a file no XML
    reader can open.)"""
    safe = graph.copy()
    items = [*safe.nodes(data=True), *((None, d) for *_, d in safe.edges(data=True))]
    for _, attributes in items:
        for key, value in attributes.items():
            if isinstance(value, str):
                attributes[key] = _NOT_XML.sub("\ufffd", value)
    return safe
