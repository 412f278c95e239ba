"""Session fixtures: a tiny Llama + LoRA adapter built locally, served by the real vLLM engine."""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

import pytest

from groundcover.serving.launch import startlog
from groundcover.serving.launch.registry import LoraAdapter
from groundcover.serving.launch.server import (
    ServerSpec,
    ServerStartError,
    VLLMServer,
    engine_device,
)

ADAPTER = "claims"
SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# vLLM's default for hermes tool calls is a structural tag that does not stop a random model from
# padding arguments with whitespace; the JSON-schema path honours disable_any_whitespace.
TEST_SERVER_ENV = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def pytest_configure(config) -> None:
    """Every vLLM server, Ray cluster, Serve app and model conversion the session starts (also in
    the CLI processes tests spawn) appends its wall time here; the summary prints the totals."""
    # the Ray clusters tests start with `ray start` wait for a Serve proxy as a local Ray of
    # ours does (serving/ray_cluster.connect): a loaded machine starts one in more than 5 s
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    # The README's `-n 2` on a 2-core machine: one OpenMP thread per process (torch, FAISS, and
    # the processes tests start inherit it), as our vLLM servers already run. One thread per
    # core in each of several busy processes oversubscribes the cores (measured: tests/test_ann,
    # test_scale and test_retrieval with -n 2 took 284 s instead of 311 s).
    for threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(threads, "1")
    # Bytecode is cached (in __pycache__, ignored by git) even where the environment says not to
    # (PYTHONDONTWRITEBYTECODE, set on the CI machines): else each of the hundreds of CLI
    # processes, drivers and Ray workers the tests start compiles groundcover's modules again
    # (measured: 1.5 s of CPU to import a framework's CLI path against 1.1 s from the cache).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if not os.environ.get(startlog.ENV):
        fd, path = tempfile.mkstemp(prefix="gc-starts-", suffix=".jsonl")
        os.close(fd)
        os.environ[startlog.ENV] = path


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the tests in an order shuffled with SEED (files stay whole for the workers): "
        "the suite must not depend on its order",
    )
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each scheduling group's seconds in this run to {DURATIONS.name}, which "
        "orders the groups longest first",
    )


# Each scheduling group's seconds in a whole run (`--store-durations`): under -n N the workers take
# the longest groups first, so no long file starts late while the other worker runs dry.
DURATIONS = Path(__file__).with_name("durations.json")
UNTIMED_ENGINE_GROUP = 60.0  # a group not in DURATIONS: its guess (engine files are the long ones)


# Tests that start a Ray cluster or Serve app: one scheduling group, never beside each other
# (two local Ray clusters on one machine contend for Ray's default ports, and some of these tests
# count the machine's Ray processes). They get the `ray` mark from here (`-m "not ray"`).
RAY_TESTS = (
    "tests/test_nli_serve.py",
    "tests/test_ray_serve.py",
    "tests/test_ray_serve_cli.py",
    "tests/test_scale.py",
    "tests/test_serve_start.py",
    "tests/test_retrieval.py::test_sharded_ray_build_equals_single_process",
    "tests/test_drivers.py::test_two_drivers_on_two_nodes",
    "tests/test_cluster_recipes.py::test_cluster_run_inside_a_running_ray_cluster",
)


# Files whose tests take the session's `killable` server (the kill-and-restart tests): one group,
# so that the server one leaves running is the next one's, never a second start on another worker.
KILLABLE_TESTS = ("tests/test_outages.py", "tests/test_resilience.py")


def scheduling_group(nodeid: str) -> str:
    """The Ray group, the killable server's group, else the test's file: a module's fixtures (a
    Serve app, an index) start once per session when its tests stay on one worker."""
    if nodeid.startswith(RAY_TESTS):
        return "ray"
    return "killable" if nodeid.startswith(KILLABLE_TESTS) else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N``: whole groups go to a worker, in collection order (xdist's own
    ``loadgroup`` cannot rename node ids under pytest 9, so the groups are made here)."""
    from xdist.scheduler import LoadScopeScheduling

    # xdist reorders the groups by their number of tests unless told not to: a long group of few
    # tests (test_embedded: one test of minutes) then started last while the other worker sat idle
    config.option.loadscopereorder = False

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_group(nodeid)

    return Groups(config, log)


def pytest_itemcollected(item) -> None:
    if scheduling_group(item.nodeid) == "ray":
        item.add_marker(pytest.mark.ray)
    if "vllm_server" in getattr(item, "fixturenames", ()):  # the real engine, marked or not
        item.add_marker(pytest.mark.engine)


def pytest_collection_modifyitems(config, items) -> None:
    """The order the workers take the groups in under ``-n N`` (``group_order``); a file's
    tests stay together."""
    if (seed := config.getoption("--shuffle")) is not None:  # every worker: the same order
        random.Random(seed).shuffle(items)
    skip_gpu_tests(items)

    first_seen: dict[str, int] = {}
    heavy: set[str] = set()
    for n, item in enumerate(items):
        name = scheduling_group(item.nodeid)
        first_seen.setdefault(name, n)
        if item.get_closest_marker("engine"):
            heavy.add(name)
    if seed is not None:  # shuffled, the order stays random
        return

    # a group's seconds from its last stored run; a group not stored: a guess by whether it runs
    # the engine
    timed = stored_durations()
    seconds = {
        name: timed.get(name, UNTIMED_ENGINE_GROUP if name in heavy else 0.0) for name in first_seen
    }
    place = {name: n for n, name in enumerate(group_order(seconds, list(first_seen)))}
    items.sort(key=lambda item: place[scheduling_group(item.nodeid)])  # stable: tests keep order


def group_order(seconds: dict[str, float], collected: list[str]) -> list[str]:
    """The Ray group first, then the longest groups first, except that the longest group after
    Ray waits until the groups before it add up to Ray's seconds. Ray and that group (the
    two-node Slurm harness, itself a Ray cluster per job) each start servers and clusters that
    take every core: side by side on two workers each ran about twice as long as alone, while any
    other group beside them leaves them most of the machine."""
    longest = sorted(collected, key=lambda name: (name != "ray", -seconds[name]))
    if len(longest) < 3 or longest[0] != "ray":
        return longest
    first, second, rest = longest[0], longest[1], longest[2:]
    held_back, filled = len(rest), 0.0
    for n, name in enumerate(rest):
        if filled >= seconds[first]:
            held_back = n
            break
        filled += seconds[name]
    return [first, *rest[:held_back], second, *rest[held_back:]]


def stored_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


_group_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    """Setup, call and teardown of every test, summed by group (in the controller under -n N,
    which sees each worker's reports)."""
    name = scheduling_group(report.nodeid)
    _group_seconds[name] = _group_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session) -> None:
    config = session.config
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        ordered = sorted(_group_seconds.items(), key=lambda kv: -kv[1])
        DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in ordered}, indent=1) + "\n")


def skip_gpu_tests(items) -> None:
    """Tests marked ``gpu`` run where torch sees a CUDA device, and are skipped with the reason
    elsewhere (torch is imported only when such a test was collected)."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = f"needs a CUDA GPU: torch {torch.__version__} sees none (scripts/gpu_check.py)"
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter) -> None:
    path = Path(os.environ.get(startlog.ENV, ""))
    if not path.is_file():
        return
    starts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not starts:
        return
    totals: dict[str, list[float]] = {}
    for start in starts:
        totals.setdefault(start["kind"], []).append(start["seconds"])
    terminalreporter.section("parts started")
    for kind, seconds in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        terminalreporter.write_line(f"{kind:12} {len(seconds):4d} starts {sum(seconds):8.1f} s")
    terminalreporter.write_line(f"(one line per start: {path})")


@pytest.fixture(scope="session", autouse=True)
def groundcover_home(tmp_path_factory) -> Path:
    """Keep caches and converted models of the test session out of the user's home."""
    home = tmp_path_factory.mktemp("gchome")
    os.environ["GROUNDCOVER_HOME"] = str(home)
    # ir_datasets fixes its home when first imported: one per session, tests write files there
    os.environ["IR_DATASETS_HOME"] = str(home / "ir_datasets")
    return home


def require_engine() -> None:
    try:
        engine_device()
    except ServerStartError as exc:
        pytest.skip(f"no vLLM engine installed ({exc}); run ./setup.sh")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tests.support.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_lora(tiny_model, tmp_path_factory) -> Path:
    from tests.support.tiny import build_tiny_lora

    return build_tiny_lora(tiny_model, tmp_path_factory.mktemp("adapters") / ADAPTER)


def tiny_server(tiny_model: Path, tiny_lora: Path, log: Path, port: int = 0) -> VLLMServer:
    spec = ServerSpec(
        model=str(tiny_model),
        loras=[LoraAdapter(name=ADAPTER, path=str(tiny_lora), base=tiny_model.name, rank=8)],
        port=port,
        extra_args=TOOL_ARGS,
        env=TEST_SERVER_ENV,
    )
    return VLLMServer(spec, log)


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tiny_lora, tmp_path_factory):
    require_engine()
    server = tiny_server(tiny_model, tiny_lora, tmp_path_factory.mktemp("logs") / "serve.log")
    with server:
        yield server


class Killable:
    """The server the kill-and-restart tests kill (test_outages, test_resilience): each takes
    the one left running (started here for the first), kills it, starts it again on its port
    and leaves that one for the next -- one start fewer per test than a server of its own --
    and the session stops the last. Never the session's ``vllm_server``, which others share."""

    def __init__(self, tiny_model: Path, tiny_lora: Path) -> None:
        self.model, self.lora = tiny_model, tiny_lora
        self.server: VLLMServer | None = None

    def take(self, log: Path) -> VLLMServer:
        if self.server is None or self.server.process is None or self.server.process.poll():
            self.stop()
            self.server = tiny_server(self.model, self.lora, log).start()
        return self.server

    def again(self, port: int, log: Path) -> VLLMServer:
        """A server on ``port`` again, after the test killed the one it took."""
        self.stop()
        self.server = tiny_server(self.model, self.lora, log, port=port).start()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None


@pytest.fixture(scope="session")
def killable(tiny_model, tiny_lora):
    require_engine()
    # own server: the tests that use it kill it (one start shared by them)
    held = Killable(tiny_model, tiny_lora)
    yield held
    held.stop()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh GROUNDCOVER_HOME for a dataset test (its lock, downloads and conversions), online."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "home"


@pytest.fixture
def hub(monkeypatch):
    """The loopback imitation of the Hugging Face Hub, as HF_ENDPOINT."""
    from tests.support.fake_hub import FakeHub

    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake
