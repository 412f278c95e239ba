"""CRUX's rules by hand (SPEC §3): rating parser, greedy P** and graded qrels with ties, Cov with
unrated passages, Den, and α-nDCG against an independent computation that keeps the run's order."""

from __future__ import annotations

import math

import pytest

from groundcover.pipelines.crux.metrics import (
    alpha_ndcg,
    answerable,
    coverage,
    density,
    graded_qrels,
    oracle,
    parse_rating,
)

RATINGS = {  # passage -> rating per sub-question 0..3 (eta 3)
    "p0": [3, 0, 0, 0],
    "p1": [0, 4, 5, 0],
    "p2": [3, 3, 0, 0],
    "p3": [0, 0, 0, 0],
}
ORDER = ["p0", "p1", "p2", "p3"]


def test_rating_parser_takes_the_first_digit():
    assert parse_rating("10") == 1
    assert parse_rating("no") == -1
    assert parse_rating("Rating: 4/5") == 4
    assert parse_rating("") == -1


def test_answerable_oracle_and_graded_qrels_by_hand():
    questions = answerable(RATINGS, 4)
    assert questions == [0, 1, 2]  # nobody answers q3
    # Round 1: p1 and p2 both answer 2 (+0.1): the tie goes to p1 (lower index); q0 is left,
    # answered by p0 and p2 (1 + 0.1 each): p0.
    chosen = oracle(RATINGS, ORDER, questions)
    assert chosen == ["p1", "p0"]
    # P**'s maxima: q0 3, q1 4, q2 5. p2 reaches 3 on q0 (not strictly below) -> 2; p3 -> 1.
    assert graded_qrels(RATINGS, chosen, questions) == {"p0": 3, "p1": 3, "p2": 2, "p3": 1}


def test_coverage_counts_unrated_passages_as_zero_and_is_undefined_without_questions():
    questions = [0, 1, 2]
    assert coverage(["p2", "p3"], RATINGS, questions) == pytest.approx(2 / 3)
    assert coverage(["unrated"], RATINGS, questions) == 0.0
    assert coverage(["p0"], RATINGS, []) is None


def test_density_by_hand():
    # ((0.5 / 100) / (1.0 / 50)) ** 0.5 = 0.25 ** 0.5
    assert density(0.5, 100, 1.0, 50) == pytest.approx(0.5)
    assert density(None, 100, 1.0, 50) is None


def independent_alpha_ndcg(order, ratings, questions, depth, alpha=0.5, eta=3):
    """α-nDCG written out: gains (1-α)^seen per subtopic, log2 discounts, greedy ideal."""

    def gain(pid, seen):
        return sum((1 - alpha) ** seen[q] for q in questions if ratings[pid][q] >= eta)

    def dcg(ranking):
        seen, total = dict.fromkeys(questions, 0), 0.0
        for rank, pid in enumerate(ranking[:depth]):
            total += gain(pid, seen) / math.log2(rank + 2)
            for q in questions:
                seen[q] += ratings[pid][q] >= eta
        return total

    ideal, seen, pool = [], dict.fromkeys(questions, 0), list(ratings)
    while pool and len(ideal) < depth:
        best = max(pool, key=lambda p: gain(p, seen))
        ideal.append(best)
        pool.remove(best)
        for q in questions:
            seen[q] += ratings[best][q] >= eta
    return dcg(order) / dcg(ideal)


def test_alpha_ndcg_keeps_the_runs_order():
    order = ["p3", "p2", "p1"]  # by doc id the order would be p1, p2, p3
    value = alpha_ndcg({"t": order}, {"t": RATINGS}, {"t": [0, 1, 2]}, {"t": 3})["t"]
    # By hand: DCG = 0 + 2/log2(3) + 1.5/2; ideal (greedy) = 2 + 1.5/log2(3) + 0.5/2.
    by_hand = (2 / math.log2(3) + 0.75) / (2 + 1.5 / math.log2(3) + 0.25)
    assert value == pytest.approx(by_hand, abs=1e-4)
    assert value == pytest.approx(independent_alpha_ndcg(order, RATINGS, [0, 1, 2], 3), abs=1e-4)
    by_doc_id = independent_alpha_ndcg(sorted(order), RATINGS, [0, 1, 2], 3)
    assert abs(value - by_doc_id) > 0.2  # tied scores sorted by id would give another number


# ---- eval crux on a TREC run, scripted ratings for the pairs the file lacks --------------------

TEXTS = {
    "p0": "a b c d e",
    "p1": "one two three",
    "p2": "two words",
    "p3": "x",
    "p4": "four words text here",
}


def write_crux(tmp_path, ratings=RATINGS, run_lines=None):
    import json

    files = {
        "topics": [{"topic": "t1", "query": "q", "questions": ["Q0?", "Q1?", "Q2?", "Q3?"]}],
        "passages": [{"id": p, "topic": "t1", "text": t} for p, t in TEXTS.items()],
        "ratings": [
            {"topic": "t1", "passage_id": p, "question": q, "rating": r}
            for p, row in ratings.items()
            for q, r in enumerate(row)
        ],
    }
    paths = {}
    for name, rows in files.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["run"] = tmp_path / "run.trec"
    paths["run"].write_text(
        run_lines or "t1 Q0 p4 1 9.0 sys\nt1 Q0 p2 2 9.0 sys\nt1 Q0 p3 3 9.0 sys\n"
    )
    return paths


def crux_options(paths, **extra):
    """CRUX options over ``write_crux``'s files (the run file, topics, passages, ratings)."""
    from groundcover.pipelines.crux.framework import CruxOptions

    return CruxOptions(
        input=paths["run"],
        topics=paths["topics"],
        passages=paths["passages"],
        ratings=paths["ratings"],
        **extra,
    )


@pytest.mark.parametrize("rate", [True, False])
def test_eval_crux_by_hand(tmp_path, rate):
    from groundcover.pipelines.crux.framework import CRUX
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_runtime import run

    paths = write_crux(tmp_path)
    options = crux_options(paths, rate=rate)
    # p4 is unrated: the judge says 4 for Q2 and something without a digit otherwise (-> -1).
    client = ScriptedClient(
        {"rate": lambda p: "Rating: 4" if field_of(p, "Question") == "Q2?" else "no idea"},
        check_constraints=False,
    )
    [record] = run(CRUX, options, client, tmp_path / "run")[""].results
    d = record.details
    # P** = [p1, p0] (as above), so k = |P**| = 2: Z = [p4, p2] in the run's order.
    assert d["oracle"] == ["p1", "p0"] and d["context"] == ["p4", "p2"]
    assert d["unrated"] == 3  # p4 x answerable Q0..Q2
    if not rate:  # counted 0: Z covers Q0 and Q1 through p2
        assert record.score == pytest.approx(2 / 3) and client.calls == []
        return
    # the two answers without a digit are re-asked twice each, then counted 0 and as unreadable
    assert len(client.calls) == 1 + 2 * 3
    assert d["unreadable"] == 2 and "2 ratings unreadable" in record.explanation
    # rated: p4 answers Q2 -> all three answerable questions covered.
    assert record.score == 1.0
    # Den: words 4 + 2 = 6 vs P** 3 + 5 = 8, both covering everything: (8/6) ** 0.5.
    assert d["den"] == pytest.approx((8 / 6) ** 0.5)
    full = dict(RATINGS) | {"p4": [-1, -1, 4, -1]}
    expected = independent_alpha_ndcg(["p4", "p2"], full, [0, 1, 2], 2)
    assert d["alpha_ndcg"] == pytest.approx(expected, abs=1e-4)
    assert d["alpha_ndcg"] == pytest.approx(
        (1 + 2 / math.log2(3)) / (2 + 1.5 / math.log2(3)), abs=1e-4
    )


def test_crux_inputs_fail_in_one_line(tmp_path):
    from groundcover.pipelines.crux import data
    from groundcover.pipelines.runtime.contract.config import UserError

    paths = write_crux(tmp_path, run_lines="t1 Q0 p4 1 9.0 sys\nt9 Q0 p2 2 9.0 sys\n")
    topics = data.load_topics(paths["topics"])
    with pytest.raises(UserError, match=r"run.trec:2: field qid: unknown topic 't9'"):
        data.load_run(paths["run"], topics)
    paths["run"].write_text("t1 Q0 p4 first 9.0 sys\n")
    with pytest.raises(UserError, match="run.trec:1: field rank: not an integer"):
        data.load_run(paths["run"], topics)
    paths["ratings"].write_text('{"topic": "t1", "passage_id": "p0", "question": 0, "rating": 7}\n')
    with pytest.raises(UserError, match=r"ratings.jsonl:1: record 'p0': field rating"):
        data.load_ratings(paths["ratings"], topics)


# ---- crux build, scripted ----------------------------------------------------------------------

LONG = " ".join(f"w{i}" for i in range(1100))  # > 1,024 words: pieces of 512, 512, 76
BUILD_SCRIPTS = {
    "query": "What is known about alpha and the long story?",
    "subquestions": "- Q-a?\n- Q-b?\n",
    "passages": lambda p: {
        "alpha": "alpha one\n###\nalpha two",
        "w0": "long A",
        "w512": "long B",
        "w1024": "long C",
    }[field_of_text(p)],
    "rate": lambda p: {("Q-a?", "alpha one"): "4", ("Q-a?", "long B"): "Rating: 3"}.get(
        (field_of_q(p), field_of_t(p)), "1 - barely"
    ),
}


def field_of_text(prompt):
    from tests.support.scripted import field_of

    return field_of(prompt, "Text").split()[0]


def field_of_q(prompt):
    from tests.support.scripted import field_of

    return field_of(prompt, "Question")


def field_of_t(prompt):
    from tests.support.scripted import field_of

    return field_of(prompt, "Text")


def test_crux_build_by_hand_then_eval_on_its_files(tmp_path):
    import json

    from groundcover.pipelines.crux.build import BUILD_STUDY, BuildOptions
    from groundcover.pipelines.crux.framework import CRUX, CruxOptions
    from tests.support.scripted import ScriptedClient
    from tests.test_runtime import run

    source = tmp_path / "summaries.jsonl"
    source.write_text(
        json.dumps({"id": "r1", "summary": "S1", "documents": ["alpha doc text", LONG]}) + "\n"
    )
    options = BuildOptions(input=source, questions=2)
    client = ScriptedClient(BUILD_SCRIPTS)
    [record] = run(BUILD_STUDY, options, client, tmp_path / "data")["records"].results
    d = record.details
    assert list(d["passages"]) == ["r1:0#0", "r1:0#1", "r1:1#0", "r1:1#1", "r1:1#2"]
    assert len(client.stage_calls("rate")) == 5 * 2  # the full matrix
    # Q-b? is answered by nobody: dropped. Q-a?: "alpha one" (4) and "long B" (3) tie at
    # 1 + 0.1: the lower index wins.
    assert d["answerable"] == [0] and d["oracle"] == ["r1:0#0"]
    root = tmp_path / "data"
    topics = [json.loads(x) for x in (root / "topics.jsonl").read_text().splitlines()]
    assert topics == [{"topic": "r1", "query": BUILD_SCRIPTS["query"], "questions": ["Q-a?"]}]
    assert len((root / "ratings.jsonl").read_text().splitlines()) == 5
    # qrels at eta 3: P** = 3; everyone else is rated strictly below P**'s 4 -> 1.
    assert (root / "qrels-eta3.txt").read_text().splitlines() == [
        "r1 0 r1:0#0 3",
        "r1 0 r1:0#1 1",
        "r1 0 r1:1#0 1",
        "r1 0 r1:1#1 1",
        "r1 0 r1:1#2 1",
    ]
    # eta 4: only "alpha one" answers; eta 5: nobody -> no qrels for the topic.
    assert (root / "qrels-eta5.txt").read_text() == ""
    again = ScriptedClient(BUILD_SCRIPTS)
    run(BUILD_STUDY, options, again, tmp_path / "data")
    assert again.calls == []  # finished: nothing is rated twice

    runfile = tmp_path / "run.trec"
    runfile.write_text("r1 Q0 r1:1#1 1 2.0 bm25\nr1 Q0 r1:0#0 2 1.0 bm25\n")
    evaluated = CruxOptions(
        input=runfile,
        topics=root / "topics.jsonl",
        passages=root / "passages.jsonl",
        ratings=root / "ratings.jsonl",
    )
    judge = ScriptedClient({})
    [topic] = run(CRUX, evaluated, judge, tmp_path / "eval")[""].results
    assert topic.details["context"] == ["r1:1#1"] and topic.score == 1.0  # k = |P**| = 1
    assert judge.calls == []  # every pair was rated by the build


def test_eval_crux_rates_a_generated_answer_by_hand(tmp_path):
    from groundcover.pipelines.crux.framework import CRUX
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_runtime import run

    paths = write_crux(tmp_path)
    options = crux_options(paths, rate=False, generate=True, answer_tokens=64)
    client = ScriptedClient(
        {
            "answer": "ANSWER THREE WORDS",
            # the answer answers Q0 only (4); Q1, Q2 get 1
            "rate_answer": lambda p: "4" if field_of(p, "Question") == "Q0?" else "1",
        },
        check_constraints=False,
    )
    [record] = run(CRUX, options, client, tmp_path / "run")[""].results
    d = record.details
    [answer_call] = client.stage_calls("answer")
    assert "Passage 1: four words text here" in answer_call.prompt  # Z = [p4, p2] in order
    assert answer_call.body["max_tokens"] == 64
    assert d["answer_ratings"] == [4, 1, 1, -1]  # Q3 is not answerable: not rated
    assert d["cov_y"] == pytest.approx(1 / 3)
    # Den(y) = ((1/3) / 3 words) / (1.0 / 8 words of P**), to the power 0.5
    assert d["den_y"] == pytest.approx(((1 / 3 / 3) / (1 / 8)) ** 0.5)


def test_reproduce_crux_script_runs_every_system_and_k_without_a_model(tmp_path):
    """scripts/reproduce_crux.py is `groundcover reproduce crux`: a study of ordinary runs."""
    import json

    from tests.support.scripts import load_script
    from tests.test_runtime import report_json

    paths = write_crux(tmp_path)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name in ("topics", "passages", "ratings"):
        (data_dir / f"{name}.jsonl").write_text(paths[name].read_text())
    module = load_script("scripts/reproduce_crux.py")
    out = tmp_path / "table1"
    assert (
        module.main(
            ["--data", str(data_dir), "--ks", "pstar,2", "--paper", "duc", "--run-dir", str(out)]
        )
        == 0
    )
    systems = ("bm25", "dense", "hybrid", "bm25+mmr", "dense+mmr", "hybrid+mmr")
    for system in systems:
        for k in ("pstar", "2"):
            table = json.loads((out / f"{system}-k{k}" / "crux.json").read_text())
            assert table["topics"] == 1 and 0 <= table["cov"] <= 1
    manifest = json.loads((out / "dense+mmr-kpstar" / "manifest.json").read_text())
    assert manifest["options"]["mmr"] == 0.7 and manifest["options"]["mode"] == "dense"
    # The grid is a study: study.json holds the table, and `report` rebuilds it from the runs.
    combined = json.loads((out / "study.json").read_text())["combined"]
    assert [(r["system"], r["k"]) for r in combined["rows"]] == [
        (s, k) for s in systems for k in ("pstar", "2")
    ]
    assert combined["paper"] == "duc" and combined["kendall_tau"] is None  # no --generate
    assert set(combined["cov_by_eta"]["bm25"]) == {"1", "2", "3", "4", "5"}
    assert report_json(out)[-1]["combined"] == combined

    # Threshold analysis: eta 5 keeps only Q2 (p1 rated it 5), eta 4 also Q1 (4), eta 1 the
    # three rated above 0 (Q3 is rated 0 everywhere).
    def answerable_at(eta):
        line = (out / f"bm25-kpstar-eta{eta}" / "results.jsonl").read_text().splitlines()[0]
        return json.loads(line)["details"]["answerable"]

    assert answerable_at(5) == [2] and answerable_at(3) == [0, 1, 2]
    assert answerable_at(4) == [1, 2] and answerable_at(1) == [0, 1, 2]


def test_eval_crux_retrieves_in_place_from_an_index(tmp_path):
    import json

    from groundcover.index_build.build import IndexSpec, build_index
    from groundcover.pipelines.crux.framework import CRUX, CruxOptions
    from tests.support.scripted import ScriptedClient
    from tests.test_runtime import run

    paths = write_crux(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p, "contents": t}) + "\n" for p, t in TEXTS.items())
    )
    build_index(corpus, tmp_path / "index", IndexSpec(dense_model=None))
    options = CruxOptions(
        index=tmp_path / "index",
        mode="bm25",
        topics=paths["topics"],
        passages=paths["passages"],
        ratings=paths["ratings"],
        rate=False,
    )
    [record] = run(CRUX, options, ScriptedClient({}), tmp_path / "run")[""].results
    assert record.status == "ok" and set(record.details["context"]) <= set(TEXTS)
    with pytest.raises(ValueError, match="exactly one"):
        CruxOptions(topics=paths["topics"], passages=paths["passages"])
