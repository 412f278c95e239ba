"""docs/clusters.md's command blocks as the tests run them: every line of every ``bash`` block,
read when the test runs (an edit of the page changes what is run), and how each is run.

- ``harness``: an ``sbatch ... groundcover.sbatch JOB`` submission, run word for word on the
  two-node Slurm harness (tests/test_cluster_recipes.py) -- its GPU request aside, which the
  harness cannot grant: the test's stand-in (``GROUNDCOVER_TEST_STANDIN``) serves a tiny model
  on vLLM's CPU engine in the judge's place;
- ``offline``: ``groundcover cluster prefetch`` / ``check-offline``, run word for word against
  the loopback hub (tests/test_cluster_docs.py);
- ``plan``: ``groundcover cluster plan`` as written, and every other groundcover command (and
  an array's job) through ``cluster plan`` on the page's allocation: what only GPUs could run;
- ``shell``: a line that runs no groundcover command, named by its program in ``SHELL``."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "clusters.md"
SHARED = "/shared"  # the page's shared filesystem; a test's own folder on the harness
GPU_REQUESTS = ("--gpus-per-node", "--gpus", "--gres", "--gpus-per-task")

# what is not a groundcover command, and where it is covered, if anywhere
SHELL = {
    "cd": "the shell",
    "git": "the shell",
    "export": "the site's environment: each test sets its own",
    "module": "the site's environment modules (Lmod), not here",
    "ray": "Ray's own CLI (`ray start`): the tests start Ray with it in tests/support/ray_head.py",
    "./setup.sh": "the installer: its GPU driver check in test_cluster_recipes.py",
    ".venv/bin/hf": "the Hugging Face CLI's login",
}


@dataclass(frozen=True)
class DocLine:
    block: int  # the bash block's number on the page, from 0
    text: str  # the command line as written, continuations joined, its comment dropped
    words: list[str]

    @property
    def program(self) -> str:
        """The first word that is not a ``VAR=value`` assignment."""
        return next((w for w in self.words if not re.match(r"^[A-Z_]+=", w)), "")

    def assignments(self) -> dict[str, str]:
        """The ``VAR=value`` words before the program (``GC_GRID=grid.txt sbatch ...``)."""
        found = {}
        for word in self.words:
            if not re.match(r"^[A-Z_]+=", word):
                break
            name, _, value = word.partition("=")
            found[name] = value
        return found


def lines() -> list[DocLine]:
    """Every command line of the page's bash blocks."""
    found = []
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    for number, block in enumerate(blocks):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                found.append(DocLine(number, line, shlex.split(line)))
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


def sbatch_options(words: list[str]) -> list[str]:
    """The options a line gives ``sbatch`` itself, before the script."""
    start = words.index("sbatch") + 1
    end = next(k for k, w in enumerate(words) if w.endswith("groundcover.sbatch"))
    return words[start:end]


def how_run(line: DocLine) -> str:
    """harness, offline, plan or shell; ``unaccounted`` for a line no test runs."""
    if line.program == "sbatch" and job_args(line.words) is not None:
        return "plan" if any(w.startswith("--array") for w in line.words) else "harness"
    args = groundcover_args(line.words)
    if args is not None:
        if args[:2] in (["cluster", "prefetch"], ["cluster", "check-offline"]):
            return "offline"
        return "plan"
    if line.program in SHELL:
        return "shell"
    return "unaccounted"


def of_kind(kind: str) -> list[DocLine]:
    return [line for line in lines() if how_run(line) == kind]


def on_the_harness(line: DocLine, shared: Path) -> tuple[list[str], list[str]]:
    """(sbatch's options, the job's arguments) of a submission as the harness runs it: the
    page's words, less the GPU request the harness cannot grant, the page's shared filesystem
    at ``shared``."""
    options, words = [], sbatch_options(line.words)
    for k, word in enumerate(words):
        asked_gpus = word.split("=", 1)[0] in GPU_REQUESTS
        value_of_gpus = k > 0 and words[k - 1] in GPU_REQUESTS  # ``--gpus-per-node 4``
        if not asked_gpus and not value_of_gpus:
            options.append(word)
    given = job_args(line.words) or []
    moved = [str(shared) + w[len(SHARED) :] if w.startswith(SHARED + "/") else w for w in given]
    return options, moved
