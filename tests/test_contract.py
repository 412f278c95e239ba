"""The runtime contract between frameworks and the runtime: records parsed once for the tables,
stages asked only through ItemContext, options that change scores in the run identity, one
definition of "not scored", comprehensiveness rules in one object, max_reasks declared, and
hostile input (deep nesting) refused in one line."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from dataclasses import FrozenInstanceError
from pathlib import Path

import httpx
import jinja2
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure, not_scored

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORK_PACKAGES = [
    p for p in (ROOT / "pipelines").iterdir() if p.is_dir() and (p / "__init__.py").is_file()
]


def cli(args: list[str]):
    return CliRunner().invoke(app, args)


# ---- aggregate gets the records parsed once ------------------------------------------------------


def crux_record(i: int, status: str = "ok") -> ItemResult:
    details = {"cov": 0.5, "alpha_ndcg": 0.4, "den": 0.9, "unrated": 1, "rated": []}
    return ItemResult(id=f"t{i}", status=status, score=0.5, explanation="by hand", details=details)


def test_tables_parse_each_record_once(tmp_path, monkeypatch):
    """CRUX's aggregate makes many passes over the records; each record is read once."""
    import groundcover.pipelines.runtime.store.run_dir as runstore
    from groundcover.pipelines.crux.framework import CruxOptions
    from groundcover.pipelines.reports.report import load_outcome

    store = runstore.RunStore(tmp_path)
    options = CruxOptions(
        input=tmp_path / "run.trec", topics=tmp_path / "t.jsonl", passages=tmp_path / "p.jsonl"
    )
    store.open(
        framework="crux", task="crux", config={}, options=options.model_dump(mode="json"), items=3
    )
    for i in range(3):
        store.append(crux_record(i))
    store.close()
    parsed = []
    original = runstore._parse_record
    monkeypatch.setattr(runstore, "_parse_record", lambda *a: parsed.append(1) or original(*a))
    outcome = load_outcome(tmp_path)
    assert outcome.tables["cov"] == 0.5 and outcome.tables["topics"] == 3
    assert len(parsed) == 3


# ---- frameworks ask through ItemContext only ----------------------------------------------------


def _context_internals(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        on_ctx = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if on_ctx and node.value.id == "ctx" and node.attr in ("meter", "client", "clients"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: ctx.{node.attr}")
    return found


def test_no_framework_touches_the_client_or_the_meter():
    offenders = [
        hit
        for package in FRAMEWORK_PACKAGES
        for path in package.rglob("*.py")
        for hit in _context_internals(path)
    ]
    assert offenders == []


def test_frameworks_do_not_import_each_other():
    """What one framework gives another lives in ``pipelines.shared``: a framework imports no
    other framework's package (so each can move, or be dropped, alone)."""
    frameworks = _built_in_frameworks()
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for name in frameworks
        for path in (ROOT / "pipelines" / name).rglob("*.py")
        for line, module in _imports(path)
        for other in frameworks
        if other != name
        and (
            module == f"groundcover.pipelines.{other}"
            or module.startswith(f"groundcover.pipelines.{other}.")
        )
    ]
    assert "shared" not in frameworks
    assert offenders == []


async def test_a_failed_stage_is_recorded_once_the_calls_beside_it_have_ended():
    """One stage stays unparseable while another, asked beside it (``gather``), is still being
    answered: the item is recorded after that answer came back, with what it added to the
    details; nothing is left running into a record already written."""
    import asyncio

    from groundcover.pipelines.runtime.contract.context import ItemContext
    from groundcover.pipelines.runtime.execution.solve import solve_item
    from groundcover.serving.templates import REASK
    from tests.support.scripted import ScriptedClient

    class SlowToAnswer(ScriptedClient):
        async def _request(self, model, messages, body, usage, *, stage, template):
            if stage == "slow":
                await asyncio.sleep(0.3)
            return await super()._request(
                model, messages, body, usage, stage=stage, template=template
            )

    values = {"error": "e", "expected": "n"}

    class Beside:
        async def solve(self, item, ctx):
            async def slow():
                parsed = await ctx.ask(REASK, "slow", int, "a number", values)
                ctx.details["slow"] = parsed.value

            await asyncio.gather(ctx.ask(REASK, "fast", int, "a number", values), slow())

    client = SlowToAnswer({"fast": "not a number", "slow": "7"})
    ctx = ItemContext("i", client, None, max_reasks=0)
    result = await solve_item(Beside(), None, ctx)
    assert result.status == "unparseable" and result.failure.stage == "fast"
    assert result.details == {"slow": 7}
    assert result.usage["slow"]["calls"] == 1


async def test_attempt_returns_what_ask_raises_and_account_counts():
    from groundcover.pipelines.runtime.contract.context import ItemContext
    from groundcover.pipelines.runtime.contract.results import StageFailed
    from groundcover.serving.templates import REASK
    from tests.support.scripted import ScriptedClient

    client = ScriptedClient({"rate": ["x", "y", "z", "w"]})
    ctx = ItemContext("i", client, None, max_reasks=1)
    parsed = await ctx.attempt(REASK, "rate", int, "a number", {"error": "e", "expected": "n"})
    assert parsed.status == "unparseable" and parsed.outputs == ["x", "y"]
    with pytest.raises(StageFailed):
        await ctx.ask(REASK, "rate", int, "a number", {"error": "e", "expected": "n"})
    ctx.account("nli-cross-encoder", 7)
    ctx.account("nli-cross-encoder", 3)
    assert ctx.usage()["nli-cross-encoder"]["calls"] == 10
    assert ctx.usage()["rate"]["calls"] == 4


# ---- options that change scores identify the run -------------------------------------------------


def test_crux_tokenizer_is_part_of_the_run_identity(tmp_path):
    from groundcover.pipelines.crux.framework import CRUX, CruxOptions

    base = {"input": tmp_path / "r", "topics": tmp_path / "t", "passages": tmp_path / "p"}
    words = CRUX.identity(CruxOptions(**base))
    llama = CRUX.identity(CruxOptions(**base, tokenizer="meta-llama/Llama-3.1-70B-Instruct"))
    assert words != llama


# ---- one definition of "not scored" -------------------------------------------------------------

FAILURE = StageFailure(stage="s", error="e")


def mixed(details: dict) -> list[ItemResult]:
    return [
        ItemResult(id="a", status="ok", score=1.0, explanation="x", details=details),
        ItemResult(id="b", status="abstained", score=0.0, explanation="x", details=details),
        ItemResult(id="c", status="abstained", score=None, explanation="x", details=details),
        ItemResult(id="d", status="undefined", explanation="x", details=details),
        ItemResult(id="e", status="unparseable", explanation="x", details=details, failure=FAILURE),
        ItemResult(id="f", status="error", explanation="x", details=details, failure=FAILURE),
    ]


def test_not_scored_is_one_definition():
    records = mixed({})
    assert not_scored(records) == {"abstained": 1, "undefined": 1, "unparseable": 1, "error": 1}
    assert not_scored(records, lambda r: 0.0 if r.status == "undefined" else r.score) == {
        "abstained": 1,
        "unparseable": 1,
        "error": 1,
    }


def test_every_frameworks_table_counts_not_scored_the_same_way(tmp_path):
    from groundcover.pipelines.crux.framework import CRUX, CruxOptions
    from groundcover.pipelines.fanoutqa.framework import table_row
    from groundcover.pipelines.garage.framework import summarise
    from groundcover.pipelines.icat.framework import IcatOptions, table3

    garage = {
        "expects_deflection": True,
        "deflected": True,
        "attribution": {"precision": None, "recall": None, "f1": None},
    }
    records = mixed({"setting": "closed-book", "query_id": "q", "system": "s"} | garage)
    expected = not_scored(records)
    assert table_row(records)["not_scored"] == expected
    assert summarise(records)["not_scored"] == expected
    crux = CruxOptions(input=tmp_path / "r", topics=tmp_path / "t", passages=tmp_path / "p")
    assert CRUX.aggregate(records, crux)["not_scored"] == expected
    icat = IcatOptions(
        input=tmp_path / "r", queries=tmp_path / "q", snippets=tmp_path / "s", nli_model="x"
    )
    assert table3(records, icat)["s"]["not_scored"] == expected


# ---- comprehensiveness rules live in one object -------------------------------------------------


def test_comprehensiveness_rules_are_one_frozen_object_per_protocol():
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.rules import rules_for

    paper = ComprehensivenessOptions(protocol="paper")
    assert paper.rules is ComprehensivenessOptions(protocol="paper").rules is rules_for("paper")
    with pytest.raises(FrozenInstanceError):
        paper.rules.summarisation = False  # type: ignore[misc]
    spec = ComprehensivenessOptions(protocol="spec").rules
    differing = {k for k, v in paper.rules.as_dict().items() if spec.as_dict()[k] != v}
    assert differing == set(paper.rules.as_dict())  # every rule is one the protocols choose
    assert ComprehensivenessOptions(protocol="spec", summarise=True).rules.summarisation


def test_no_comprehensiveness_code_asks_the_protocol_by_name():
    pattern = re.compile(r"protocol\s*[!=]=|\bpaper\(|\bsummarises\(|is_paper")
    package = ROOT / "pipelines" / "comprehensiveness"
    hits = [
        f"{path.name}:{n}"
        for path in package.glob("*.py")
        if path.name != "rules.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_docs_protocol_table_names_every_rule():
    from groundcover.pipelines.comprehensiveness.rules import Rules

    readme = (ROOT / "docs" / "comprehensiveness.md").read_text()
    table = readme[readme.index("| rule (field of `Rules`) |") :]
    table = table[: table.index("\n\n")]
    for name in Rules.__dataclass_fields__:
        if name != "protocol":
            assert f"`{name}`" in table, name


# ---- max_reasks is a declared option ----------------------------------------------------------


def test_every_framework_declares_max_reasks():
    from groundcover.pipelines.runtime.contract.plugins import studies
    from groundcover.pipelines.runtime.contract.protocol import Framework, FrameworkOptions

    frameworks = [s for s in studies().values() if isinstance(s, Framework)]
    assert len(frameworks) >= 9
    for fw in frameworks:
        assert issubclass(fw.Options, FrameworkOptions), fw.name
        assert "max_reasks" in fw.Options.model_fields, fw.name


def test_max_reasks_from_yaml_reaches_the_stage(tmp_path):
    """GaRAGe had no max_reasks: the YAML key was refused; now it bounds the re-asks."""
    from groundcover.pipelines.cli.options import Shared, load_request
    from groundcover.pipelines.garage.framework import GARAGE
    from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
    from tests.support.scripted import ScriptedClient

    config = tmp_path / "c.yaml"
    config.write_text(
        "garage:\n  max_reasks: 0\nevaluator:\n  endpoint: http://127.0.0.1:9/v1\n  model: m\n"
    )
    records = ROOT / "examples" / "garage.jsonl"
    request = load_request(
        GARAGE, {"input": records, "limit": 1}, Shared(config=config, run_dir=tmp_path / "run")
    )
    assert request.options.max_reasks == 0
    client = ScriptedClient(
        {
            "answer": "It is 330 m tall [1].",
            "deflection": "attempted",
            "eligibility": "not a label",
        },
        check_constraints=False,
    )
    request.run.cache = None
    [outcome] = execute(
        GARAGE, request, quiet=True, open_client=lambda ev, d: fixed_client(client)
    ).values()
    assert outcome.results[0].status == "unparseable"
    assert len(client.stage_calls("eligibility")) == 1  # no re-ask


# ---- hostile input: one line, exit 2 ------------------------------------------------------------


def test_deeply_nested_inputs_are_one_line(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    jsonl = tmp_path / "deep.jsonl"
    jsonl.write_text('{"id": "a", "question": "q", "deep": ' + deep + "}\n")
    result = cli(["generate", str(jsonl), "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "deep.jsonl:1: JSON nested too deeply" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    fanout = tmp_path / "deep.json"
    fanout.write_text(deep)
    result = cli(["eval", "fanoutqa", "--data", str(fanout), "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "JSON nested too deeply" in result.output
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d", "contents": ' + deep + "}\n")
    result = cli(["index", "build", str(corpus), str(tmp_path / "idx")])
    assert result.exit_code == 2 and "JSON nested too deeply" in result.output
    config = tmp_path / "deep.yaml"
    config.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = cli(["generate", str(jsonl), "--config", str(config)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


# ---- view off loopback needs a key ------------------------------------------------------------


def test_view_off_loopback_needs_a_key(tmp_path):
    run_dir = tmp_path / "run"
    from groundcover.pipelines.runtime.store.run_dir import RunStore

    store = RunStore(run_dir)
    store.open(
        framework="generate",
        task="generate",
        config={},
        options={"input": "x"},
        models={},
        prompts={},
        items=0,
    )
    result = cli(["view", str(run_dir), "--host", "0.0.0.0", "--port", "0"])
    assert result.exit_code == 2 and "--api-key-env" in result.output
    env = os.environ | {"VIEW_KEY": "s3cret"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "groundcover",
            "view",
            str(run_dir),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--api-key-env",
            "VIEW_KEY",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        line = ""
        deadline = time.time() + 60
        while "report at" not in line and time.time() < deadline:
            line += process.stderr.readline()  # type: ignore[union-attr]
        port = int(re.search(r":(\d+)/", line).group(1))  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(url, auth=("anyone", "s3cret")).status_code == 200  # a browser's login
    finally:
        process.terminate()
        process.wait(10)


def test_prompt_bodies_are_compiled_once_and_render_as_before(tmp_path):
    """A template body is compiled once per process (compiling took most of a trivial item's
    time: scripts/benchmarks/bench_runner.py); each render still sees only its own values."""
    from groundcover.serving import templates

    path = tmp_path / "t.yaml"
    path.write_text("name: t\nversion: 1\nsystem: 'Judge {{ who }}.'\nuser: 'Q: {{ q }}'\n")
    template = templates.PromptTemplate.load(path)
    templates.compiled.cache_clear()
    first = template.messages(who="fairly", q="one")
    second = template.messages(who="strictly", q="two")
    assert first == [
        {"role": "system", "content": "Judge fairly."},
        {"role": "user", "content": "Q: one"},
    ]
    assert second[1] == {"role": "user", "content": "Q: two"}
    assert templates.compiled.cache_info().misses == 2  # system and user, compiled once each
    assert templates.compiled.cache_info().hits == 2
    with pytest.raises(jinja2.UndefinedError):  # a missing value still fails loudly
        template.messages(who="x")


# ---- one public face: the built-in frameworks import the runtime only through it ---------------

LIBRARIES = ("groundcover.serving", "groundcover.retrieval", "groundcover.index_build")


def _built_in_frameworks() -> list[str]:
    from groundcover.pipelines.runtime.contract.plugins import BUILT_IN, plugins

    return [p.value.split(".")[2] for p in plugins() if p.distribution == BUILT_IN]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import, a relative one resolved to its installed name (the
    repository's root is the package ``groundcover``)."""
    here = ["groundcover", *path.resolve().relative_to(ROOT).parts[:-1]]
    if here[1] == "groundcover":  # groundcover/__init__.py itself
        here = here[1:]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - node.level + 1]
            found.append((node.lineno, ".".join([*base, *filter(None, [node.module])])))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_built_in_frameworks_import_the_runtime_only_through_the_public_face():
    """A framework may import ``groundcover`` (the face), the serving and retrieval libraries, its
    own package and the code frameworks share (``pipelines.shared``); never ``pipelines.runtime``,
    the CLI, reports or datasets."""
    import groundcover

    frameworks = _built_in_frameworks()
    assert {"comprehensiveness", "crux", "fanoutqa", "garage", "icat"} <= set(frameworks)
    themes = tuple(f"groundcover.{t}" for t in groundcover._THEMES)  # the face, by theme
    allowed = (
        "groundcover",
        *themes,
        *LIBRARIES,
        "groundcover.pipelines.shared",
        *(f"groundcover.pipelines.{f}" for f in frameworks),
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for name in frameworks
        for path in (ROOT / "pipelines" / name).rglob("*.py")
        for line, module in _imports(path)
        if module.split(".")[0] in ("groundcover", "pipelines", "serving", "retrieval")
        and module not in ("groundcover", *themes)
        and not any(module == a or module.startswith(a + ".") for a in allowed[1:])
    ]
    assert offenders == []


def test_no_module_imports_the_folders_by_their_repository_names():
    """Installed, the folders live under ``groundcover``: ``import serving`` works only in a
    checkout, so no module of ours may rely on it."""
    tops = ("serving", "retrieval", "index_build", "pipelines")
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for folder in (*tops, "scripts", "tests", "groundcover")
        for path in (ROOT / folder).rglob("*.py")
        if folder == "groundcover" or not path.is_relative_to(ROOT / "groundcover")
        for line, module in _imports(path)
        if module.split(".")[0] in tops
    ]
    assert offenders == []


def test_every_public_name_loads_and_importing_the_face_loads_no_runtime():
    import groundcover

    assert sorted(groundcover._PUBLIC) == groundcover.__all__
    for name in groundcover.__all__:
        assert getattr(groundcover, name) is not None, name
    # the type checkers' names are the table's: one list, held equal here
    tree = ast.parse((ROOT / "groundcover" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    checked = {alias.name for node in block.body for alias in node.names}  # type: ignore[attr-defined]
    assert checked == set(groundcover._PUBLIC)
    assert len(groundcover.__all__) <= 26  # what a framework author needs; the rest by theme
    probe = "import sys, groundcover; print(sorted(m for m in sys.modules if 'runtime' in m))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-1000:]


def test_the_face_by_theme_and_help_shows_each_classs_own_docstring():
    """About two dozen names at the root, the rest in public modules by theme; each public
    class documents itself (``help(groundcover.Framework)`` is not ``typing.Generic``'s), and
    the framework's documentation names every hook it has."""
    import importlib
    import inspect

    import groundcover

    modules = [
        groundcover,
        *(importlib.import_module(f"groundcover.{t}") for t in groundcover._THEMES),
    ]
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value):
                assert (value.__dict__.get("__doc__") or "").strip(), f"{module.__name__}.{name}"
    for cls in (groundcover.Framework, groundcover.Study):
        hooks = [k for k in cls.__dict__ if not k.startswith("_")]
        assert [h for h in hooks if f"``{h}" not in (cls.__doc__ or "")] == [], cls
    run_dir_internals = {"MANIFEST", "atomic_write_json", "results_by_id", "cell_text"}
    assert not run_dir_internals & set(groundcover.__all__)
    from groundcover.runs import MANIFEST, atomic_write_json
    from groundcover.testing import ScriptedClient

    assert MANIFEST == "manifest.json" and callable(atomic_write_json) and ScriptedClient
