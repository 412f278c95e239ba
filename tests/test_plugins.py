"""A framework from outside the repository: ``examples/answer-relevance`` (one module and a
pyproject) installed with pip, found by its ``groundcover.frameworks`` entry point, gets what
the built-ins get without a change to groundcover: the command and its help, a run against a
real HTTP judge with the exact score worked out by hand, a kill and a resume, a judge panel
and ``agreement``, ``--dry-run``, ``report`` (HTML too), ``compare`` and the Python API. And a
plugin that fails to import is one warning line while the rest load; a wheel of groundcover
installs one top-level name."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.loopback import serve_app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "answer-relevance"

# Each judge's label per question (the prompt names it); j1 alone is the single judge.
VERDICTS = {
    "j1": {"capital": "yes", "sky": "yes", "Hamlet": "no", "spider": "partly"},
    "j2": {"capital": "yes", "sky": "yes", "Hamlet": "no", "spider": "yes"},
    "j3": {"capital": "yes", "sky": "partly", "Hamlet": "no", "spider": "no"},
}
# by hand: j1 alone scores 1, 1, 0, 0.5 -> 0.625; the panel votes yes, yes (2 of 3), no, and a
# three-way tie on the spider, which goes to "partly": 1, 1, 0, 0.5 -> 0.625 with one tie
SINGLE_MEAN = PANEL_MEAN = 0.625


class Judge:
    """An OpenAI-compatible judge on 127.0.0.1 answering by model and question; requests about
    ``held`` questions wait until ``release`` (a run can be killed in between)."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.gate = threading.Event()
        self.calls: list[tuple[str, str]] = []

    def verdict(self, model: str, prompt: str) -> tuple[str, str]:
        topic = next(t for t in VERDICTS[model] if t in prompt)
        self.calls.append((model, topic))
        return topic, VERDICTS[model][topic]

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            data = [{"id": m, "root": m, "max_model_len": 4096} for m in VERDICTS]
            return web.json_response({"object": "list", "data": data})

        async def complete(request: web.Request) -> web.Response:
            body = await request.json()
            prompt = body["messages"][-1]["content"]
            topic, label = self.verdict(body["model"], prompt)
            if topic in self.held:
                while not self.gate.is_set():
                    await asyncio.sleep(0.05)
            usage = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}
            choice = {"index": 0, "message": {"role": "assistant", "content": label}}
            return web.json_response(
                {"id": "x", "object": "chat.completion", "model": body["model"], "usage": usage}
                | {"choices": [choice | {"finish_reason": "stop"}]}
            )

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", complete)
        return app


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The example installed with pip into its own folder (never this environment), its judge
    served, and the environment a command finds both with."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "--target", str(target), str(EXAMPLE)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    judge = Judge()
    env = os.environ | {"PYTHONPATH": str(target), "GROUNDCOVER_HOME": str(target / "home")}
    with serve_app(judge.app()) as url:
        yield {"env": env, "url": url, "judge": judge, "site": target}


def groundcover(plugin: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "groundcover", *args]
    return subprocess.run(command, capture_output=True, text=True, env=plugin["env"], timeout=120)


def relevance(plugin: dict[str, Any], run_dir: Path, *extra: str) -> list[str]:
    items = str(EXAMPLE / "items.jsonl")
    common = ["--endpoint", plugin["url"], "--run-dir", str(run_dir), "--quiet", "--no-cache"]
    return ["eval", "relevance", items, "--model", "j1", *common, *extra]


def records(run_dir: Path) -> dict[str, dict[str, Any]]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    found = [json.loads(line) for line in lines if line.strip()]
    by_id = {r["id"]: r for r in found}
    assert len(by_id) == len(found), "an item recorded twice"
    return by_id


def test_an_installed_plugin_runs_resumes_and_reports_like_a_built_in(plugin, tmp_path):
    judge: Judge = plugin["judge"]
    listed = groundcover(plugin, "eval", "--help")
    assert listed.returncode == 0 and "relevance" in listed.stdout, listed.stderr
    own_help = groundcover(plugin, "eval", "relevance", "--help")
    assert "items JSONL: id, question, answer" in own_help.stdout  # from the options' field

    # a run killed after two items resumes and records each item once
    single = tmp_path / "single"
    judge.held, judge.gate = {"Hamlet", "spider"}, threading.Event()
    process = subprocess.Popen(
        [sys.executable, "-m", "groundcover", *relevance(plugin, single, "--concurrency", "1")],
        env=plugin["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not (single / "results.jsonl").is_file() or len(records(single)) < 2:
        assert process.poll() is None and time.monotonic() < deadline, "no two items recorded"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    judge.gate.set()
    assert sorted(records(single)) == ["q1", "q2"]
    done = groundcover(plugin, *relevance(plugin, single))
    assert done.returncode == 0, done.stderr[-2000:]
    got = records(single)
    assert {i: r["score"] for i, r in got.items()} == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.5}
    tables = json.loads((single / "relevance.json").read_text())
    assert tables["mean"] == SINGLE_MEAN and tables["labels"] == {"yes": 2, "partly": 1, "no": 1}

    # nothing left to ask: the dry run says so and starts nothing
    calls = len(judge.calls)
    dry = groundcover(plugin, *relevance(plugin, single, "--dry-run"))
    assert dry.returncode == 0 and len(judge.calls) == calls, dry.stderr[-2000:]

    # a panel of three judges votes; agreement measures its members against each other
    panel = tmp_path / "panel"
    members = [f"--role=judge=j{k}@{plugin['url']}" for k in (1, 2, 3)]
    done = groundcover(plugin, *relevance(plugin, panel, *members))
    assert done.returncode == 0, done.stderr[-2000:]
    votes = {i: r["details"]["panel"][0] for i, r in records(panel).items()}
    assert votes["q4"]["tie"] is True and votes["q2"]["value"] == "yes"
    assert json.loads((panel / "relevance.json").read_text())["mean"] == PANEL_MEAN
    agreement = groundcover(plugin, "agreement", str(panel), "--json")
    assert agreement.returncode == 0, agreement.stderr[-2000:]
    assert "relevance" in agreement.stdout and "kappa" in agreement.stdout

    # report (with the HTML page) and compare read both runs with no model asked
    page = tmp_path / "page.html"
    shown = groundcover(plugin, "report", str(single), "--html", str(page))
    assert shown.returncode == 0 and "Answer relevance" in shown.stdout, shown.stderr[-2000:]
    assert "relevance" in page.read_text()
    compared = groundcover(plugin, "compare", str(single), str(panel))
    assert compared.returncode == 0 and "0.625" in compared.stdout, compared.stderr[-2000:]
    assert len(judge.calls) == calls + 3 * 4

    # the Python API finds it by the same entry point, and the finished run answers from disk
    items = str(EXAMPLE / "items.jsonl")
    api = (
        "import groundcover, json\n"
        f"done = groundcover.evaluate('relevance', options={{'input': {items!r}}},"
        f" evaluator={{'model': 'j1', 'endpoint': {plugin['url']!r}}},"
        f" run={{'run_dir': {str(single)!r}}})\n"
        "print(json.dumps(done.only.tables['mean']))"
    )
    by_api = subprocess.run(
        [sys.executable, "-c", api], capture_output=True, text=True, env=plugin["env"]
    )
    assert by_api.returncode == 0, by_api.stderr[-2000:]
    assert json.loads(by_api.stdout.strip().splitlines()[-1]) == SINGLE_MEAN
    assert len(judge.calls) == calls + 3 * 4  # resumed: every item was already recorded


def test_a_plugin_that_fails_to_import_is_one_warning_and_the_rest_load(plugin, tmp_path):
    broken = tmp_path / "site"
    dist = broken / "broken_metric-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-metric\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[groundcover.frameworks]\nbroken = broken_metric:METRIC\n"
    )
    (broken / "broken_metric.py").write_text("import no_such_module_anywhere\n")
    env = plugin["env"] | {"PYTHONPATH": f"{broken}{os.pathsep}{plugin['site']}"}
    done = subprocess.run(
        [sys.executable, "-m", "groundcover", "eval", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "broken" in line]
    assert len(warnings) == 1 and "no_such_module_anywhere" in warnings[0], done.stderr
    assert "relevance" in done.stdout and "garage" in done.stdout


def test_a_wheel_installs_one_top_level_name(tmp_path):
    """``pip install groundcover`` adds ``groundcover`` and nothing else to site-packages: the
    design's folders travel inside it."""
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "-w", str(tmp_path), str(ROOT)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (wheel,) = tmp_path.glob("groundcover-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"groundcover"}
    for folder in ("serving", "retrieval", "index_build", "pipelines"):
        assert f"groundcover/{folder}/__init__.py" in names
    assert any(n.startswith("groundcover/pipelines/garage/prompts/") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[groundcover.frameworks]" in text and "garage = groundcover.pipelines.garage" in text


# ---- a framework run from its file, as docs/write-a-framework.md writes it ---------------------


def docs_blocks() -> list[str]:
    """The Python blocks of docs/write-a-framework.md, in order: the framework file, its test."""
    text = (ROOT / "docs" / "write-a-framework.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_a_framework_file_from_the_docs_runs_with_eval_and_evaluate(plugin, tmp_path):
    """The docs' file copied as it stands: `groundcover eval FILE.py` against the HTTP judge
    (j1: yes, yes, no, partly -> 1, 1, 0, 0.5), its digest in the run's identity, `report`
    reading it back from the file, an edited file refused as another run, `--drivers`
    refused in one line; then the docs' own test through `evaluate(obj)` and the scripted
    judge of `groundcover.testing`."""
    code, test = docs_blocks()[:2]
    metric = tmp_path / "my_metric.py"
    metric.write_text(code)
    env = os.environ | {"GROUNDCOVER_HOME": str(tmp_path / "home")}  # not the installed example
    items = str(EXAMPLE / "items.jsonl")
    run_dir = tmp_path / "run"
    args = [str(metric), items, "--model", "j1", "--endpoint", plugin["url"], "--quiet"]

    def groundcover_here(*extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "groundcover", *extra]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    done = groundcover_here("eval", *args, "--run-dir", str(run_dir), "--no-cache")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "runs from" in done.stderr and "the same command resumes it" in done.stderr
    found = records(run_dir)
    assert {i: r["score"] for i, r in found.items()} == {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 0.5}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    digest = __import__("hashlib").sha256(metric.read_bytes()).hexdigest()
    assert manifest["source"]["sha256"] == digest == manifest["config"]["framework_sha256"]
    report = groundcover_here("report", str(run_dir), "--json")
    assert report.returncode == 0, report.stderr[-2000:]
    assert json.loads(report.stdout.splitlines()[0])["tables"]["mean"] == 0.625
    metric.write_text(code + "\n# edited\n")
    again = groundcover_here("eval", *args, "--run-dir", str(run_dir), "--no-cache")
    assert again.returncode == 2 and "changed" in again.stderr
    spread = groundcover_here("eval", *args, "--run-dir", str(tmp_path / "d"), "--drivers", "2")
    assert spread.returncode == 2 and "install it as a package" in spread.stderr
    assert len(spread.stderr.strip().splitlines()) == 1
    missing = groundcover_here("eval", str(tmp_path / "nothing.py"), items)
    assert missing.returncode == 2 and "no such framework file" in missing.stderr
    # the docs' test, as written, through evaluate(obj) with groundcover.testing's judge
    from groundcover.pipelines.runtime.contract.plugins import from_file

    metric.write_text(code)
    _, found_object = from_file(str(metric))
    namespace = {"RELEVANCE": found_object}
    exec(compile(test, "write-a-framework.md", "exec"), namespace)  # noqa: S102 - our own docs
    (tmp_path / "api").mkdir()
    namespace["test_relevance_by_hand"](tmp_path / "api")


def test_the_example_packages_own_test_passes_with_the_public_scripted_judge(plugin, tmp_path):
    """``examples/answer-relevance/test_answer_relevance.py``, run by pytest where the example is
    installed: a framework author's exact-score test with ``groundcover.testing``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir"]
    command += [str(tmp_path), str(EXAMPLE / "test_answer_relevance.py")]
    done = subprocess.run(command, capture_output=True, text=True, env=plugin["env"], timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-1000:]
    assert "1 passed" in done.stdout
