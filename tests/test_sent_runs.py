"""A run you receive is data. Bundles built here as a sender would build them -- a manifest naming
a planted ``helper.py`` through ``/proc/self/cwd``, through a linked folder, at a path outside
the run with the right SHA-256; a planted ``.pyc`` beside a harmless file the user trusted; the
trusted file swapped between its hash and its load; records naming files outside the run --
are opened by every reader (``report``, its CSV export and page, ``compare``, ``agreement``,
``labels export``, the viewer's page, items and labelling page): the planted code never runs
(it would leave a marker file), nothing that came with the run changes, the run is read from
its records alone, with the line saying how to trust a file. A graph, a study's run or an input
file named outside the run is left out; a link leading out of the run stops every reader. The
legitimate ways still load and show the tables: a file the user trusted (``groundcover trust``,
``groundcover eval FILE.py``), ``--framework FILE``, an installed framework whatever file its
run names. The readers run in this process (``CliRunner``): the
process's state (files given, notes said, modules loaded) is fresh for each test."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import os
import py_compile
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import groundcover
from groundcover.pipelines.cli.main import app
from groundcover.pipelines.runtime.contract import plugins

FIXTURE = Path(__file__).parent / "fixtures" / "frameworks" / "last_week.py"
ANSWERS = {"Paris.": "yes", "Blue, mostly.": "partly", "I like tea.": "no"}  # 1, 0.5, 0
RECORDS_ONLY = "read from its records and summary alone"
HOW_TO_TRUST = "`groundcover trust FILE` or --framework FILE"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def planted(marker: Path) -> str:
    """Code that leaves ``marker`` behind if anything runs it."""
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished run of the one-file framework ``last_week.py`` (scripted judge: 1, 0.5, 0),
    in ``ROOT/run``, the file in ``ROOT/framework``."""
    from groundcover.testing import ScriptedClient, field_of

    root = tmp_path_factory.mktemp("made")
    (root / "framework").mkdir()
    framework = root / "framework" / "last_week.py"
    shutil.copy(FIXTURE, framework)
    _, found = plugins.from_file(str(framework))
    items = root / "items.jsonl"
    rows = [{"id": f"q{k}", "question": f"Q{k}?", "answer": a} for k, a in enumerate(ANSWERS)]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge = ScriptedClient({"last-week": lambda prompt: ANSWERS[field_of(prompt, "Answer")]})
    groundcover.evaluate(
        found,
        options={"input": str(items)},
        client=judge,
        run={"run_dir": str(root / "run"), "cache": None},
    )
    plugins._GIVEN.pop(found.name, None)  # given to make the run, not to read it
    return root


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch, tmp_path) -> Iterator[None]:
    """A trust list of this test's own, and none of the process's files given, notes said or
    file modules loaded (a module already loaded would hide what a load reads)."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(plugins, "_GIVEN", {})
    monkeypatch.setattr(plugins, "_SAID", set())
    loaded = {k: v for k, v in sys.modules.items() if k.startswith("groundcover_file_")}
    for name in loaded:
        del sys.modules[name]
    yield
    for name in [k for k in sys.modules if k.startswith("groundcover_file_")]:
        del sys.modules[name]
    sys.modules.update(loaded)


def cli(*args: object) -> Result:
    plugins._SAID.clear()  # each command says its note again, as a new process does
    return CliRunner().invoke(app, [str(a) for a in args])


def received(made: Path, where: Path) -> Path:
    """A copy of the run as someone sent it: ``where/bundle/run``."""
    run = where / "bundle" / "run"
    shutil.copytree(made / "run", run)
    return run


def name_file(run: Path, file: str, digest: str) -> None:
    """The run's manifest names ``file`` with ``digest`` as its framework file."""
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["source"] |= {"file": file, "sha256": digest}
    (run / "manifest.json").write_text(json.dumps(manifest))


def every_reader(run: Path, out: Path) -> dict[str, Any]:
    """The run opened by each reader; what each gave (a CLI result, or the viewer's pages)."""
    from groundcover.pipelines.reports.pages.report_html import render
    from groundcover.pipelines.reports.pages.viewer import Viewer, label_page

    out.mkdir(exist_ok=True)
    twin = run.parent / "twin"
    if not twin.exists():
        shutil.copytree(run, twin)
    before = contents(run.parent)
    found: dict[str, Any] = {
        "report": cli("report", run, "--json"),
        "export": cli("report", run, "--export", out / "rows.csv", "--html", out / "page.html"),
        "compare": cli("compare", run, twin, "--json", "--resamples", "200"),
        "agreement": cli("agreement", run, "--json"),
        "labels": cli("labels", "export", run, out / "labels.csv"),
    }
    plugins._SAID.clear()
    viewer = Viewer([run])
    found["view"] = (
        render([run], served=True)
        + viewer.page()
        + json.dumps(viewer.items(0, {}))
        + label_page(viewer, 0)
        + json.dumps(viewer.queue(0, "me"))
        + json.dumps([viewer.unit(0, row.id) for row in viewer.state(0).rows])  # item text
    )
    assert contents(run.parent) == before  # opening a run changes nothing that came with it
    return found


def contents(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder``: its content's SHA-256, or where the link points."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[name] = sha256(path)
    return found


def tables_of(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[0])["tables"]


def assert_records_only(readers: dict[str, Any], marker: Path) -> None:
    """No planted code ran, every command succeeded, reading the run from its records with
    the one line saying how to trust a file; the CSV holds the scores, no tables anywhere."""
    assert not marker.exists(), "the planted code ran"
    for name, result in readers.items():
        if name == "view":
            continue
        assert result.exit_code == 0, f"{name}: {result.output}"
        notes = [line for line in result.stderr.splitlines() if RECORDS_ONLY in line]
        assert notes and HOW_TO_TRUST in notes[0], f"{name}: {result.stderr}"
    assert tables_of(readers["report"]) is None
    assert "the judge says partly" in readers["view"]  # the records, shown
    export = readers["export"].stderr
    rows = Path(next(line for line in export.splitlines() if line.startswith("export: "))[8:])
    with rows.open(newline="", encoding="utf-8") as handle:
        scores = {row["id"]: float(row["score"]) for row in csv.DictReader(handle)}
    assert scores == {"q0": 1.0, "q1": 0.5, "q2": 0.0}  # the scores, from the records


def test_a_run_naming_its_file_through_proc_self_cwd_runs_nothing(made, tmp_path, monkeypatch):
    run = received(made, tmp_path / "inbox")
    helper = run.parent / "helper.py"
    marker = tmp_path / "ran"
    helper.write_text(planted(marker))
    name_file(run, "/proc/self/cwd/bundle/helper.py", sha256(helper))
    monkeypatch.chdir(tmp_path / "inbox")  # the reader stands above the bundle
    assert Path("/proc/self/cwd/bundle/helper.py").read_text() == helper.read_text()
    assert_records_only(every_reader(Path("bundle/run"), tmp_path / "out"), marker)


def test_a_run_naming_its_file_through_a_linked_folder_runs_nothing(made, tmp_path):
    run = received(made, tmp_path / "inbox")
    helper = run.parent / "helper.py"
    marker = tmp_path / "ran"
    helper.write_text(planted(marker))
    (tmp_path / "home-link").symlink_to(run.parent, target_is_directory=True)
    name_file(run, str(tmp_path / "home-link" / "helper.py"), sha256(helper))
    assert_records_only(every_reader(run, tmp_path / "out"), marker)


def test_a_file_outside_the_run_with_its_recorded_sha256_is_not_trusted_by_that(made, tmp_path):
    run = received(made, tmp_path / "inbox")
    elsewhere = tmp_path / "shared" / "helper.py"  # a path the sender knows, on a shared disk
    elsewhere.parent.mkdir()
    marker = tmp_path / "ran"
    elsewhere.write_text(planted(marker))
    name_file(run, str(elsewhere), sha256(elsewhere))
    assert_records_only(every_reader(run, tmp_path / "out"), marker)
    said = cli("report", run).stderr
    assert "no file of its SHA-256 is in your trust list" in said


def test_the_path_a_run_names_is_never_read_even_with_the_sha256_of_a_trusted_file(made, tmp_path):
    """The user trusts their own file; a sent run names its SHA-256 but a planted path: the
    trusted file loads from where the user trusted it, the planted one is never read."""
    mine = made / "framework" / "last_week.py"
    assert cli("trust", mine).exit_code == 0
    run = received(made, tmp_path / "inbox")
    helper = run.parent / "helper.py"
    marker = tmp_path / "ran"
    helper.write_text(planted(marker))
    name_file(run, str(helper), sha256(mine))
    readers = every_reader(run, tmp_path / "out")
    assert not marker.exists()
    assert tables_of(readers["report"])["mean"] == 0.5
    assert all(RECORDS_ONLY not in r.stderr for k, r in readers.items() if k != "view")


def trusted_bundle(made: Path, where: Path) -> tuple[Path, Path]:
    """A bundle whose ``helper.py`` is the harmless framework file (its run's SHA-256), named
    at its own path, and which the user read and trusted (``groundcover trust``)."""
    run = received(made, where)
    helper = run.parent / "helper.py"
    shutil.copy(made / "framework" / "last_week.py", helper)
    name_file(run, str(helper), sha256(helper))
    trusted = cli("trust", helper)
    assert trusted.exit_code == 0 and sha256(helper) in trusted.stdout, trusted.output
    return run, helper


def test_a_planted_pyc_beside_a_trusted_file_never_runs(made, tmp_path):
    run, helper = trusted_bundle(made, tmp_path / "inbox")
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(planted(marker))
    cached = Path(importlib.util.cache_from_source(str(helper)))
    cached.parent.mkdir()
    # a hash-based pyc that is never checked against its source: Python's import runs it as is
    py_compile.compile(
        str(evil),
        cfile=str(cached),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    readers = every_reader(run, tmp_path / "out")
    assert not marker.exists(), "the planted .pyc ran"
    assert tables_of(readers["report"])["mean"] == 0.5  # the .py itself, loaded
    assert os.listdir(cached.parent) == [cached.name]  # nothing read or written there by us


class Opens:
    """Every open of one file in this process, seen by an audit hook (which cannot be removed:
    it does nothing once ``path`` is None). ``swap_on``: on that open, before it happens, the
    file's bytes become ``swap_to`` -- a sender's file changed between its hash and its load."""

    path: str | None = None
    count = 0
    swap_on = 0
    swap_to = b""
    _busy = False

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or cls.path is None or cls._busy or not args:
            return
        if not isinstance(args[0], str | Path) or os.fspath(args[0]) != cls.path:
            return
        cls.count += 1
        if cls.count == cls.swap_on:
            cls._busy = True
            try:
                Path(cls.path).write_bytes(cls.swap_to)
            finally:
                cls._busy = False


@pytest.fixture
def opens() -> Iterator[type[Opens]]:
    if not getattr(Opens, "installed", False):
        sys.addaudithook(Opens.hook)
        Opens.installed = True  # type: ignore[attr-defined]
    Opens.count, Opens.swap_on, Opens.swap_to = 0, 0, b""
    yield Opens
    Opens.path = None


def test_what_was_hashed_is_what_runs_read_once_compiled_from_those_bytes(made, tmp_path, opens):
    """A load opens the trusted file once: the bytes hashed are the bytes compiled. A file
    swapped after that open is never run: the next load hashes the new bytes and refuses them."""
    run, helper = trusted_bundle(made, tmp_path / "inbox")
    marker = tmp_path / "ran"
    opens.path = str(helper)
    opens.swap_on, opens.swap_to = 2, planted(marker).encode()  # a swap after the first read
    first = cli("report", run, "--json")
    assert tables_of(first)["mean"] == 0.5 and opens.count == 1  # read once, and loaded
    assert not (helper.parent / "__pycache__").exists()  # no bytecode written for it
    readers = every_reader(run, tmp_path / "out")
    assert not marker.exists(), "the swapped-in bytes ran"
    assert helper.read_bytes() == planted(marker).encode()  # the swap did happen
    assert tables_of(readers["report"]) is None  # the changed file is not loaded
    assert "no longer has that SHA-256" in readers["report"].stderr


def test_the_folder_of_a_framework_file_is_not_on_the_import_path(made, tmp_path):
    """A module planted beside a trusted file is not what its imports find."""
    run, helper = trusted_bundle(made, tmp_path / "inbox")
    marker = tmp_path / "ran"
    (helper.parent / "pydantic.py").write_text(planted(marker))  # shadowing what it imports
    assert tables_of(cli("report", run, "--json"))["mean"] == 0.5
    assert not marker.exists() and str(helper.parent) not in sys.path


def test_a_file_trusted_named_or_run_by_the_user_loads_and_revoked_stops_at_once(made, tmp_path):
    mine = made / "framework" / "last_week.py"
    run = received(made, tmp_path / "inbox")  # the user's own run, moved: its record as made
    assert tables_of(cli("report", run, "--json")) is None  # not trusted on this machine yet
    # --framework FILE: for this command only; with --trust, kept
    named = cli("report", run, "--json", "--framework", mine)
    assert tables_of(named)["mean"] == 0.5 and RECORDS_ONLY not in named.stderr
    plugins._GIVEN.clear()  # the next command is another process
    assert "no trusted framework files" in cli("trust", "--list").stdout
    assert cli("report", run, "--trust").exit_code == 2  # --trust of no --framework file
    kept = cli("labels", "export", run, tmp_path / "l.csv", "--framework", mine, "--trust")
    assert kept.exit_code == 0, kept.output
    plugins._GIVEN.clear()
    listed = cli("trust", "--list").stdout
    assert sha256(mine) in listed and str(mine) in listed
    readers = every_reader(run, tmp_path / "out")
    assert tables_of(readers["report"])["mean"] == 0.5
    for name, result in readers.items():
        if name != "view":
            assert result.exit_code == 0 and RECORDS_ONLY not in result.stderr, name
    assert "Q1?" in readers["view"]  # item text: the framework read the run's inputs
    with open(tmp_path / "out" / "rows.csv", encoding="utf-8") as rows:
        assert "Q1?" in rows.read()
    # revoked by its SHA-256: the next open reads the run from its records again
    revoked = cli("trust", "--revoke", sha256(mine))
    assert revoked.exit_code == 0 and "revoked" in revoked.stdout
    assert tables_of(cli("report", run, "--json")) is None
    assert cli("trust", "--revoke", mine).exit_code == 2  # nothing left to revoke
    # `groundcover eval FILE.py` trusts the file it runs (the user ran it)
    assert cli("eval", mine, "--help").exit_code == 0
    plugins._GIVEN.clear()
    assert tables_of(cli("report", run, "--json"))["mean"] == 0.5
    assert cli("trust", "--revoke", mine).exit_code == 0  # by its path, as trusted
    assert tables_of(cli("report", run, "--json")) is None


def test_an_installed_framework_is_the_packages_whatever_file_its_run_names(tmp_path):
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_report_html import ITEMS, OUTPUTS

    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    client = ScriptedClient(
        {"coverage": lambda p: OUTPUTS[field_of(p, "Answer")]}, check_constraints=False
    )
    options = {"input": data, "method": "e2e", "summarise": False, "export_graphs": False}
    done = groundcover.evaluate(
        "comprehensiveness",
        options=options,
        run={"run_dir": tmp_path / "bundle" / "run", "cache": None},
        client=client,
    )
    helper = tmp_path / "bundle" / "helper.py"
    marker = tmp_path / "ran"
    helper.write_text(planted(marker))
    manifest = json.loads((done.run_dir / "manifest.json").read_text())
    manifest["source"] = {"file": str(helper), "object": "COMPREHENSIVENESS"}
    manifest["source"]["sha256"] = sha256(helper)
    (done.run_dir / "manifest.json").write_text(json.dumps(manifest))
    readers = every_reader(done.run_dir, tmp_path / "out")
    assert not marker.exists()
    assert "Where?" in readers["view"]  # item text: the installed framework read the inputs
    for name, result in readers.items():
        if name != "view":
            assert result.exit_code == 0 and RECORDS_ONLY not in result.stderr, name


def with_graph_files(run: Path, names: dict[str, str]) -> None:
    """The run's records name a fact graph's node-link file each (``id -> name``)."""
    lines = (run / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records:
        if record["id"] in names:
            record["details"]["graph_files"] = {"node_link": names[record["id"]]}
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def node_link(text: str) -> str:
    node = {"id": "r1", "source": "response", "status": "response", "component": "r1"}
    return json.dumps({"nodes": [node | {"text": text}], "edges": []})


def test_files_a_record_names_are_read_only_from_inside_its_run(made, tmp_path):
    """A graph file named by absolute path outside the run, or by a relative one climbing out
    of it, is left out with a note (on the page and in the viewer); one inside is drawn."""
    from groundcover.pipelines.reports.pages.report_html import render
    from groundcover.pipelines.reports.pages.viewer import Viewer

    run = received(made, tmp_path / "inbox")
    secret = tmp_path / "secret.json"
    secret.write_text(node_link("SECRET-NODE"))
    (run / "graphs").mkdir()
    (run / "graphs" / "own.json").write_text(node_link("OWN-NODE"))
    names = {"q0": str(secret), "q1": "../../../secret.json", "q2": str(run / "graphs/own.json")}
    assert (run / names["q1"]).resolve() == secret
    with_graph_files(run, names)
    page = render([run])
    assert "SECRET-NODE" not in page and "OWN-NODE" in page
    assert page.count("fact graph left out") == 2
    exported = cli("report", run, "--html", tmp_path / "page.html")
    assert exported.exit_code == 0, exported.output
    assert "SECRET-NODE" not in (tmp_path / "page.html").read_text()
    viewer = Viewer([run])
    assert viewer.item(0, "q0")["graph"] == {
        "nodes": [],
        "edges": [],
        "note": f"fact graph left out: {secret} is not a file inside the run directory",
    }
    assert viewer.item(0, "q1")["graph"]["nodes"] == []
    assert viewer.item(0, "q2")["graph"]["nodes"][0]["text"] == "OWN-NODE"
    items = json.dumps(viewer.items(0, {}))
    assert "SECRET-NODE" not in items and "OWN-NODE" in items


def test_a_study_record_names_only_runs_inside_its_root(made, tmp_path):
    """A study root's runs are read only from inside it: a key leading out (``..``, an
    absolute path, a link) is left out with a note; the run inside is reported."""
    root = tmp_path / "study"
    root.mkdir()
    shutil.copytree(made / "run", root / "inner")
    victim = tmp_path / "victim"
    shutil.copytree(made / "run", victim)
    (root / "link").symlink_to(victim, target_is_directory=True)
    helper = tmp_path / "helper.py"
    marker = tmp_path / "ran"
    helper.write_text(planted(marker))
    source = {"file": str(helper), "object": "X", "sha256": sha256(helper)}
    keys = ["inner", "../victim", str(victim), "link"]
    study = {"format_version": 2, "study": "last-week", "runs": keys, "source": source}
    (root / "study.json").write_text(json.dumps(study))
    shown = cli("report", root, "--json")
    assert shown.exit_code == 0, shown.output
    reported = [json.loads(line).get("run") for line in shown.stdout.splitlines()]
    assert [run for run in reported if run] == [str(root / "inner")]
    left_out = [line for line in shown.stderr.splitlines() if "names a run outside it" in line]
    assert len(left_out) == 3 and not marker.exists()
    page = cli("report", root, "--html", tmp_path / "page.html")
    assert page.exit_code == 0, page.output
    assert str(victim) not in (tmp_path / "page.html").read_text()


def test_the_trust_list_is_never_read_or_written_through_a_link_and_is_the_users_alone(
    made, tmp_path
):
    from groundcover.pipelines.runtime.contract.trust import trust_list

    mine = made / "framework" / "last_week.py"
    assert cli("trust", mine).exit_code == 0
    listed = trust_list()
    assert listed.stat().st_mode & 0o777 == 0o600
    entry = json.loads(listed.read_text())["trusted"][0]
    assert entry["path"] == str(mine) and entry["sha256"] == sha256(mine) and entry["when"]
    # a list another user may write is not read (nor is the file loaded)
    listed.chmod(0o622)
    refused = cli("trust", "--list")
    assert refused.exit_code == 2 and "another user may write it" in refused.output
    listed.chmod(0o600)
    # a link at the list's place: neither read nor written through
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(listed.read_text())
    listed.unlink()
    listed.symlink_to(elsewhere)
    assert cli("trust", "--list").exit_code == 2
    before = elsewhere.read_text()
    assert cli("trust", made / "items.jsonl").exit_code == 2
    assert elsewhere.read_text() == before and listed.is_symlink()
    listed.unlink()
    # a short or upper-case digest is no SHA-256: only the full one matches
    assert cli("trust", mine).exit_code == 0
    assert cli("trust", "--revoke", sha256(mine)[:12]).exit_code == 2
    assert plugins.trusted_study("last-week", {"sha256": sha256(mine)[:63]}) == (
        "the run records no SHA-256 of it"
    )
    # its lock a link: refused, nothing written through it
    lock = listed.with_name(f".{listed.name}.lock")
    lock.unlink()
    lock.symlink_to(elsewhere)
    locked = cli("trust", "--revoke", mine)
    assert locked.exit_code == 2 and "cannot be locked" in locked.output
    assert elsewhere.read_text() == before


def test_a_runs_own_fact_graphs_are_recorded_inside_it_and_drawn_wherever_it_moves(tmp_path):
    from groundcover.pipelines.reports.pages.viewer import Viewer
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, QA_SCRIPTS

    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps(ITEM.model_dump() | {"id": "a"}) + "\n")
    done = groundcover.evaluate(
        "comprehensiveness",
        options={"input": items, "protocol": "spec", "method": "qa"},
        run={"run_dir": tmp_path / "run", "cache": None},
        client=ScriptedClient(QA_SCRIPTS),
    )
    recorded = done.results[0].details["graph_files"]
    assert recorded == {"node_link": "graphs/a.json", "graphml": "graphs/a.graphml"}
    moved = tmp_path / "sent" / "run"  # as it arrives elsewhere
    shutil.move(tmp_path / "run", moved)
    graph = Viewer([moved]).item(0, "a")["graph"]
    assert graph["nodes"] and "note" not in graph
    assert {node["status"] for node in graph["nodes"]} >= {"response", "uncovered"}


def test_input_files_a_run_names_without_their_sha256_are_not_read(made, tmp_path):
    """A run recording no SHA-256 of its inputs (as one made before they were fingerprinted, or
    one sent without them) names files nothing holds to their content: none is read into the
    rows or the page, even with the framework loaded."""
    from groundcover.pipelines.reports.pages.viewer import Viewer

    run = received(made, tmp_path / "inbox")
    private = tmp_path / "private.jsonl"
    rows = [{"id": f"q{k}", "question": f"SECRET-{k}", "answer": "x"} for k in range(3)]
    private.write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["inputs"]
    manifest["options"]["input"] = str(private)
    (run / "manifest.json").write_text(json.dumps(manifest))
    mine = made / "framework" / "last_week.py"
    out = tmp_path / "rows.csv"
    exported = cli(
        "report", run, "--export", out, "--html", tmp_path / "p.html", "--framework", mine
    )
    assert exported.exit_code == 0, exported.output
    assert "SECRET" not in out.read_text() + (tmp_path / "p.html").read_text()
    viewer = Viewer([run])
    assert "SECRET" not in json.dumps([viewer.unit(0, f"q{k}") for k in range(3)])
    assert "records no SHA-256 of the files its options name" in viewer.state(0).texts.notes[0]


def test_a_run_holding_a_link_that_leads_out_of_it_is_not_read(made, tmp_path):
    """A link inside the run to a file of the reader's -- a graph a record names, or the run's
    own results -- stops every reader in one line; a link that stays inside is fine."""
    from groundcover.pipelines.reports.pages.report_html import render

    run = received(made, tmp_path / "inbox")
    secret = tmp_path / "secret.json"
    secret.write_text(node_link("SECRET-NODE"))
    (run / "graphs").mkdir()
    (run / "graphs" / "own.json").write_text(node_link("OWN-NODE"))
    (run / "graphs" / "again.json").symlink_to(run / "graphs" / "own.json")
    with_graph_files(run, {"q0": "graphs/again.json"})
    assert "OWN-NODE" in render([run])  # a link inside the run, to inside it
    (run / "graphs" / "linked.json").symlink_to(secret)
    with_graph_files(run, {"q1": "graphs/linked.json"})
    readers = every_reader_refused(run, tmp_path / "out")
    assert all("symbolic links leading out of it (graphs/linked.json)" in r for r in readers)
    assert not (tmp_path / "out" / "rows.csv").exists()
    other = received(made, tmp_path / "second")
    elsewhere = tmp_path / "other-results.jsonl"
    shutil.move(other / "results.jsonl", elsewhere)
    (other / "results.jsonl").symlink_to(elsewhere)
    said = cli("report", other, "--json")
    assert said.exit_code == 2 and "(results.jsonl)" in said.output


def every_reader_refused(run: Path, out: Path) -> list[str]:
    """What each command says of ``run``: each must stop with one line."""
    out.mkdir(exist_ok=True)
    said = []
    for args in (
        ["report", run, "--export", out / "rows.csv"],
        ["compare", run, run, "--json"],
        ["agreement", run],
        ["labels", "export", run, out / "labels.csv"],
    ):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        said.append(result.output)
    return said


def test_a_judge_a_run_records_is_never_sent_this_machines_key(tmp_path, monkeypatch):
    """`agreement --rerun` asks the judge at the endpoint the run recorded, which whoever sent
    the run wrote: the user's key ($OPENAI_API_KEY) is not sent there; named with --endpoint,
    it is (the user's act)."""
    from aiohttp import web

    from tests.support.loopback import serve_app
    from tests.test_judges_apart import JudgeServer, eval_panel

    judge = JudgeServer("BBBBBB")
    keys: list[str] = []

    @web.middleware
    async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
        keys.append(request.headers.get("Authorization", ""))
        return await handler(request)

    served = judge.app()
    served.middlewares.append(seen)
    with serve_app(served) as url:
        assert eval_panel(tmp_path, [url], "run").exit_code == 0  # made with no key
        monkeypatch.setenv("OPENAI_API_KEY", "sk-the-readers-own")
        keys.clear()
        recorded = cli("agreement", tmp_path / "run", "--rerun", "2", "--json")
        assert recorded.exit_code == 0, recorded.output
        assert keys and not any("sk-the-readers-own" in key for key in keys)
        keys.clear()
        named = cli("agreement", tmp_path / "run", "--paraphrase", "1", "--endpoint", url)
        assert named.exit_code == 0, named.output
        assert keys and all(key == "Bearer sk-the-readers-own" for key in keys)
