"""Fact-graph logic on hand-built graphs."""

import json

import networkx as nx
import pytest

from groundcover.pipelines.comprehensiveness.graph import (
    Statement,
    build_graph,
    coverage,
    coverage_by_source,
    export_graph,
)


def S(id_, text, source):  # noqa: N802 - reads like a table row
    return Statement(id_, text, source)


def test_covered_uncovered_and_score():
    statements = [S("r1", "A", "response"), S("c1", "A'", "c1"), S("c2", "B", "c1")]
    result = coverage(build_graph(statements, [("r1", "c1")]))
    assert result.covered == ["c1"]
    assert result.uncovered == ["c2"]
    assert result.score == 0.5


def test_coverage_follows_paths_not_just_edges():
    statements = [S("r1", "x", "response"), S("a", "y", "c1"), S("b", "z", "c2")]
    result = coverage(build_graph(statements, [("r1", "a"), ("a", "b")]))
    assert result.covered == ["a", "b"] and result.uncovered == []
    assert result.score == 1.0


def test_entailment_into_the_response_does_not_cover():
    statements = [S("r1", "x", "response"), S("a", "y", "c1")]
    result = coverage(build_graph(statements, [("a", "r1")]))  # context entails response only
    assert result.covered == [] and result.uncovered == ["a"]
    assert result.score == 0.0


def test_cycle_is_condensed_to_one_context_node():
    # a <-> b <-> c are equivalent: one statement, counted once.
    statements = [S("a", "p", "c1"), S("b", "p", "c2"), S("c", "q", "c2"), S("d", "w", "c1")]
    edges = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "a")]
    result = coverage(build_graph(statements, edges))
    assert len(result.uncovered) == 2  # {a,b,c} and d
    rep = result.uncovered[0]
    assert rep == "a"  # mode of texts: "p" twice beats "q"; first such member
    assert sorted(result.components[rep]) == ["a", "b", "c"]
    assert result.membership["c"] == "a"


def test_context_atoms_take_precedence_in_mixed_components():
    # A response atom equivalent to a context atom: the component is a (covered) context node.
    statements = [S("r1", "t", "response"), S("r2", "t", "response"), S("c1", "u", "c1")]
    result = coverage(build_graph(statements, [("r1", "c1"), ("c1", "r1")]))
    assert result.covered == ["c1"]
    assert result.membership["r1"] == "c1"
    assert result.score == 1.0


def test_response_only_components_are_not_counted():
    result = coverage(build_graph([S("r1", "x", "response"), S("r2", "y", "response")], []))
    assert result.covered == [] and result.uncovered == []
    assert result.score is None  # undefined, never 0 or 1


def test_basis_is_the_minimal_uncovered_set():
    # b entails a and c; d stands alone; e is covered. To cover everything, add b and d only.
    statements = [S("r", "r", "response")] + [S(x, x, "c1") for x in "abcde"]
    edges = [("b", "a"), ("b", "c"), ("r", "e")]
    result = coverage(build_graph(statements, edges))
    assert result.uncovered == ["a", "b", "c", "d"]
    assert result.basis == ["b", "d"]
    assert result.covered == ["e"]


def test_basis_of_an_uncovered_cycle_is_one_node():
    statements = [S("a", "x", "c1"), S("b", "y", "c2"), S("c", "z", "c1")]
    edges = [("a", "b"), ("b", "a"), ("a", "c")]
    result = coverage(build_graph(statements, edges))
    assert result.basis == ["a"]
    assert set(result.uncovered) == {"a", "c"}


def test_empty_graph():
    result = coverage(build_graph([], []))
    assert (result.covered, result.uncovered, result.basis, result.score) == ([], [], [], None)


def test_unknown_edge_endpoint_is_refused():
    with pytest.raises(KeyError):
        build_graph([S("a", "x", "c1")], [("a", "zz")])


def test_export_node_link_and_graphml(tmp_path):
    statements = [S("r1", "A", "response"), S("c1", "A", "c1"), S("c2", "B", "c1")]
    graph = build_graph(statements, [("r1", "c1")])
    paths = export_graph(graph, coverage(graph), tmp_path / "item-1")
    data = json.loads((tmp_path / "item-1.json").read_text())
    nodes = {n["id"]: n for n in data["nodes"]}
    assert nodes["c1"]["status"] == "covered" and nodes["c2"]["status"] == "uncovered"
    assert nodes["c2"]["basis"] is True
    reread = nx.read_graphml(paths["graphml"])
    assert set(reread.edges) == {("r1", "c1")}
    assert reread.nodes["c2"]["status"] == "uncovered"


def test_graphml_holds_model_text_with_characters_xml_forbids(tmp_path):
    """A model's text may carry C0 controls: the GraphML export replaces them (with lxml present
    networkx refuses them outright) and the JSON export keeps them."""
    raw = "A\x00tower\x07 of\x1b 330 m\ttall\n"
    statements = [S("r1", raw, "response"), S("c1", "A", "c1")]
    graph = build_graph(statements, [("r1", "c1")])
    paths = export_graph(graph, coverage(graph), tmp_path / "item-2")
    reread = nx.read_graphml(paths["graphml"])
    text_key = next(k for k, v in graph.nodes["r1"].items() if v == raw)
    assert reread.nodes["r1"][text_key] == "A\ufffdtower\ufffd of\ufffd 330 m\ttall\n"
    data = json.loads((tmp_path / "item-2.json").read_text())
    assert {n["id"]: n for n in data["nodes"]}["r1"][text_key] == raw


def test_coverage_by_source_counts_nodes_not_components():
    statements = [
        S("r1", "r", "response"),
        S("c1.a1", "x", "c1"),
        S("c1.a2", "y", "c1"),
        S("c2.a1", "x'", "c2"),
        S("c3.a1", "z", "c3"),
    ]
    # r1 covers c1.a1, which is equivalent to c2.a1 (one component); c1.a2 and c3.a1 are not.
    edges = [("r1", "c1.a1"), ("c1.a1", "c2.a1"), ("c2.a1", "c1.a1")]
    result = coverage(build_graph(statements, edges))
    assert len(result.covered) == 1  # one covered component ...
    assert coverage_by_source(statements, result) == {  # ... but a covered node in c1 and c2
        "c1": {"nodes": 2, "covered": 1},
        "c2": {"nodes": 1, "covered": 1},
        "c3": {"nodes": 1, "covered": 0},
    }
