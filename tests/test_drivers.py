"""``--drivers N``: one run spread over driver actors on a Ray cluster (execution.drivers).

The shard rule, the run store's union of driver files and the shared budget are checked here
directly; the two-node test (``-m multinode``) runs the real command against a loopback judge
that answers from the prompt alone, so one driver and two give the same records (with the
cross-encoder on one Serve app both drivers share), and kills a driver, the whole command, and
spends a cap shared by both drivers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.pipelines.runtime.budget.costs import Budget
from groundcover.pipelines.runtime.contract.errors import UserError
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
from groundcover.pipelines.runtime.execution.drivers import (
    SharedBudget,
    driver_resources,
    merged,
    shard_counts,
    shard_of,
)
from groundcover.pipelines.runtime.store.run_dir import (
    RunStore,
    result_files,
    results_by_id,
    shard_file,
)
from tests.support.records import whole_records

ROOT = Path(__file__).resolve().parents[1]


def record(item_id: str, status: str = "ok", score: float | None = 1.0) -> ItemResult:
    failure = None if status == "ok" else StageFailure(stage="judge", error="x")
    return ItemResult(
        id=item_id,
        status=status,  # type: ignore[arg-type]
        score=score,
        explanation="x",
        failure=failure,
    )


# ---- the shard rule and placement --------------------------------------------------------------


def test_shards_are_stable_and_cover_every_item():
    ids = [f"q{k}" for k in range(1000)]
    # the rule is the id's SHA-256, so another process (a driver, a resume) computes the same
    expected = [int.from_bytes(hashlib.sha256(i.encode()).digest()[:8], "big") % 3 for i in ids]
    assert [shard_of(i, 3) for i in ids] == expected
    counts = shard_counts(ids, 3)
    assert sum(counts) == 1000 and min(counts) > 280  # spread, not all in one shard
    assert shard_counts(ids, 1) == [1000]


def test_driver_resources_one_for_all_or_one_each():
    assert driver_resources(None, 2) == [{}, {}]
    assert driver_resources({"gpu_node": 1}, 2) == [{"gpu_node": 1}, {"gpu_node": 1}]
    assert driver_resources([{"a": 1}, {"b": 1}], 2) == [{"a": 1}, {"b": 1}]
    with pytest.raises(UserError, match="3 objects for --drivers 2"):
        driver_resources([{}, {}, {}], 2)


def test_a_driver_no_node_could_hold_is_refused_at_once_and_one_never_started_is_named():
    """Before any driver starts: each one's ask (a CPU unless it names its own) against every
    live node's resources as Ray lists them. A resource no node offers, or more than any node
    has, is one error line at once; a driver that could fit but was never started (what it asks
    held by Serve's replicas) is named after the bound, with the fix."""
    from groundcover.pipelines.runtime.execution import drivers

    nodes = [
        {"CPU": 2.0, "node:10.0.0.1": 1.0, "groundcover_driver": 1.0, "memory": 8e9},
        {"CPU": 2.0, "node:10.0.0.2": 1.0, "groundcover_driver": 1.0},
    ]
    held = {"CPU": 0, "groundcover_driver": 1}
    assert drivers.unplaceable([held, held], nodes) is None
    assert drivers.unplaceable([{}, {"node:10.0.0.2": 0.01}], nodes) is None
    assert drivers.unplaceable([{}, {"CPU": 4}], nodes) == (
        'driver 1 asks Ray for {"CPU": 4.0}, which no node of the cluster has (2 node(s)): fix '
        "--driver-resources"
    )
    assert drivers.unplaceable([{"node:10.0.0.9": 0.01}], nodes) == (
        'driver 0 asks Ray for {"CPU": 1.0, "node:10.0.0.9": 0.01}, which no node of the '
        "cluster has (2 node(s)): fix --driver-resources"
    )
    # the CPU on one node, the custom resource on another: no one node holds both
    split = [{"CPU": 2.0}, {"CPU": 0.0, "groundcover_driver": 1.0}]
    assert drivers.unplaceable([held | {"CPU": 1}], split) is not None
    assert drivers.unplaceable([], nodes) is None
    assert drivers.unplaceable([{"CPU": -1}], nodes) == (
        "driver 0: --driver-resources asks a negative amount of CPU"
    )
    assert drivers.unplaceable([{"GPU": 1}], nodes) is not None  # CPU-only nodes
    assert drivers.unplaceable([{"GPU": 1}], [{"CPU": 8.0, "GPU": 4.0}]) is None
    said = drivers.never_started(1, {})
    assert said.startswith(
        f"driver 1 was not started in {drivers.DRIVER_START_SECONDS:.0f} s: no node has "
        '{"CPU": 1.0} free'
    )
    assert said.endswith("""e.g. '{"CPU": 0}' for drivers that only wait on their endpoints""")


def test_driver_options_are_validated_where_they_are_read():
    from groundcover.pipelines.runtime.contract.config import RunConfig

    assert RunConfig(driver_resources='[{"a": 1}, {"b": 0.5}]').driver_resources == [  # type: ignore[arg-type]
        {"a": 1},
        {"b": 0.5},
    ]
    with pytest.raises(ValueError, match="not JSON"):
        RunConfig(driver_resources="{a: 1}")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RunConfig(drivers=0)


# ---- one run, several files ----------------------------------------------------------------


def test_readers_see_every_drivers_file_as_one_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    main, first, second = RunStore(run), RunStore(run, "d0"), RunStore(run, "d1")
    main.append(record("a", "error", None))  # an earlier one-driver invocation
    main.append(record("b"))
    main.close()
    for store in (first, second):
        store.attach()
    first.append(record("a", score=0.5))  # the error retried by driver 0 under another N
    second.append(record("c", score=0.0))
    second.append(record("d", "error", None))
    first.close()
    second.close()
    # driver 1 killed mid-append: a torn tail is no record, and only driver 1 cuts it
    with open(shard_file(run, "d1"), "ab") as handle:
        handle.write(b'{"id": "e", "sta')
    assert [p.name for p in result_files(run)] == [
        "results.jsonl",
        "results.d0.jsonl",
        "results.d1.jsonl",
    ]
    got = {r.id: (r.status, r.score) for r in results_by_id(run / "results.jsonl")}
    assert got == {"a": ("ok", 0.5), "b": ("ok", 1.0), "c": ("ok", 0.0), "d": ("error", None)}
    reader = RunStore.reading(run)
    assert reader.pending(["a", "b", "c", "d", "e"]) == {"d", "e"}
    assert [r.id for r in reader.results(["d", "c", "a"])] == ["d", "c", "a"]  # in that order
    other = RunStore(run)
    other.attach()  # the command's own store: leaves driver 1's file alone
    assert shard_file(run, "d1").read_bytes().endswith(b'"sta')
    again = RunStore(run, "d1")
    again.attach()  # driver 1 restarted: cuts its torn tail, then appends whole records
    again.append(record("e"))
    again.close()
    assert shard_file(run, "d1").read_bytes().count(b"\n") == 3
    assert RunStore.reading(run).pending(["a", "b", "c", "d", "e"]) == {"d"}


def test_a_final_record_wins_over_a_retried_one_in_any_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first, later = RunStore(run, "d0"), RunStore(run, "d1")
    first.attach()
    later.attach()
    first.append(record("a"))  # final, in the earlier file
    later.append(record("a", "cut_in_reasoning", None))  # a stale retry must not hide it
    later.append(record("b", "error", None))
    first.append(record("b", "error", None))
    first.close()
    later.close()
    got = {r.id: r.status for r in results_by_id(run / "results.jsonl")}
    assert got == {"a": "ok", "b": "error"}


# ---- one budget for every driver ---------------------------------------------------------------


def test_the_shared_budget_is_one_cap_and_a_restart_gives_back_its_items():
    state = Budget(100, None, lambda usage: 0.0).state()
    ledger = SharedBudget(state)
    assert ledger.admit(0.0, shard=0) is True  # nothing known yet: one item at a time
    assert ledger.admit(0.0, shard=1) is None
    ledger.record(30, 0.0, shard=0)  # peak 30: room for 2 more (30 + 2 x 30 <= 100)
    assert ledger.admit(0.0, shard=1) is True
    assert ledger.admit(0.0, shard=0) is True
    assert ledger.admit(0.0, shard=1) is None  # 30 + 3 x 30 > 100: wait for those in flight
    ledger.restarted(1)  # driver 1's process died with its item: it will never be recorded
    assert ledger.budget.in_flight == 1
    ledger.record(30, 0.0, shard=0)  # nothing in flight now: 60 + 30 <= 100
    assert ledger.admit(0.0, shard=1) is True
    assert ledger.admit(0.0, shard=0) is None  # 60 + 2 x 30 > 100: wait for driver 1's item
    ledger.record(30, 0.0, shard=1)
    assert ledger.admit(0.0, shard=0) is False  # 90 + 30 > 100 and nothing in flight: stop
    assert "--max-run-tokens 100" in (ledger.stopped() or "")
    assert ledger.budget.spent_tokens == 90 and ledger.in_flight == {0: 0, 1: 0}


def test_merged_driver_reports_sum_usage_and_name_each_driver():
    base = {"pid": 1, "ip": "10.0.0.1", "calls": 10, "seconds": 2.0, "spread": {}, "where": None}
    base |= {"todo": 2, "cpu_seconds": 0.5}
    one = base | {"shard": 0, "node": "n0", "items": 3, "usage": {"judge": {"calls": 4}}}
    two = base | {"shard": 1, "node": "n1", "items": 2, "usage": {"judge": {"calls": 6}}}
    one["limits"], two["limits"] = {"judge": {"final": 8}}, {"judge": {"final": 4}}
    run = merged([one, two], None)
    assert run.solved.usage == {"judge": {"calls": 10}}
    assert run.solved.limits == {"judge (driver 0)": {"final": 8}, "judge (driver 1)": {"final": 4}}
    assert [(r["driver"], r["node"], r["items"], r["calls_per_s"]) for r in run.drivers] == [
        (0, "n0", 3, 5.0),
        (1, "n1", 2, 5.0),
    ]


# ---- a run on two nodes (the real command, a real Ray head and worker) ------------------------

QUESTIONS = 24


def judge_letter(prompt: str) -> str:
    """The loopback judge's verdict: a function of the prompt alone, so which driver asks, and
    when, changes nothing."""
    return "ABCDEF"[hashlib.sha256(prompt.encode()).digest()[0] % 6]


def fanoutqa_inputs(tmp: Path) -> tuple[Path, Path]:
    questions = [
        {"id": f"q{k:02d}", "question": f"Which city is number {k}?", "answer": f"City {k}"}
        for k in range(QUESTIONS)
    ]
    answers = [{"id": q["id"], "answer": f"City {k % 5}"} for k, q in enumerate(questions)]
    (tmp / "dev.json").write_text(json.dumps(questions))
    (tmp / "answers.json").write_text(json.dumps(answers))
    return tmp / "dev.json", tmp / "answers.json"


def between(prompt: str, start: str, end: str) -> str:
    return prompt.rsplit(start, 1)[1].split(end, 1)[0]


def comprehensiveness_judge():
    """A judge for the NLI method that answers from each prompt alone: the units of a text are
    its sentences, revision keeps them, NLI labels are a hash of the pair; relevance as the
    fault cases script it (a label with probabilities)."""
    from tests.support.faults import COMPREHENSIVENESS_VALID
    from tests.support.scripted import ScriptedClient

    def units(p: str) -> str:
        sentences = [s.strip() for s in between(p, "TEXT:", "UNITS:").split(". ") if s.strip()]
        return "".join(f"- {s.rstrip('.')}: Fact\n" for s in sentences)

    def revised(p: str) -> str:
        listed = between(p, "Statements to be revised:", "Revised statements:")
        return "".join(f"{line.strip()}\n" for line in listed.splitlines() if line.strip())

    def nli(p: str) -> str:
        return ("entailment", "neutral", "contradiction")[
            hashlib.sha256(p.encode()).digest()[0] % 3
        ]

    scripts = dict(COMPREHENSIVENESS_VALID, extract=units, revise=revised, nli=nli)
    return ScriptedClient(scripts, check_constraints=False)


COMPREHENSIVENESS_STAGES = {
    "extract_atoms": "extract",
    "revise_atoms": "revise",
    "relevance": "relevance",
    "relevance_batch": "relevance",
    "nli": "nli",
    "summarise": "summarise",
}


def comprehensiveness_items(tmp: Path) -> Path:
    rows = [
        {
            "id": f"c{k:02d}",
            "query": "Who designed the tower?",
            "response": f"The tower opened in 18{80 + k}. It is {300 + k} metres tall.",
            "contexts": ["The tower was designed by Eiffel's firm.", f"Koechlin drew it in {k}."],
        }
        for k in range(12)
    ]
    path = tmp / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def records_of(run: Path) -> list[tuple]:
    """The run's records, as equal runs must have them (wall time in usage aside)."""
    out = []
    for r in results_by_id(run / "results.jsonl"):
        tokens = {s: (u["prompt_tokens"], u["completion_tokens"]) for s, u in r.usage.items()}
        details = json.dumps(r.details, sort_keys=True).replace(str(run), "RUN")  # graph files
        out.append((r.id, r.status, r.score, details, tokens))
    return out


def holders(run: Path) -> list[int]:
    """Processes with one of the run's driver files open (a driver still writing)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(link.startswith(str(run)) and ".d" in Path(link).name for link in links):
            found.append(int(pid))
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.multinode
def test_two_drivers_on_two_nodes_equal_one_and_survive_kills_and_share_a_cap(tmp_path):
    from groundcover.pipelines.fanoutqa.framework import PROMPTS
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.ray_head import ray_head, ray_worker
    from tests.support.scripted import ScriptedClient
    from tests.support.tiny import build_tiny_classifier
    from tests.test_nli_serve import cluster_state

    dev, answers = fanoutqa_inputs(tmp_path)
    judge = ScriptedClient(
        {"judge": lambda p: f"Compared.\n{judge_letter(p)}"}, check_constraints=False
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    pace = {"seconds": 0.0}
    stages = StageByPrompt(PROMPTS, {"judge": "judge"})

    def command(run: str, *extra: str) -> list[str]:
        config = tmp_path / f"{run}.yaml"  # the response cache on, its own file per run
        config.write_text(json.dumps({"run": {"cache": str(tmp_path / f"{run}.sqlite")}}))
        return [
            sys.executable,
            "-m",
            "groundcover",
            "eval",
            "fanoutqa",
            "--data",
            str(dev),
            "--answers",
            str(answers),
            "--judge",
            "--endpoint",
            url,
            "--model",
            "scripted",
            "--config",
            str(config),
            "--run-dir",
            str(tmp_path / run),
            "--quiet",
            *extra,
        ]

    def finish(args: list[str], code: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == code, done.stderr[-3000:]
        return done

    with (
        loopback_judge(judge, "reasoning", stages, lambda: pace["seconds"]) as url,
        ray_head(num_cpus=2, resources={"head_driver": 1}) as head,
        ray_worker(head, num_cpus=2, resources={"worker": 1}),
    ):
        on_nodes = [
            "--drivers",
            "2",
            "--ray-address",
            f"127.0.0.1:{head.port}",
            "--driver-resources",
            '[{"head_driver": 1}, {"worker": 1}]',
        ]
        # (1) one process, then two drivers pinned one per node: the same records
        finish(command("one"))
        one = records_of(tmp_path / "one" / "answers")
        assert len(one) == QUESTIONS and len({r[2] for r in one}) == 2  # passes and fails
        two = finish(command("two", *on_nodes))
        run = tmp_path / "two" / "answers"
        assert records_of(run) == one
        assert sorted(whole_records(run)) == sorted(r[0] for r in one)  # each once
        assert not (run / "results.jsonl").exists()  # every record in a driver's file
        rows = json.loads((run / "summary.json").read_text())["drivers_this_invocation"]
        assert [r["driver"] for r in rows] == [0, 1] and rows[0]["node"] != rows[1]["node"]
        assert sum(r["items"] for r in rows) == QUESTIONS
        assert [r["items"] for r in rows] == shard_counts([r[0] for r in one], 2)
        assert "drivers (this invocation)" in two.stdout and rows[1]["ip"] in two.stdout

        # (1a) a driver asking for what no node offers: one error line at once, no record
        nowhere = [*on_nodes[:4], "--driver-resources", '[{"head_driver": 1}, {"nosuch": 1}]']
        refused = finish(command("nowhere", *nowhere), code=1)
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        said = 'driver 1 asks Ray for {"CPU": 1.0, "nosuch": 1.0}'
        assert len(errors) == 1 and said in errors[0], refused.stderr[-2000:]
        assert not whole_records(tmp_path / "nowhere" / "answers")

        # (1b) comprehensiveness, NLI method (five stages per item): the same, one vs two
        from groundcover.pipelines.comprehensiveness.common import PROMPTS as COMP_PROMPTS

        items = comprehensiveness_items(tmp_path)
        scores = []
        # (1c) the same with a cross-encoder as NLI judge: here, and on one Serve app of one
        # replica that the command deploys for both drivers and deletes when they are done
        nli = str(build_tiny_classifier(tmp_path / "tiny-deberta"))
        cross_encoder = ["--nli-backend", "cross-encoder", "--nli-model", nli]
        runs = {
            "comp-one": [],
            "comp-two": on_nodes,
            "ce-one": cross_encoder,
            "ce-two": [*cross_encoder, "--nli-replicas", "1", *on_nodes],
        }
        with loopback_judge(
            comprehensiveness_judge(),
            "reasoning",
            StageByPrompt(COMP_PROMPTS, COMPREHENSIVENESS_STAGES),
        ) as comp_url:
            for name, extra in runs.items():
                args = [
                    *[
                        sys.executable,
                        "-m",
                        "groundcover",
                        "eval",
                        "comprehensiveness",
                    ],
                    *[str(items), "--method", "nli", "--protocol", "spec"],
                    *["--endpoint", comp_url, "--model", "scripted", "--quiet"],
                    *["--run-dir", str(tmp_path / name), *extra],
                ]
                finish(args)
                scores.append(records_of(tmp_path / name))
        assert len(scores[0]) == 12 and scores[0] == scores[1]
        assert len({r[2] for r in scores[0]}) > 2  # the items differ, so a mix-up would show
        assert not (tmp_path / "comp-two" / "results.jsonl").exists()
        assert len(scores[2]) == 12 and scores[2] == scores[3]
        summary = json.loads((tmp_path / "ce-two" / "summary.json").read_text())
        places = summary["nli_placement_this_invocation"]["drivers"]
        assert [p["driver"] for p in places] == [0, 1]
        assert len({p["app"] for p in places}) == 1  # one app for both drivers
        assert all(not p["owned"] and p["answered"] for p in places)  # each scored on it
        replicas = {(r["node"], r["pid"]) for p in places for r in p["replicas_at_start"]}
        assert len(replicas) == 1  # of --nli-replicas 1, not one per driver
        assert places[0]["app"] not in cluster_state(f"127.0.0.1:{head.port}")["apps"]

        # (2) the worker's driver SIGKILLed mid-run: Ray restarts it, it resumes its shard
        pace["seconds"] = 0.25
        slow = ["--concurrency", "1"]
        proc = subprocess.Popen(
            command("killed", *on_nodes, *slow), env=env, stderr=subprocess.PIPE, text=True
        )
        run = tmp_path / "killed" / "answers"
        wait_for(
            lambda: (
                shard_file(run, "d1").is_file()
                and shard_file(run, "d1").read_bytes().count(b"\n") >= 2
            ),
            120,
            "driver 1",
        )
        (victim,) = [p for p in holders(run) if f"{run}/results.d1.jsonl" in _open_files(p)]
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert sorted(whole_records(run)) == sorted(r[0] for r in one)  # none lost, none twice
        assert records_of(run) == one
        rows = json.loads((run / "summary.json").read_text())["drivers_this_invocation"]
        assert rows[1]["pid"] != victim  # the shard was finished by the restarted driver
        assert rows[1]["items"] == shard_counts([r[0] for r in one], 2)[1]
        assert rows[1]["solved_by_last_process"] < rows[1]["items"]

        # (3) the whole command SIGKILLed, then resumed by one process
        proc = subprocess.Popen(command("whole", *on_nodes, *slow), env=env)
        run = tmp_path / "whole" / "answers"
        wait_for(lambda: len(whole_records(run)) >= 4, 120, "four records")
        proc.kill()
        proc.wait(30)
        wait_for(lambda: not holders(run), 60, "the drivers to end with their command")
        partial = len(whole_records(run))
        assert partial < QUESTIONS
        pace["seconds"] = 0.0
        finish(command("whole", "--drivers", "1"))
        assert sorted(whole_records(run)) == sorted(r[0] for r in one)
        assert records_of(run) == one

        # (4) a token cap shared by both drivers: one ledger, whole records, exit 3
        tokens = sum(sum(p + c for p, c in r[4].values()) for r in one)
        cap = int(tokens * 0.4)
        done = finish(command("capped", *on_nodes, "--max-run-tokens", str(cap)), code=3)
        run = tmp_path / "capped" / "answers"
        spent = [
            sum(u["prompt_tokens"] + u["completion_tokens"] for u in r.usage.values())
            for r in results_by_id(run / "results.jsonl")
        ]
        assert 0 < len(spent) < QUESTIONS and sum(spent) <= cap, (spent, cap)
        assert len(whole_records(run)) == len(spent)
        assert "--max-run-tokens" in done.stderr


def _open_files(pid: int) -> list[str]:
    try:
        return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return []


def judged_request(tmp_path: Path, **settings):
    """FanOutQA judging the fixture's answers, with ``settings`` (dotted keys, ``__`` for a dot)."""
    from groundcover.pipelines.api import request_from
    from groundcover.pipelines.runtime.contract.plugins import study

    dev, answers = fanoutqa_inputs(tmp_path)
    fanoutqa = study("fanoutqa")
    overrides = {
        "fanoutqa.input": str(dev),
        "fanoutqa.answers": str(answers),
        "fanoutqa.judge": True,
        "run.run_dir": str(tmp_path / "run"),
    } | {key.replace("__", "."): value for key, value in settings.items()}
    return fanoutqa, request_from(fanoutqa, None, overrides)


def test_a_dry_run_names_each_drivers_share(tmp_path, capsys):
    from groundcover.pipelines.runtime.execution.execute import execute

    fanoutqa, request = judged_request(
        tmp_path,
        evaluator__endpoint="http://127.0.0.1:9/v1",
        evaluator__model="scripted",
        run__drivers=3,
    )
    outcomes = execute(fanoutqa, request, dry_run=True)
    (outcome,) = outcomes.values()
    ids = [f"q{k:02d}" for k in range(QUESTIONS)]
    assert outcome.estimate is not None and outcome.estimate["drivers"] == shard_counts(ids, 3)
    shares = ", ".join(f"driver {k}: {n}" for k, n in enumerate(shard_counts(ids, 3)))
    assert f"3 drivers take the missing items ({shares})" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_drivers_refuse_a_serve_app_each_would_start(tmp_path):
    from groundcover.pipelines.runtime.execution.execute import execute

    fanoutqa, request = judged_request(tmp_path, evaluator__replicas=2, run__drivers=2)
    with pytest.raises(UserError, match="each driver start its own Ray Serve app"):
        execute(fanoutqa, request)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_the_drivers_share_one_nli_app_of_the_runs_replicas(tmp_path):
    """``--nli-replicas N`` with drivers: one app of N replicas for the run (the coordinator
    deploys it), each driver on it by name; nothing else about the run changes."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from groundcover.pipelines.icat.framework import IcatOptions
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.drivers import SharedNli

    items = tmp_path / "items.jsonl"
    items.write_text("")

    def request(**options) -> RunRequest:
        fields = {"input": items, "method": "nli", "nli_backend": "cross-encoder"}
        comp = ComprehensivenessOptions(**(fields | {"nli_model": "m"} | options))
        return RunRequest(EvaluatorConfig(model="embedded"), RunConfig(run_dir=tmp_path), comp)

    on_serve = request(nli_replicas=3, nli_resources='{"nli": 1}', nli_device="cuda")
    shared = SharedNli.of(on_serve)
    assert shared is not None and shared.name.startswith("groundcover-nli-")
    assert shared.settings["model"] == "m" and shared.settings["replicas"] == 3
    assert shared.settings["device"] == "cuda" and shared.settings["resources"] == {"nli": 1.0}
    assert shared.settings["batch_size"] == 32
    drivers = shared.request_for_drivers(on_serve)
    assert drivers.options.nli_app == shared.name and not drivers.options.nli_replicas
    assert drivers.options.nli_resources is None and on_serve.options.nli_replicas == 3
    same = COMPREHENSIVENESS.identity  # where the cross-encoder runs changes no number
    assert same(drivers.options) == same(on_serve.options)
    # nothing to share: a run's own bulk actors, a running app, no Serve, the LLM as NLI judge
    assert SharedNli.of(request(nli_replicas=2, nli_bulk=True)) is None
    assert SharedNli.of(request(nli_app="warm")) is None
    assert SharedNli.of(request()) is None
    llm_judge = ComprehensivenessOptions(input=items, method="nli")
    assert SharedNli.of(dataclasses.replace(on_serve, options=llm_judge)) is None
    icat = IcatOptions(
        input=items, queries=items, snippets=items, nli_model="d", nli_batch=8, nli_replicas=2
    )
    shared = SharedNli.of(dataclasses.replace(on_serve, options=icat))
    assert shared is not None and shared.settings["model"] == "d"
    assert shared.settings["batch_size"] == 8
