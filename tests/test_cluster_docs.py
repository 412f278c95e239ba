"""The docs are the tests: every line of docs/clusters.md's ``bash`` blocks, read when the test
runs, is run by a test (tests/support/docs_page.py says how each is): the walkthrough's
submission word for word on the two-node Slurm harness (tests/test_cluster_recipes.py, a tiny
model standing in for the judge by the environment); its ``cluster prefetch`` and
``check-offline`` word for word against the loopback hub, here; every ``cluster plan`` line,
every other job and every other groundcover command through ``cluster plan`` on the page's
allocation (2 × 4 80 GB GPUs where it names none), with every flag the job adds -- what only
GPUs could run stops there; and a line that runs no groundcover command is named by its
program. A walkthrough that fails, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groundcover.pipelines.cli.cluster import RAY_FLAGS
from tests.support import docs_page
from tests.support.docs_page import groundcover_args, job_args
from tests.test_cluster_plan import GPT_OSS_120B, LLAMA_70B, cluster, planner

ROOT = Path(__file__).resolve().parents[1]
PAGE_ALLOCATION = ["--allocation", "2x4", "--gpu-memory", "80"]  # the walkthrough's nodes
# a command the page runs on a Ray cluster of its own, planned as a one-node job's: one driver,
# as it runs there (two nodes would give it two, which a run starting its own replicas refuses)
ONE_NODE = ["--allocation", "1x4", "--gpu-memory", "80"]


def documented_lines() -> list[list[str]]:
    """The page's command lines, but those with an elision (``...``) or a placeholder
    (``<...>``), which name no command to run."""
    return [
        line.words for line in docs_page.lines() if "..." not in line.text and "<" not in line.text
    ]


def test_every_line_of_the_page_is_run_by_a_test():
    """No command block of the page is left out: each line is run on the Slurm harness, run
    against the loopback hub, planned by ``cluster plan``, or names a program that is not
    groundcover's (docs_page.SHELL)."""
    kinds: dict[str, list[str]] = {}
    for line in docs_page.lines():
        kinds.setdefault(docs_page.how_run(line), []).append(line.text)
    assert "unaccounted" not in kinds, kinds.get("unaccounted")
    assert len(kinds["harness"]) >= 1 and len(kinds["offline"]) >= 1, kinds
    assert len(kinds["plan"]) >= 10, kinds["plan"]


def test_every_groundcover_command_on_the_page_parses():
    from groundcover.pipelines.cli.cluster import resolve_leaf

    checked = 0
    for words in documented_lines():
        args = groundcover_args(words)
        if args is None or args[:1] == ["cluster"] or job_args(words) is not None:
            continue
        command, path, rest = resolve_leaf(args)
        command.make_context(" ".join(path), rest)  # an unknown option raises here
        checked += 1
    assert checked >= 8


@pytest.fixture
def plan_here(tmp_path, monkeypatch):
    return planner(tmp_path, monkeypatch)


def page_jobs() -> list[list[str]]:
    """What ``cluster plan`` is given for each line the page runs only on GPUs: a ``cluster
    plan`` line's own arguments, a submission's job on the page's allocation, and every other
    groundcover command as the job's command on the page's allocation."""
    jobs = []
    for line in docs_page.lines():
        if docs_page.how_run(line) not in ("plan", "harness"):
            continue
        args = groundcover_args(line.words)
        given = job_args(line.words)
        if args is not None and args[:2] == ["cluster", "plan"]:
            jobs.append(args[2:])
        elif given is not None:
            jobs.append([*PAGE_ALLOCATION, *given])
        else:  # a command the page runs on a Ray of its own: the job sets its Ray and drivers
            assert args is not None, line.text
            jobs.append([*ONE_NODE, "--", "groundcover", *without_job_flags(args)])
    return jobs


def without_job_flags(args: list[str]) -> list[str]:
    """The command as a job runs it: without the ``--ray-address`` and ``--drivers`` the job
    sets itself (and refuses in the command)."""
    kept: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
        elif word in RAY_FLAGS:
            skip = True
        elif not word.startswith(tuple(f"{flag}=" for flag in RAY_FLAGS)):
            kept.append(word)
    return kept


def test_every_command_on_the_page_is_planned(tmp_path, plan_here, monkeypatch):
    """Each job the page shows, and each groundcover command it shows as a job's command,
    planned word for word: the page's local 70B folder is a folder of the published config
    here (the test's stand-in, by the environment), its items files the examples, in the
    folder the plan runs in."""
    folder = tmp_path / "Llama-3.3-70B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    stand_in = {"models": {"/shared/models/Llama-3.3-70B-Instruct": str(folder)}}
    monkeypatch.setenv("GROUNDCOVER_TEST_STANDIN", json.dumps(stand_in))
    here = tmp_path / "submit"
    here.mkdir()
    for name in ("items.jsonl", "responses.jsonl"):
        (here / name).write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    monkeypatch.chdir(here)
    jobs = page_jobs()
    assert len(jobs) >= 12, jobs
    for given in jobs:
        done = plan_here("--json", *given)
        assert done.returncode == 0, (given, done.stderr)
        plan = json.loads(done.stdout)
        assert plan["replicas"] >= 1 or "--judge" not in given, given
        assert plan["command"][0] == "groundcover", given


def test_the_walkthroughs_offline_steps_fetch_what_its_job_reads(tmp_path):
    """The walkthrough's ``cluster prefetch`` line word for word on a login node, against the
    loopback hub (gpt-oss-120b's published config, weights of a few bytes, the tokenizer
    files), after which its ``check-offline`` -- the same arguments, offline -- finds nothing
    missing where before it named each thing; then the walkthrough's ``cluster plan`` runs the
    command's own dry run, everything it reads being here."""
    from tests.support.fake_hub import FakeHub

    [fetch] = docs_page.of_kind("offline")
    args = groundcover_args(fetch.words)
    assert args is not None and args[:2] == ["cluster", "prefetch"], fetch.text
    check = ["check-offline", *args[2:]]
    [walkthrough_plan] = [
        groundcover_args(line.words)
        for line in docs_page.of_kind("plan")
        if "--judge gpt-oss-120b" in line.text and "cluster plan" in line.text
    ]
    shared = tmp_path / "shared"  # the page's /shared
    with FakeHub() as hub:
        files = {"config.json": json.dumps(GPT_OSS_120B).encode(), "model.safetensors": b"w" * 64}
        files |= {"tokenizer.json": b"{}", "original/model.safetensors": b"o" * 64}
        hub.repo("openai/gpt-oss-120b").commit(files)
        for name in ("o200k_base.tiktoken", "cl100k_base.tiktoken"):
            hub.static[f"/encodings/{name}"] = f"{name} ranks".encode()
        env = {"HF_ENDPOINT": hub.url, "GC_TIKTOKEN_URL": f"{hub.url}/encodings/"}
        env |= {"HF_HOME": str(shared / "hf")}  # the walkthrough's export, /shared moved

        def login_node(*argv: str, online: bool) -> object:
            return cluster(*argv, home=tmp_path, HF_HUB_OFFLINE="0" if online else "1", **env)

        before = login_node(*check, online=False)
        assert before.returncode == 1, before.stderr
        missing = [line for line in before.stderr.splitlines() if "cluster: missing" in line]
        assert len(missing) == 4, before.stderr  # the judge, two tokenizer files, the dataset
        fetched = login_node(*args[1:], online=True)
        assert fetched.returncode == 0, fetched.stderr
        asked = [path for _, path, _ in hub.log]
        assert any(p.endswith("/model.safetensors") for p in asked)
        assert not any("original/" in p for p in asked)
        after = login_node(*check, online=False)
        assert after.returncode == 0 and "missing" not in after.stderr, after.stderr
        planned = login_node("plan", "--json", *walkthrough_plan[2:], online=False)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["command_dry_run"].startswith("passed"), plan["command_dry_run"]
    assert (plan["replicas"], plan["tensor_parallel"]) == (8, 1)  # 65.2 GiB on an 80 GB GPU


def test_a_stand_in_is_said_on_the_log_and_a_bad_one_refused_in_one_line(
    tmp_path, plan_here, monkeypatch
):
    """``GROUNDCOVER_TEST_STANDIN``: a named model served from a folder, said on the log, with
    ``replicas`` in place of ``auto`` only for the model stood in for; a value that is not the
    documented object, or a folder without a model, is refused before anything is planned."""
    from groundcover.serving.cluster.standin import ENV

    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B | {"num_hidden_layers": 2}))
    job = ["--allocation", "n1,n2", "--judge", "gpt-oss-120b", "--json", "--", "groundcover"]
    job += ["eval", "fanoutqa", "--data", "fanoutqa-dev", "--judge"]
    monkeypatch.setenv(ENV, json.dumps({"models": {"gpt-oss-120b": str(folder)}, "replicas": "1"}))
    done = plan_here(*job)
    assert done.returncode == 0, done.stderr
    assert f"{ENV}: gpt-oss-120b is the local folder {folder} here" in done.stderr
    plan = json.loads(done.stdout)
    assert (plan["judge"], plan["replicas"]) == (str(folder), 1)
    assert "--limit" not in plan["command"]
    # "limit": the command's first N items, where it takes --limit and gives none itself
    limited = {"models": {"gpt-oss-120b": str(folder)}, "replicas": "1", "limit": 2}
    monkeypatch.setenv(ENV, json.dumps(limited))
    done = plan_here(*job)
    assert done.returncode == 0, done.stderr
    assert f"{ENV}: the command's first 2 item(s) here, --limit 2" in done.stderr
    assert json.loads(done.stdout)["command"][-2:] == ["--limit", "2"]
    own = plan_here(*job, "--limit", "5")
    assert own.returncode == 0 and json.loads(own.stdout)["command"].count("--limit") == 1
    not_taken = plan_here("--allocation", "n1,n2", "--json", "--", "groundcover", "data", "list")
    line = not_taken.stderr.strip().splitlines()[-1]  # after the stand-in's model, said
    assert not_taken.returncode == 2 and line.endswith('"limit": `data list` takes no --limit')
    assert not_taken.stdout == ""
    for bad, said in (
        ("{models", "not JSON"),
        (json.dumps({"models": {"gpt-oss-120b": str(tmp_path)}}), "no model folder"),
        (json.dumps({"replicas": "x"}), "a whole number"),
        (json.dumps({"limit": 0}), "a whole number of items"),
        (json.dumps({"limit": "2"}), "a whole number of items"),
        (json.dumps({"anything": 1}), '"models", "replicas" and "limit" only'),
    ):
        monkeypatch.setenv(ENV, bad)
        refused = plan_here(*job)
        assert refused.returncode == 2 and refused.stdout == "", bad
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith(f"error: cluster plan: {ENV}: ") and said in line, line
