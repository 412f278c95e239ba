"""The docs are the tests: every groundcover command in docs/clusters.md's ``bash`` blocks is
parsed by the CLI it documents (its command and every option must exist: a walkthrough that
fails to parse fails here), and every cluster job the page shows -- ``groundcover cluster
plan / prefetch / check-offline`` and the arguments given to ``groundcover.sbatch`` -- is
planned by ``groundcover cluster plan`` on the allocation the page names (2 × 4 80 GB GPUs
where it names none), the command after ``--`` checked with every flag the job adds. What only
GPUs could run stops at the plan; the two-node Slurm job itself runs in
tests/test_cluster_recipes.py."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.test_cluster_plan import LLAMA_70B, planner

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "clusters.md"


def documented_lines() -> list[list[str]]:
    """Each command line of the page's bash blocks, continuations joined, comments dropped;
    a line with an elision (``...``) or a placeholder (``<...>``) is not a command to run."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#") and "..." not in line and "<" not in line:
                found.append(shlex.split(line))
    return found


def groundcover_args(words: list[str]) -> list[str] | None:
    """The words after ``groundcover`` (a path to it too) where it is the command: first after
    any ``VAR=value``, or after ``--`` (``ray job submit ... -- groundcover ...``); or None."""
    for k, word in enumerate(words):
        before = [w for w in words[:k] if "=" not in w or w.startswith("-")]
        if Path(word).name == "groundcover" and (not before or before[-1] == "--"):
            return words[k + 1 :]
    return None


def job_args(words: list[str]) -> list[str] | None:
    """What a line gives ``groundcover.sbatch`` (``cluster run``'s arguments), or None."""
    for k, word in enumerate(words):
        if word.endswith("groundcover.sbatch"):
            return words[k + 1 :]
    return None


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


def test_every_cluster_job_on_the_page_is_planned(tmp_path, plan_here):
    """Each job the page shows, planned: the walkthrough's gpt-oss-120b FanOutQA job, its
    prefetch, its submission, the local-70B comprehensiveness plan with the NLI app."""
    folder = tmp_path / "Llama-3.3-70B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    items = tmp_path / "items.jsonl"
    items.write_text((ROOT / "examples" / "comprehensiveness.jsonl").read_text())
    stand_in = {"/shared/models/Llama-3.3-70B-Instruct": str(folder), "items.jsonl": str(items)}
    jobs = []
    for words in documented_lines():
        given = job_args(words)
        args = groundcover_args(words)
        if given is None and args is not None and args[:1] == ["cluster"]:
            given = args[2:]
        if given is None or "--" not in given:
            continue
        given = [stand_in.get(word, word) for word in given]
        if "--allocation" not in given:
            given = ["--allocation", "2x4", "--gpu-memory", "80", *given]
        jobs.append(given)
    assert len(jobs) >= 4, jobs
    for given in jobs:
        done = plan_here("--json", *given)
        assert done.returncode == 0, (given, done.stderr)
        plan = json.loads(done.stdout)
        assert plan["replicas"] >= 1 and plan["inputs"]["models"], given
