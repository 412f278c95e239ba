"""The Slurm recipe (scripts/slurm/) on a real Slurm: Debian's slurmctld, slurmd and munge
started here as root with a minimal slurm.conf (tests/support/slurm.py), and
``groundcover.sbatch`` submitted with sbatch. The run is FanOutQA judged through a loopback
judge that answers from the prompt alone (as in tests/test_drivers.py), so the records of the
job's two drivers equal a local run's. An ``scancel`` mid-run stops the command, the drivers and
Ray; the same script submitted again ends with every item recorded once. A grid of two runs is
one job array. Skipped, with the reason, where Slurm cannot be started (not root, no apt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.slurm import slurm_cluster, unavailable
from tests.test_drivers import QUESTIONS, fanoutqa_inputs, judge_letter, records_of, wait_for

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "scripts" / "slurm" / "groundcover.sbatch"
WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no Slurm here: {WHY}")


@pytest.fixture(scope="module")
def slurm():
    with slurm_cluster(cpus=2) as cluster:
        yield cluster


def ray_processes(job: str) -> list[int]:
    """Processes of the job's Ray: naming its temp dir (which names the job), or with a file
    in it open (a worker's log: a driver actor's command line is ``ray::ShardDriver``)."""
    import psutil

    mark = f"/tmp/gc-ray-{job}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            named = any(mark in part for part in process.info["cmdline"] or [])
            if named or any(f.path.startswith(mark + "/") for f in process.open_files()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def test_the_recipe_runs_resumes_after_scancel_and_cleans_up(slurm, tmp_path):
    from groundcover.pipelines.fanoutqa.framework import PROMPTS
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.records import whole_records
    from tests.support.scripted import ScriptedClient

    dev, answers = fanoutqa_inputs(tmp_path)
    judge = ScriptedClient(
        {"judge": lambda p: f"Compared.\n{judge_letter(p)}"}, check_constraints=False
    )
    pace = {"seconds": 0.0}
    env = dict(os.environ, PYTHONPATH=str(ROOT), GROUNDCOVER_HOME=str(ROOT))
    env["GC_PYTHON"] = sys.executable

    def command(run: Path | None, url: str) -> list[str]:
        return [
            *[sys.executable, "-m", "groundcover", "eval", "fanoutqa", "--data", str(dev)],
            *["--answers", str(answers), "--judge", "--endpoint", url, "--model", "scripted"],
            *["--quiet", "--no-cache", "--concurrency", "2"],
            *(["--run-dir", str(run)] if run else []),
        ]

    def submit(
        run: Path | None, url: str, *sbatch: str, grid: Path | None = None, drivers: int = 2
    ) -> str:
        """The recipe, its resources set for this one-node, two-CPU Slurm (a driver takes a
        CPU of the node's Ray)."""
        options = [f"--cpus-per-task={drivers}", "--nodes=1", f"--output={tmp_path}/slurm-%j.out"]
        launch = ["--drivers-per-node", str(drivers), "--", *command(run, url)]
        where = env | ({"GC_GRID": str(grid)} if grid else {})
        return slurm.submit([*options, *sbatch], RECIPE, launch, where)

    with loopback_judge(
        judge, "reasoning", StageByPrompt(PROMPTS, {"judge": "judge"}), lambda: pace["seconds"]
    ) as url:
        local = tmp_path / "local"
        done = subprocess.run(command(local, url), capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        expected = records_of(local / "answers")
        assert len(expected) == QUESTIONS

        # (1) submitted, cancelled once the drivers have recorded some items
        pace["seconds"] = 1.5  # 24 items over 2 drivers, 2 at a time each: about 9 s
        run = tmp_path / "slurm"
        job = submit(run, url)
        wait_for(lambda: len(whole_records(run / "answers")) >= 2, 240, "the job's first records")
        slurm.cancel(job)
        assert slurm.wait(job, 120) == "CANCELLED"
        log = tmp_path / f"slurm-{job}.out"  # the job ends after Slurm says CANCELLED
        wait_for(lambda: "Ray stopped on every node" in log.read_text(), 60, "the cleanup")
        assert "SIGTERM: stopping the command" in log.read_text()
        wait_for(lambda: not ray_processes(job), 60, "the job's Ray to stop")
        partial = whole_records(run / "answers")
        assert 2 <= len(partial) < QUESTIONS and len(set(partial)) == len(partial)

        # (2) the same script again: the run continues, each item recorded once
        pace["seconds"] = 0.0
        again = submit(run, url)
        assert slurm.wait(again, 240) == "COMPLETED", (tmp_path / f"slurm-{again}.out").read_text()
        assert records_of(run / "answers") == expected
        assert sorted(whole_records(run / "answers")) == sorted(r[0] for r in expected)
        assert not ray_processes(again)
        log = (tmp_path / f"slurm-{again}.out").read_text()
        assert "--drivers 2" in log and "the command ended with exit code 0" in log

        # (3) a grid of two runs as one job array: line k of the grid file for task k, each
        # task its own Ray on its own ports
        grid = tmp_path / "grid.txt"
        grid.write_text(f"# one run per line\n--run-dir {tmp_path}/g0\n--run-dir {tmp_path}/g1\n")
        array = submit(None, url, "--array=0-1", grid=grid, drivers=1)  # side by side
        for task in ("0", "1"):
            assert slurm.wait(f"{array}_{task}", 240) == "COMPLETED"
            assert records_of(tmp_path / f"g{task}" / "answers") == expected
