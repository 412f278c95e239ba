"""The cluster recipes. The Slurm recipe (scripts/slurm/) on a real Slurm: Debian's slurmctld,
slurmd and munge started here as root with a minimal slurm.conf (tests/support/slurm.py), and
``groundcover.sbatch`` submitted with sbatch. The run is FanOutQA judged through a loopback
judge that answers from the prompt alone (as in tests/test_drivers.py), so the records of the
job's two drivers equal a local run's. An ``scancel`` mid-run stops the command, the drivers and
Ray; the same script submitted again ends with every item recorded once. A grid of two runs is
one job array. Skipped, with the reason, where Slurm cannot be started (not root, no apt). The
launcher's own rules (ports, GPUs, the grid, what it adds to the command, which processes it
ends) are checked without Slurm; the KubeRay manifest against KubeRay's published schema where
its CRDs are at hand (``GC_KUBERAY_CRDS``: a folder of them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.slurm import install, slurm_cluster, unavailable
from tests.test_drivers import QUESTIONS, fanoutqa_inputs, judge_letter, records_of, wait_for

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "scripts" / "slurm" / "groundcover.sbatch"
WHY = unavailable() if os.environ.get("GC_SLURM", "1") != "0" else "GC_SLURM=0"
needs_slurm = pytest.mark.skipif(WHY is not None, reason=f"no Slurm here: {WHY}")


@pytest.fixture(scope="module")
def slurm():
    failed = install()  # here, not at collection: one worker installs, once
    if failed is not None:
        pytest.skip(f"no Slurm here: {failed}")
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


@needs_slurm
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
    env = dict(os.environ, PYTHONPATH=str(ROOT), GC_CHECKOUT=str(ROOT))
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
        # 24 items over 2 drivers, 2 at a time each: about 24 s, so the cancel (sent after the
        # first two records) lands mid-run even on a loaded machine (at 1.5 s the run once
        # finished first)
        pace["seconds"] = 4.0
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

        # (2) the same script again: the run continues, each item recorded once; the site's
        # environment file (GC_SETUP) is sourced first
        pace["seconds"] = 0.0
        setup = tmp_path / "site.sh"
        setup.write_text('echo "site environment: $SLURM_JOB_ID"\nexport GC_SITE_MARK=1\n')
        env["GC_SETUP"] = str(setup)
        again = submit(run, url)
        del env["GC_SETUP"]
        assert slurm.wait(again, 240) == "COMPLETED", (tmp_path / f"slurm-{again}.out").read_text()
        assert records_of(run / "answers") == expected
        assert sorted(whole_records(run / "answers")) == sorted(r[0] for r in expected)
        assert not ray_processes(again)
        log = (tmp_path / f"slurm-{again}.out").read_text()
        assert "--drivers 2" in log and "the command ended with exit code 0" in log
        assert f"site environment: {again}" in log

        # (3) a grid of two runs as one job array: line k of the grid file for task k, each
        # task its own Ray on its own ports
        grid = tmp_path / "grid.txt"
        grid.write_text(f"# one run per line\n--run-dir {tmp_path}/g0\n--run-dir {tmp_path}/g1\n")
        array = submit(None, url, "--array=0-1", grid=grid, drivers=1)  # side by side
        for task in ("0", "1"):
            assert slurm.wait(f"{array}_{task}", 240) == "COMPLETED"
            assert records_of(tmp_path / f"g{task}" / "answers") == expected


# ---- the launcher's rules, without Slurm -------------------------------------------------------


def script(path: str):
    """A script of scripts/ loaded as a module (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launcher():
    return script("scripts/slurm/launch.py")


def test_the_allocation_read_from_slurms_environment():
    launch = launcher()
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu7", "SLURM_CPUS_ON_NODE": "32"}
    alloc = launch.Allocation(env | {"SLURM_GPUS_ON_NODE": "4", "SLURM_ARRAY_TASK_ID": "3"})
    assert (alloc.nodes, alloc.cpus, alloc.gpus, alloc.array_task) == (["gpu7"], 32, 4, "3")
    ports = alloc.ports()
    # job 4242: block 4242 % 56 = 42 of the 56 blocks of 400 between 10000 and 32768 (below the
    # kernel's ephemeral range); the GCS first, the workers' range last
    assert ports["port"] == 10000 + 42 * 400 == 26800
    assert (ports["min-worker-port"], ports["max-worker-port"]) == (26820, 27199)
    assert len(set(ports.values())) == len(ports)  # no port twice
    for job in range(0, 5000, 97):  # every block stays below the ephemeral range
        block = launch.Allocation(env | {"SLURM_JOB_ID": str(job)}).ports()
        assert min(block.values()) >= 10000 and max(block.values()) < 32768
    assert launch.Allocation(env | {"CUDA_VISIBLE_DEVICES": "0,1"}).gpus == 2
    # 4 GPUs on each of 2 nodes, 1 for the NLI app: 7 judge replicas of 1 GPU, 3 of 2
    two = launch.Allocation(env | {"SLURM_GPUS_ON_NODE": "4"})
    two.nodes = ["a", "b"]
    assert launch.replicas_for("auto", two, 1, 1) == 7
    assert launch.replicas_for("auto", two, 1, 2) == 3
    with pytest.raises(SystemExit, match="0 GPU"):
        launch.replicas_for("auto", launch.Allocation(env), 0, 1)


def test_a_block_with_a_port_in_use_gives_way_to_the_next_one():
    import socket

    launch = launcher()
    alloc = launch.Allocation({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu7"})
    first = alloc.ports()
    with socket.socket() as holder:  # something else holds a worker port of the job's block
        holder.bind(("127.0.0.1", first["min-worker-port"] + 7))
        holder.listen()
        moved = alloc.ports()
    assert moved["port"] == first["port"] + 400  # the next block
    assert alloc.ports() == first  # free again: the job's own block
    assert alloc.ports(base=15000)["port"] == 15000  # GC_RAY_PORT_BASE: no probing


def test_a_grid_line_per_array_task(tmp_path):
    launch = launcher()
    grid = tmp_path / "grid.txt"
    grid.write_text("# model grid\n--model a --run-dir 'runs/a b'\n\n--model c\n")
    assert launch.grid_line(grid, "0") == ["--model", "a", "--run-dir", "runs/a b"]
    assert launch.grid_line(grid, "1") == ["--model", "c"]
    with pytest.raises(SystemExit, match="2 runs; array task 2 has none"):
        launch.grid_line(grid, "2")
    with pytest.raises(SystemExit, match="no array job"):
        launch.grid_line(grid, None)


def test_the_command_gets_the_cluster_and_one_driver_per_node_and_k(monkeypatch):
    launch = launcher()
    monkeypatch.delenv("GC_GRID", raising=False)
    alloc = launch.Allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"})
    alloc.nodes = ["n1", "n2", "n3"]
    cluster = launch.Cluster(alloc, "ray", None, launch.Stopping())
    args = launch.argparse.Namespace(
        command=["--", "groundcover", "eval", "x"], drivers_per_node=2, nli=None, judge=None
    )
    command = launch.command_for(args, alloc, cluster)
    assert command == [
        *["groundcover", "eval", "x", "--ray-address", cluster.address, "--drivers", "6"]
    ]
    assert cluster.address.endswith(":12800")  # job 7: block 7 (10000 + 7 x 400)


def test_the_cleanup_ends_only_the_jobs_processes(tmp_path):
    """``reap``: a process with a file open in the job's Ray folder (a driver actor whose
    raylet is gone) is ended; one outside it is not."""
    launch = launcher()
    folder = tmp_path / "gc-ray-99"
    folder.mkdir()
    hold = "import sys, time; f = open(sys.argv[1], 'w'); time.sleep(60)"
    inside = subprocess.Popen([sys.executable, "-c", hold, str(folder / "worker.out")])
    outside = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "other.out")])
    try:
        wait_for(lambda: (folder / "worker.out").exists(), 30, "the file open")
        wait_for(lambda: (tmp_path / "other.out").exists(), 30, "the other file open")
        assert launch.reap(str(folder)) == 1
        assert inside.wait(30) == -9 and outside.poll() is None
    finally:
        outside.kill()
        inside.kill()
        outside.wait()
        inside.wait()


# ---- KubeRay ----------------------------------------------------------------------------------

# KubeRay v1.7.0's published CRDs: ../shared/kuberay-crds beside the checkout (CI has it), or
# a folder named by GC_KUBERAY_CRDS
KUBERAY = Path(os.environ.get("GC_KUBERAY_CRDS") or ROOT.parent / "shared" / "kuberay-crds")


def checker():
    return script("scripts/kuberay/check.py")


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


def test_the_rayjob_manifest_cleans_up_on_failure_has_a_deadline_and_keeps_drivers_off_the_head():
    """What a failed run leaves behind and where its work lands, read from the manifest (its
    schema is checked above): no ``set -e`` before the cleanup, a trap that stops the NLI app
    and the judge on every exit, a bounded wait for the judge, a deadline, KubeRay's own token
    authentication, a head that offers no CPU (drivers are placed on workers), and secrets a
    pod starts without."""
    import yaml

    text = (ROOT / "scripts/kuberay/groundcover-rayjob.yaml").read_text()
    job = yaml.safe_load(text)
    entry = job["spec"]["entrypoint"]
    assert "set -e" not in entry and "trap cleanup EXIT" in entry
    assert "--nli-app nli --stop" in entry.split("trap")[0]  # the cleanup stops the NLI app
    assert "until curl" not in entry and "seq 60" in entry  # the judge's wait ends
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
    assert "RAY_AUTH_TOKEN" not in text  # KubeRay makes and mounts the token
