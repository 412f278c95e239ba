"""ICAT's rules by hand (SPEC §2): scripted LLM outputs, a deterministic NLI stand-in (a table of
P(entailment) per (snippet, claim)) for the pure logic, and a real BM25 index for retrieval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from groundcover.pipelines.icat.data import load_queries
from groundcover.pipelines.icat.framework import Icat, IcatOptions, parse_aspects
from groundcover.pipelines.icat.scoring import (
    covered_by_qrels,
    first_entailing,
    icat_beta,
    macro_average,
    parse_alignment,
)
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig, UserError
from groundcover.pipelines.runtime.contract.protocol import RunRequest
from groundcover.pipelines.runtime.contract.roles import RoleSpec
from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
from groundcover.pipelines.shared.claims import parse_claims
from groundcover.serving.parsing import ParseError
from tests.conftest import SHARED
from tests.support.scripted import ScriptedClient, by_text, field_of
from tests.test_runtime import report_json, run

TOPICS = SHARED / "data" / "trec-web" / "topics.jsonl"


# ---- pure rules ------------------------------------------------------------------------------


def test_grounding_threshold_is_strict_and_the_first_entailing_snippet_wins():
    assert first_entailing([0.5, 0.2, 0.51, 0.9]) == 2  # 0.5 is not > 0.5; rank 2 before 3
    assert first_entailing([0.5, 0.5]) is None
    assert first_entailing([]) is None


def test_icat_beta_by_hand():
    assert icat_beta(0.5, 0.25) == pytest.approx(2 * 0.125 / 0.75)
    assert icat_beta(0.5, 0.25, 2) == pytest.approx(5 * 0.125 / (4 * 0.5 + 0.25))
    assert icat_beta(0.5, 0.25, 0.5) == pytest.approx(1.25 * 0.125 / (0.25 * 0.5 + 0.25))
    assert icat_beta(0.0, 0.0) == 0.0


def test_alignment_counts_each_aspect_once_and_only_with_valid_evidence():
    text = "\n".join(
        [
            '{"topic_id": 2, "evidence": [1]}',
            '{"topic_id": 2, "evidence": [2]}',  # again: the first line decided
            '{"topic_id": 3, "evidence": [5]}',  # claim 5 does not exist: not covered
            '{"topic_id": 4, "evidence": [1]}',  # no aspect 4
            '{"topic_id": 1, "evidence": []}',  # no evidence: not covered
        ]
    )
    found = parse_alignment(text, n_aspects=3, n_claims=2)
    assert found.covered == [2] and found.evidence == {2: [1]}
    assert len(found.ignored) == 4
    assert parse_alignment("", 3, 2).covered == []  # nothing covered is a valid answer
    with pytest.raises(ParseError):
        parse_alignment("Aspect one is covered by claim two.", 3, 2)


def test_qrels_coverage_uses_this_querys_qrels_only():
    qrels_q1 = {"d1": {"2", "7"}, "d2": set()}
    assert covered_by_qrels(["d1", None, "d2"], qrels_q1) == {"2", "7"}
    assert covered_by_qrels(["d9"], qrels_q1) == set()


def test_macro_average_counts_undefined():
    assert macro_average([0.5, None, 1.0]) == (0.75, 2, 1)
    assert macro_average([None]) == (None, 0, 1)


def test_claim_and_aspect_parsing():
    assert parse_claims("- A is B.\n2) C is D.\n- A is B.\n") == ["A is B.", "C is D."]
    assert parse_claims("None") == []
    with pytest.raises(ParseError):
        parse_claims("  ")
    text = '{"topic": "x"}\n{"topic": "x"}\n' + "".join(f'{{"topic": "t{i}"}}\n' for i in range(12))
    assert parse_aspects(text, 10) == ["x"] + [f"t{i}" for i in range(9)]


@pytest.mark.skipif(not TOPICS.is_file(), reason=f"shared data not found at {TOPICS}")
def test_trec_topics_load_with_their_subtopic_ids():
    queries = load_queries(TOPICS)
    assert len(queries) == 198
    assert [s.id for s in queries["2"].subtopics] == ["3", "4"]  # gaps kept
    assert queries["1"].query == "obama family tree"


# ---- end to end with scripted outputs ----------------------------------------------------------

C1, C2, C3 = (
    "The Eiffel Tower is in Paris.",
    "The Eiffel Tower is 330 metres tall.",
    "The tower is made of cheese.",
)
C4 = "Big Ben is in London."
SNIPPETS = [  # rank order per claim; P(entailment) is the stand-in's
    {
        "claim": C1,
        "snippets": [
            {"id": "s1", "doc_id": "d3", "text": "Paris has bakeries."},
            {"id": "s2", "doc_id": "d1", "text": "The tower stands in Paris."},
            {"id": "s3", "doc_id": "d2", "text": "Eiffel's tower, Paris."},
        ],
    },
    {"claim": C2, "snippets": [{"id": "s4", "doc_id": "d2", "text": "It is 330 m high."}]},
    {"claim": C4, "snippets": [{"id": "s5", "doc_id": "d4", "text": "Big Ben, London."}]},
]
P_ENTAIL = {
    ("Paris has bakeries.", C1): 0.3,
    ("The tower stands in Paris.", C1): 0.7,
    ("Eiffel's tower, Paris.", C1): 0.95,
    ("It is 330 m high.", C2): 0.5,
    ("Big Ben, London.", C4): 0.99,
}


class TableNli:
    """Deterministic NLI stand-in: P(entailment) from a table (0 elsewhere)."""

    def __init__(self, table):
        self.table, self.batches = table, []

    def probabilities(self, pairs):
        self.batches.append(len(pairs))
        p = np.array([self.table.get(pair, 0.0) for pair in pairs])
        return np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)


class StandInIcat(Icat):
    def __init__(self, table):
        self.stand_in = TableNli(table)

    def nli(self, options, ray_address=None):
        return self.stand_in


def write_inputs(tmp_path: Path) -> dict[str, Path]:
    files = {
        "queries": [
            {
                "query_id": "q1",
                "query": "eiffel tower",
                "subtopics": [
                    {"subtopic_id": 2, "description": "where the tower is"},
                    {"subtopic_id": 5, "description": "how tall the tower is"},
                    {"subtopic_id": 7, "description": "when it was built"},
                ],
            },
            {"query_id": "q2", "query": "big ben", "subtopics": ["where Big Ben is"]},
        ],
        "responses": [
            {"system": "A", "query_id": "q1", "response": "RESPONSE A1"},
            {"system": "A", "query_id": "q2", "response": "RESPONSE A2"},
            {"system": "B", "query_id": "q1", "response": "RESPONSE B1"},
        ],
        "qrels": [  # d1 is relevant to q1's subtopics 2 and 7, and to q2's subtopic 5 (unused)
            {"query_id": "q1", "doc_id": "d1", "relevance": 1, "subtopic_id": 2},
            {"query_id": "q1", "doc_id": "d1", "relevance": 1, "subtopic_id": 7},
            {"query_id": "q1", "doc_id": "d2", "relevance": 0, "subtopic_id": 5},
            {"query_id": "q2", "doc_id": "d1", "relevance": 1, "subtopic_id": 5},
            {"query_id": "q2", "doc_id": "d4", "relevance": 1, "subtopic_id": 1},
        ],
        "snippets": SNIPPETS,
    }
    paths = {}
    for name, rows in files.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


SCRIPTS = {
    "claims": lambda p: by_text(
        {
            "RESPONSE A1": f"- {C1}\n- {C2}\n- {C3}\n",
            "RESPONSE A2": f"- {C4}\n",
            "RESPONSE B1": "None",
        },
        p,
    ),
    "aspects": lambda p: by_text(
        {
            "eiffel tower": '{"topic": "where it is"}\n{"topic": "where it is"}\n'
            '{"topic": "its height"}\n',
            "big ben": '{"topic": "location"}\n',
        },
        field_of(p, "Query"),
    ),
    # q1: only C1 is grounded (claim 1); aspect 3 (= subtopic 7) cites it, aspect 1 cites a
    # claim 2 that is not among the grounded claims.
    "align_s": lambda p: by_text(
        {
            "eiffel tower": '{"topic_id": 3, "evidence": [1]}\n{"topic_id": 1, "evidence": [2]}\n',
            "big ben": '{"topic_id": 1, "evidence": [1]}\n',
        },
        field_of(p, "Query"),
    ),
    "align_a": '{"topic_id": 1, "evidence": [1]}\n',
}


def inputs_options(paths: dict[str, Path], **given) -> IcatOptions:
    """ICAT's options over ``write_inputs``' files, scored by the NLI stand-in."""
    files = {"input": paths["responses"]} | {k: paths[k] for k in ("queries", "qrels", "snippets")}
    return IcatOptions(**files, nli_model="stand-in", **given)


def test_icat_m_s_a_and_beta_sweep_by_hand(tmp_path):
    paths = write_inputs(tmp_path)
    options = inputs_options(paths, variants=["m", "s", "a"], betas=[1.0, 2.0])
    client = ScriptedClient(SCRIPTS)
    extractor = ScriptedClient(SCRIPTS, adapter="claims-lora")
    framework = StandInIcat(P_ENTAIL)
    evaluator = EvaluatorConfig(model="scripted", endpoint="http://127.0.0.1:9/v1")
    request = RunRequest(
        evaluator,
        RunConfig(run_dir=tmp_path / "run", cache=None),
        options,
        roles={"extract": RoleSpec(adapter="claims-lora")},
    )
    by_adapter = {None: client, "claims-lora": extractor}

    def open_client(ev, run_dir):
        return fixed_client(by_adapter[ev.adapter])

    outcome = execute(framework, request, quiet=True, open_client=open_client)[""]
    # Claims come from the extractor adapter (the extract role); every other stage from the
    # evaluator model (the judge role).
    assert {c.model for c in extractor.calls} == {"claims-lora"} and extractor.calls
    assert {c.stage for c in extractor.calls} == {"claims"}
    assert {c.model for c in client.calls} == {"scripted"} and not client.stage_calls("claims")
    records = {r.id: r for r in outcome.results}
    a1 = records["A:q1"]
    # C1: s1 0.3, s2 0.7 -> grounded by s2 (rank 1, doc d1), not the more probable s3.
    # C2: 0.5 is not > 0.5; C3: no snippet. S_fact = 1/3.
    assert [g["grounded"] for g in a1.details["grounding"]] == [True, False, False]
    assert a1.details["grounding"][0]["support"] == {
        "id": "s2",
        "doc_id": "d1",
        "text": "The tower stands in Paris.",
        "p_entailment": 0.7,
    }
    assert a1.details["s_fact"] == pytest.approx(1 / 3)
    m, s, a = (a1.details["variants"][v] for v in "msa")
    # ICAT-M: d1 -> q1's subtopics 2 and 7 (q2's qrels for d1 do not count): S_cov 2/3.
    assert m["covered"] == ["2", "7"] and m["s_cov"] == pytest.approx(2 / 3)
    assert m["icat"]["1.0"] == pytest.approx(2 * (1 / 3) * (2 / 3) / (1 / 3 + 2 / 3))
    assert m["icat"]["2.0"] == pytest.approx(5 * (1 / 3) * (2 / 3) / (4 / 3 + 2 / 3))
    # ICAT-S: aspect numbers map back to subtopic ids (3 -> "7"); the invalid line is ignored.
    assert s["covered"] == ["7"] and s["s_cov"] == pytest.approx(1 / 3)
    assert s["icat"]["1.0"] == pytest.approx(1 / 3)
    # ICAT-A: two distinct generated aspects, one covered.
    assert a["s_cov"] == 0.5 and a["icat"]["1.0"] == pytest.approx(0.4)
    assert a1.score == pytest.approx(m["icat"]["1.0"])  # the first variant at the first beta
    # The alignment sees the grounded claims only; the aspect prompt never sees the subtopics.
    [align] = [c for c in client.stage_calls("align_s") if "eiffel" in c.prompt]
    assert f"1. {C1}" in align.prompt and C2 not in align.prompt
    assert all("when it was built" not in c.prompt for c in client.stage_calls("aspects"))
    assert records["B:q1"].status == "undefined"  # no claims
    # One aspect generation per query, whatever the number of responses to it.
    assert len(client.stage_calls("aspects")) == 2

    written = json.loads((tmp_path / "run" / "icat.json").read_text())
    [rebuilt] = report_json(tmp_path / "run")  # `report` rebuilds the same table from disk
    assert rebuilt["tables"] == written
    table = written["systems"]
    # System A, macro over q1 and q2: S_fact (1/3 + 1)/2; ICAT-M_1 (4/9 + 1)/2.
    assert table["A"]["s_fact"]["mean"] == pytest.approx((1 / 3 + 1) / 2)
    assert table["A"]["ICAT-M"]["icat"]["1.0"]["mean"] == pytest.approx((4 / 9 + 1) / 2)
    assert table["A"]["ICAT-S"]["s_cov"]["mean"] == pytest.approx((1 / 3 + 1) / 2)
    assert table["B"]["s_fact"] == {"mean": None, "queries": 0, "undefined_queries": 1}
    # Every (snippet, claim) pair was scored once: 3 + 1 for A1, 1 for A2.
    assert sum(framework.stand_in.batches) == 5


async def test_nli_batcher_scores_concurrent_callers_together_and_each_pair_once():
    import asyncio

    from groundcover.pipelines.icat.grounding import NliBatcher

    model = TableNli({("p", "h1"): 0.9, ("p", "h2"): 0.2})
    batcher = NliBatcher(model, max_pairs=100)
    results = await asyncio.gather(
        batcher.entailment([("p", "h1"), ("p", "h2")]),
        batcher.entailment([("p", "h1")]),
        batcher.entailment([("q", "h3")]),
    )
    assert results == [[0.9, 0.2], [0.9], [0.0]]
    assert model.batches == [3]  # one batch, the repeated pair scored once
    small = NliBatcher(TableNli({}), max_pairs=2)
    await asyncio.gather(*(small.entailment([("a", str(i)), ("b", str(i))]) for i in range(3)))
    assert small.model.batches == [2, 2, 2]  # never more than max_pairs unless one caller has more


def test_bad_inputs_stop_with_one_line(tmp_path):
    paths = write_inputs(tmp_path)
    base = {"queries": paths["queries"], "snippets": paths["snippets"], "nli_model": "x"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query_id": "q9", "response": "r"}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: record 'q9': field query_id: unknown"):
        Icat().load(IcatOptions(input=bad, **base))
    queries = tmp_path / "queries2.jsonl"
    queries.write_text(json.dumps({"query_id": "q1", "query": "x", "subtopics": []}) + "\n")
    bad.write_text(json.dumps({"query_id": "q1", "response": "r"}) + "\n")
    with pytest.raises(UserError, match="query 'q1' has no subtopics"):
        Icat().load(IcatOptions(input=bad, **(base | {"queries": queries}), variants=["s"]))
    assert Icat().load(IcatOptions(input=bad, **(base | {"queries": queries}), variants=["a"]))
    with pytest.raises(ValueError, match="ICAT-M\\) needs qrels"):
        IcatOptions(input=bad, **base, variants=["m"])


# ---- grounding over a real BM25 index ----------------------------------------------------------

CORPUS = {
    "d1": "The Eiffel Tower stands in Paris on the Champ de Mars.",
    "d2": "The Eiffel Tower is 330 metres tall since its new antenna.",
    "d3": "Paris has many bakeries and the Seine river.",
}


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    from groundcover.index_build.build import IndexSpec, build_index

    root = tmp_path_factory.mktemp("icat-index")
    corpus = root / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in CORPUS.items())
    )
    build_index(corpus, root / "index", IndexSpec(dense_model=None, chunk_trailing=True))
    return root / "index"


def test_icat_m_grounds_claims_in_a_bm25_index(tmp_path, bm25_index):
    paths = write_inputs(tmp_path)
    responses = tmp_path / "one.jsonl"
    responses.write_text(json.dumps({"query_id": "q1", "response": "RESPONSE A1"}) + "\n")
    qrels = tmp_path / "qrels-index.jsonl"
    qrels.write_text(
        json.dumps({"query_id": "q1", "doc_id": "d2", "relevance": 1, "subtopic_id": 5}) + "\n"
    )
    options = IcatOptions(
        input=responses,
        queries=paths["queries"],
        qrels=qrels,
        index=bm25_index,
        retrieval="bm25",
        k=2,
        nli_model="stand-in",
        variants=["m"],
    )
    table = {(CORPUS["d2"], C2): 0.8, (CORPUS["d1"], C1): 0.6}
    outcome = run(StandInIcat(table), options, ScriptedClient(SCRIPTS), tmp_path / "run")[""]
    [record] = outcome.results
    grounding = record.details["grounding"]
    assert [len(g["snippets"]) for g in grounding] == [2, 2, 2]  # k = 2 from the index
    assert grounding[0]["support"]["doc_id"] == "d1"
    assert grounding[1]["support"]["doc_id"] == "d2"
    assert record.details["s_fact"] == pytest.approx(2 / 3)
    # d2 marks subtopic 5 for q1: S_cov 1/3.
    assert record.details["variants"]["m"]["covered"] == ["5"]

    qrels.write_text(
        json.dumps({"query_id": "q1", "doc_id": "d9", "relevance": 1, "subtopic_id": 5}) + "\n"
    )
    with pytest.raises(
        UserError,
        match=r"qrels-index.jsonl:1: record 'q1': field doc_id: 'd9' "
        r"is not in the index",
    ):
        StandInIcat(table).setup(_request(options), tmp_path)


def _request(options):
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest

    return RunRequest(EvaluatorConfig(), RunConfig(), options)


# ---- validation against human coverage ---------------------------------------------------------


def icat_record(system, qid, s_cov, icat):
    return {
        "id": f"{system}:{qid}",
        "details": {
            "system": system,
            "query_id": qid,
            "variants": {"s": {"s_cov": s_cov, "icat": {"1.0": icat}}},
        },
    }


def test_human_correlations_by_hand():
    from groundcover.pipelines.icat.human import human_table

    s_cov = [0.2, 0.4, 0.5, 0.9, None]
    icat = [0.1, 0.5, 0.3, 0.8, None]
    human_scores = [0.1, 0.5, 0.4, 1.0, 0.7]
    records = [
        icat_record("A", f"q{i}", c, v) for i, (c, v) in enumerate(zip(s_cov, icat, strict=True))
    ]
    human = {("A", f"q{i}"): h for i, h in enumerate(human_scores)} | {("B", "q0"): 0.3}
    table = human_table(records, human, [1.0], ["s"], resamples=500)
    entry = table["variants"]["ICAT-S"]["s_cov"]
    # q4 has no S_cov: 4 pairs. Pearson = numpy's. Ranks 1 2 3 4 vs 1 3 2 4: Spearman
    # 1 - 6 * 2 / (4 * 15) = 0.8; Kendall: 5 concordant, 1 discordant of 6 -> 4/6.
    assert entry["n"] == 4
    assert entry["pearson"]["r"] == pytest.approx(np.corrcoef(s_cov[:4], human_scores[:4])[0, 1])
    assert entry["spearman"]["r"] == pytest.approx(0.8)
    assert entry["kendall"]["r"] == pytest.approx(4 / 6)
    # ICAT: ranks (0.1, 0.5, 0.3, 0.8) vs (0.1, 0.5, 0.4, 1.0): also perfectly concordant.
    assert table["variants"]["ICAT-S"]["icat"]["kendall"]["r"] == pytest.approx(1.0)
    assert table["matched_responses"] == 5 and table["human_without_run_record"] == 1


def test_meta_eval_icat_cli(tmp_path):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli import app

    paths = write_inputs(tmp_path)
    options = IcatOptions(
        input=paths["responses"],
        queries=paths["queries"],
        variants=["s"],
        snippets=paths["snippets"],
        nli_model="stand-in",
    )
    run(StandInIcat(P_ENTAIL), options, ScriptedClient(SCRIPTS), tmp_path / "run")
    human = tmp_path / "human.jsonl"
    human.write_text(json.dumps({"system": "A", "query_id": "q1", "coverage": 0.5}) + "\n")
    result = CliRunner().invoke(
        app, ["meta-eval", "icat", str(tmp_path / "run"), "--human", str(human)]
    )
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "run" / "icat-human.json").read_text())
    assert written["variants"]["ICAT-S"]["s_cov"] == {
        "n": 1,
        "pearson": None,
        "spearman": None,
        "kendall": None,
    }
    human.write_text(json.dumps({"system": "A", "query_id": "q1", "coverage": 1.5}) + "\n")
    bad = CliRunner().invoke(
        app, ["meta-eval", "icat", str(tmp_path / "run"), "--human", str(human)]
    )
    assert bad.exit_code == 2 and "human.jsonl:1: record 'q1': field coverage" in bad.output


def test_reproduce_icat_script_is_the_cli_command():
    import subprocess
    import sys

    path = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_icat.py"
    done = subprocess.run(
        [sys.executable, str(path), "r.jsonl", "--nli-model", "m"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2  # no knowledge source given: one line, as the CLI says it
    assert "--index (corpus) and/or --snippets (web)" in done.stderr + done.stdout
