"""Runs under a judge that fails on purpose (``tests/support/faulty.py``): every transient fault
class of the wire, alone and all together at 20% and 50% of the requests, leaves CRUX's scores
exactly those of a clean run, with every retry counted where users look (the summary's usage
per stage and per role, each record's usage); the classes that must not be retried behave as
the README's fault table says; a run that ends with failed items exits 4, names them, and the
same command retries just those."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from groundcover.pipelines.runtime.store.run_dir import results_by_id
from tests.support.faulty import PERMANENT, TRANSIENT, FaultyServer, faulty_judge, usage_total

ROOT = Path(__file__).resolve().parents[1]
TEXTS = {"p0": "a b c d e", "p1": "one two three", "p2": "two words", "p3": "x", "p4": "w v u"}


def crux_inputs(root: Path, n_topics: int) -> dict[str, Path]:
    """``n_topics`` topics of four sub-questions; p4, which the run retrieves first, is unrated,
    so the judge rates it, then writes an answer from the context and rates that."""
    root.mkdir(parents=True, exist_ok=True)
    topics = [f"t{k:02d}" for k in range(n_topics)]
    rated = {"p0": [3, 3, 0, 0], "p1": [0, 3, 3, 0], "p2": [3, 0, 0, 3], "p3": [0, 0, 0, 0]}
    files = {
        "topics": [
            {"topic": t, "query": f"q {t}", "questions": [f"Q{j} of {t}?" for j in range(4)]}
            for t in topics
        ],
        "passages": [
            {"id": f"{t}-{p}", "topic": t, "text": f"{x} {t}"}
            for t in topics
            for p, x in TEXTS.items()
        ],
        "ratings": [
            {"topic": t, "passage_id": f"{t}-{p}", "question": q, "rating": r}
            for t in topics
            for p, row in rated.items()
            for q, r in enumerate(row)
        ],
    }
    paths = {}
    for name, rows in files.items():
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["run"] = root / "run.trec"
    paths["run"].write_text(
        "".join(
            f"{t} Q0 {t}-{p} {r} 9.0 sys\n" for t in topics for r, p in enumerate(["p4", "p2"], 1)
        )
    )
    return paths


def digit(prompt: str) -> int:
    return hashlib.sha256(prompt.encode()).digest()[0] % 6


def crux_server(**faults) -> FaultyServer:
    """Ratings and answers that are functions of the prompt alone."""
    from groundcover.pipelines.crux.framework import PROMPTS
    from tests.support.loopback import StageByPrompt
    from tests.support.scripted import ScriptedClient

    scripts = {
        "rate": lambda p: f"Rating: {digit(p)}",
        "answer": lambda p: f"An answer from the passages ({digit(p)}).",
    }
    stages = StageByPrompt(PROMPTS, {"rate": "rate", "answer": "answer"})
    return FaultyServer(ScriptedClient(scripts, check_constraints=False), stages, **faults)


def overrides(paths: dict[str, Path], url: str, run_dir: Path) -> dict:
    return {
        "crux.input": str(paths["run"]),
        "crux.topics": str(paths["topics"]),
        "crux.passages": str(paths["passages"]),
        "crux.ratings": str(paths["ratings"]),
        "crux.generate": True,
        "crux.answer_tokens": 64,
        "evaluator.endpoint": url,
        "evaluator.model": "scripted",
        "evaluator.max_retries": 8,
        "run.run_dir": str(run_dir),
    }


def run_crux(paths: dict[str, Path], server: FaultyServer, run_dir: Path):
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study
    from groundcover.pipelines.runtime.execution.execute import execute

    crux = study("crux")
    with faulty_judge(server) as url:
        request = request_from(crux, None, overrides(paths, url, run_dir))
        (outcome,) = execute(crux, request, no_cache=True, quiet=True).values()
    return outcome


def scored(outcome) -> list[tuple]:
    return [
        (r.id, r.status, r.score, json.dumps(r.details, sort_keys=True)) for r in outcome.results
    ]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The CRUX case without faults: 8 topics, and the 28 of the faults' figure."""
    root = tmp_path_factory.mktemp("clean")
    out = {}
    for n in (8, 28):
        paths = crux_inputs(root / f"in{n}", n)
        out[n] = (paths, run_crux(paths, crux_server(), root / f"run{n}"))
    return out


def check_against_clean(outcome, clean_outcome, server: FaultyServer) -> None:
    """The clean run's records and tables exactly, every injected fault counted as one retry."""
    assert scored(outcome) == scored(clean_outcome)
    assert outcome.tables == clean_outcome.tables
    summary = outcome.summary
    injected = sum(server.injected.values())
    assert usage_total(summary.usage_this_invocation, "retries") == injected
    assert usage_total(summary.usage_by_role_this_invocation, "retries") == injected
    assert sum(usage_total(r.usage, "retries") for r in outcome.results) == injected
    assert usage_total(summary.usage_this_invocation, "failures") == 0
    assert summary.failed is None and summary.statuses["ok"] == len(outcome.results)


@pytest.mark.parametrize("kind", TRANSIENT)
def test_each_transient_fault_class_is_retried_to_the_clean_scores(kind, clean, tmp_path):
    paths, clean_outcome = clean[8]
    server = crux_server(share=0.3, classes=(kind,), seed=1)
    outcome = run_crux(paths, server, tmp_path / "run")
    assert server.injected[kind] > 0
    check_against_clean(outcome, clean_outcome, server)


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_every_fault_class_together_gives_the_clean_coverage(share, clean, tmp_path):
    paths, clean_outcome = clean[28]
    server = crux_server(share=share, seed=2)
    outcome = run_crux(paths, server, tmp_path / "run")
    assert set(server.injected) == set(TRANSIENT)  # every class happened
    check_against_clean(outcome, clean_outcome, server)
    summary = outcome.summary
    assert usage_total(summary.usage_this_invocation, "backoff_seconds") > 0


def test_a_malformed_request_fails_its_item_and_the_run_goes_on(clean, tmp_path):
    """400 (the request itself is wrong): that item is recorded as ``error``, no retry, and
    every other item is scored as in the clean run."""
    paths, clean_outcome = clean[8]
    server = crux_server()
    server.permanent = {"t03": "400"}
    outcome = run_crux(paths, server, tmp_path / "run")
    by_id = {r.id: r for r in outcome.results}
    assert by_id["t03"].status == "error" and "prompt too long" in by_id["t03"].failure.error
    asked = [n for prompt, n in server.asked.items() if "t03" in prompt]
    assert asked and set(asked) == {1} and server.injected["400"] == len(asked)  # no retries
    rest = [row for row in scored(outcome) if row[0] != "t03"]
    assert rest == [row for row in scored(clean_outcome) if row[0] != "t03"]
    assert outcome.summary.failed == {"count": 1, "by_status": {"error": 1}, "ids": ["t03"]}
    from groundcover.pipelines.reports.pages.report_html import render

    page = render([outcome.dir])
    failed = page.index('class="failed">FAILED: 1 items (error 1): t03')
    assert failed < page.index('class="mean"')  # the first thing the run's section says


def test_a_request_failing_for_good_fails_its_item_and_names_it(clean, tmp_path):
    """503 on every request of one topic, past the retries: that topic is recorded ``error``
    with the server's last answer, the rest are scored; the run names it as failed."""
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study
    from groundcover.pipelines.runtime.execution.execute import execute

    paths, clean_outcome = clean[8]
    server = crux_server()
    server.permanent = {"t06": "503"}
    crux = study("crux")
    with faulty_judge(server) as url:
        settings = overrides(paths, url, tmp_path / "run") | {"evaluator.max_retries": 2}
        (outcome,) = execute(crux, request_from(crux, None, settings), quiet=True).values()
    by_id = {r.id: r for r in outcome.results}
    assert by_id["t06"].status == "error"
    assert "gave up after 3 attempts: 503 overloaded" in by_id["t06"].failure.error
    assert outcome.summary.failed["ids"] == ["t06"]
    rest = [row for row in scored(outcome) if row[0] != "t06"]
    assert rest == [row for row in scored(clean_outcome) if row[0] != "t06"]
    failures = usage_total(outcome.summary.usage_this_invocation, "failures")
    assert failures == usage_total(by_id["t06"].usage, "failures") > 0  # counted on its record


@pytest.mark.parametrize("kind", ["401", "404"])
def test_auth_and_unknown_model_stop_the_run_at_once(kind, clean, tmp_path):
    from groundcover.serving.client import EndpointError

    paths, _ = clean[8]
    server = crux_server()
    server.permanent = {"t0": kind}  # every topic's prompt
    with pytest.raises(EndpointError, match=PERMANENT[kind]):
        run_crux(paths, server, tmp_path / "run")
    assert set(server.asked.values()) == {1}  # what was in flight failed once: none retried


def cli(paths: dict[str, Path], url: str, run_dir: Path, *extra: str):
    args = [sys.executable, "-m", "groundcover", "eval", "crux", str(paths["run"])]
    args += ["--topics", str(paths["topics"]), "--passages", str(paths["passages"])]
    args += ["--ratings", str(paths["ratings"]), "--generate", "--answer-tokens", "64"]
    args += ["--endpoint", url, "--model", "scripted", "--run-dir", str(run_dir), "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [*args, "--no-cache", *extra], capture_output=True, text=True, timeout=300, env=env
    )


def test_failed_items_exit_4_with_their_names_and_the_rerun_retries_just_those(clean, tmp_path):
    paths, clean_outcome = clean[8]
    server = crux_server()
    server.permanent = {"t02": "400", "t05": "400"}
    run_dir = tmp_path / "run"
    with faulty_judge(server) as url:
        done = cli(paths, url, run_dir)
        assert done.returncode == 4, done.stderr[-2000:]
        line = " ".join(done.stderr.split())
        assert "2 of 8 items failed" in line and "t02, t05" in line
        assert "the same command retries just those" in line and "groundcover eval crux" in line
        assert "FAILED" in done.stdout  # the summary says it first
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["failed"]["ids"] == ["t02", "t05"]

        accepted = cli(paths, url, run_dir, "--allow-failures", "2")  # 2 accepted: exit 0
        assert accepted.returncode == 0, accepted.stderr[-2000:]
        assert cli(paths, url, run_dir, "--allow-failures", "20%").returncode == 4  # 1 of 8

        server.permanent = {}  # the cause fixed: the same command retries the two
        answered = server.answered
        again = cli(paths, url, run_dir)
        assert again.returncode == 0, again.stderr[-2000:]
    per_topic = usage_total(clean_outcome.summary.usage_this_invocation, "requests") / 8
    assert 0 < server.answered - answered <= 2 * per_topic  # the two topics, nothing else
    rows = [(r.id, r.status, r.score) for r in results_by_id(run_dir / "results.jsonl")]
    assert rows == [row[:3] for row in scored(clean_outcome)]


def test_an_estimate_after_a_pilot_under_faults_counts_the_retries_to_come(clean, tmp_path):
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study
    from groundcover.pipelines.runtime.execution.execute import execute

    paths, _ = clean[8]
    server = crux_server(share=0.3, classes=("503",), seed=3)
    crux = study("crux")
    with faulty_judge(server) as url:
        request = request_from(crux, None, overrides(paths, url, tmp_path / "run"))
        (outcome,) = execute(crux, request, no_cache=True, quiet=True, pilot=4).values()
    stages = {s["stage"]: s for s in outcome.summary.estimate_of_the_rest["stages"]}
    recorded = usage_total(outcome.summary.usage_this_invocation, "retries")
    assert recorded == sum(server.injected.values()) > 0
    point, low, high = stages["rate"]["retries"]
    assert 0 < low <= point <= high  # the other 4 topics: about as many as the first 4 needed
    assert stages["rate"]["backoff_seconds"][0] > 0
