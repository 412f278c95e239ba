"""A run you receive is data, tried as its sender would try it after the sent-runs suites:
entries of a run directory that are not files (a FIFO named ``results.jsonl``, which every
reader would wait on forever) are refused in one line; a ``matplotlibrc`` in the folder the
command runs in (a received bundle, opened from inside it) neither restyles the page nor turns
on ``text.usetex``, which runs LaTeX with a preamble of the sender's. The readers run in this
process (``CliRunner``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import threading
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


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished run of the one-file framework ``last_week.py`` (scripted judge: 1, 0.5, 0)."""
    from groundcover.testing import ScriptedClient, field_of

    root = tmp_path_factory.mktemp("made")
    _, found = plugins.from_file(str(FIXTURE))
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
    return root / "run"


@pytest.fixture(autouse=True)
def own_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(plugins, "_SAID", set())


def cli(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def received(made: Path, where: Path) -> Path:
    run = where / "bundle" / "run"
    shutil.copytree(made, run)
    return run


def within(seconds: float, *args: object, unblock: Path) -> Result:
    """``cli(*args)``, failing the test if it is still running after ``seconds`` (the FIFO
    ``unblock`` is then opened for writing and closed, so a reader waiting on it ends)."""
    done: list[Result] = []
    worker = threading.Thread(target=lambda: done.append(cli(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))  # the waiting reader sees EOF
        worker.join(10)
        pytest.fail(f"{' '.join(map(str, args))}: waited on the FIFO {unblock}")
    return done[0]


@pytest.mark.parametrize("name", ["results.jsonl", "labels/labels.jsonl"])
def test_a_fifo_in_a_sent_run_is_refused_in_one_line_not_waited_on(made, tmp_path, name):
    run = received(made, tmp_path)
    fifo = run / name
    fifo.parent.mkdir(exist_ok=True)
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    for args in (
        ("report", run, "--json"),
        ("labels", "export", run, tmp_path / "labels.csv"),
        ("agreement", run, "--json"),
    ):
        result = within(60, *args, unblock=fifo)
        assert result.exit_code != 0, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "not files" in lines[0] and name in lines[0], result.output


def test_a_matplotlibrc_where_the_command_runs_neither_styles_the_page_nor_runs_latex(
    made, tmp_path
):
    """matplotlib reads ``./matplotlibrc`` when it is imported: as the reader standing in the
    bundle would have it, the planted file's settings are in force while the page is made."""
    import matplotlib

    run = received(made, tmp_path)
    planted = run.parent / "matplotlibrc"
    planted.write_text(
        "axes.facecolor: 0badc0\n"
        "svg.fonttype: none\n"
        "text.usetex: True\n"
        "text.latex.preamble: \\input{/etc/hostname}\n"
    )
    page = tmp_path / "page.html"
    with matplotlib.rc_context(fname=str(planted)):
        result = cli("report", run, "--html", page)
        assert matplotlib.rcParams["text.usetex"]  # still the caller's settings afterwards
    assert result.exit_code == 0, result.output  # no LaTeX asked for (none here: it would fail)
    shown = page.read_text(encoding="utf-8")
    assert "<svg" in shown  # the score plot is there
    assert "0badc0" not in shown and "<text" not in shown  # in matplotlib's own style


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory) -> Path:
    """A finished run of an installed framework (comprehensiveness, e2e, scripted judge), whose
    inputs the package's code reads for item text."""
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_report_html import ITEMS, OUTPUTS

    root = tmp_path_factory.mktemp("installed")
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    client = ScriptedClient(
        {"coverage": lambda p: OUTPUTS[field_of(p, "Answer")]}, check_constraints=False
    )
    options = {"input": data, "method": "e2e", "summarise": False, "export_graphs": False}
    done = groundcover.evaluate(
        "comprehensiveness",
        options=options,
        run={"run_dir": root / "run", "cache": None},
        client=client,
    )
    return done.run_dir


def test_a_model_a_sent_run_names_is_neither_looked_up_on_the_hub_nor_hashed(
    installed_run, tmp_path, monkeypatch
):
    """Item text rests on the run's files: opening a run whose options name a hub id asks the
    Hub nothing (the id is the sender's choice, asked with the reader's token), and one naming
    a folder of the reader's as a model does not have it hashed."""
    from groundcover.serving import content

    asked: list[str] = []
    hashed: list[str] = []
    monkeypatch.setattr(content, "_hub_commit", lambda repo, rev: asked.append(repo))
    real_digest = content.digest_path
    monkeypatch.setattr(
        content, "digest_path", lambda path, *a: hashed.append(str(path)) or real_digest(path, *a)
    )
    reader_models = tmp_path / "reader" / "models"
    reader_models.mkdir(parents=True)
    (reader_models / "weights.bin").write_bytes(b"mine")
    for model in ("sender/beacon-3e1f", str(reader_models)):
        run = tmp_path / Path(model).name / "run"
        shutil.copytree(installed_run, run)
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["options"]["prune_model"] = model
        (run / "manifest.json").write_text(json.dumps(manifest))
        out = run.parent / "rows.csv"
        exported = cli("report", run, "--export", out)
        assert exported.exit_code == 0, exported.output
        assert "Where?" in out.read_text(encoding="utf-8")  # the item text, from its files
        labelled = cli("labels", "export", run, run.parent / "labels.csv")
        assert labelled.exit_code == 0, labelled.output
    assert asked == [] and str(reader_models) not in hashed


@contextlib.contextmanager
def senders_judge(asked: list[str]) -> Iterator[str]:
    """A chat-completions server on loopback, as a sender would run one: it lists ``judge``
    and answers every comparison with a relation of its choosing."""
    from aiohttp import web

    from tests.support.loopback import serve_app

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "judge", "root": "judge"}]})

    async def complete(request: web.Request) -> web.Response:
        asked.append(request.path)
        text = "the sender says\n324 metres - the full height [first implies second]"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response(
            {"id": "x", "choices": [choice | {"finish_reason": "stop"}]} | {"usage": usage}
        )

    application = web.Application()
    application.router.add_get("/v1/models", models)
    application.router.add_post("/v1/chat/completions", complete)
    with serve_app(application) as url:
        yield url


@pytest.fixture(scope="module")
def qa_made(tmp_path_factory) -> Path:
    """A finished comprehensiveness Q&A run (scripted) whose judge decided two comparisons of
    two texts: what ``agreement --swap-audit`` asks again, swapped."""
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, QA_SCRIPTS
    from tests.test_runtime import run as make_run

    root = tmp_path_factory.mktemp("qa")
    data = root / "items.jsonl"
    data.write_text(json.dumps(ITEM.model_dump()) + "\n")
    options = ComprehensivenessOptions(input=data, method="qa", protocol="spec")
    make_run(COMPREHENSIVENESS, options, ScriptedClient(QA_SCRIPTS), root / "run")
    return root / "run"


def with_judge(made: Path, run: Path, **recorded: Any) -> Path:
    """A copy of ``made`` as ``run`` whose manifest records ``recorded`` for its judge."""
    shutil.copytree(made, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["roles"]["judge"] |= recorded
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_an_audit_asking_the_endpoint_a_run_records_keeps_nothing_in_the_readers_cache(
    qa_made, tmp_path
):
    """A sent run names its sender's server as its judge's endpoint and claims for it the
    content of the reader's own judge (a directory's SHA-256): ``agreement --swap-audit`` asks
    it (documented), but its answers are not put in the reader's response cache, where they
    would answer the reader's own runs of that model. Named with --endpoint, they are."""
    claimed = {"revision": "sha256:" + "ab" * 32, "source": "directory", "path": "/models/mine"}
    home = tmp_path / "home"
    asked: list[str] = []
    with senders_judge(asked) as url:
        for named in (False, True):
            where = tmp_path / f"named-{named}" / "run"
            run = with_judge(qa_made, where, endpoint=url, content={"base": claimed})
            given = ["--endpoint", url] if named else []
            audited = cli("agreement", run, "--swap-audit", 2, *given)
            assert audited.exit_code == 0, audited.output
            assert "1 of 2 comparisons flip" in audited.output  # the sender's answers, counted
            cached = home / "responses.sqlite"
            if not named:
                assert len(asked) == 2
                assert not cached.exists() or rows_of(cached) == []
    assert len(asked) == 4 and len(rows_of(cached)) == 2  # named: kept, as any endpoint's


def rows_of(cache: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(cache)) as db:
        return db.execute("SELECT model, revision FROM responses").fetchall()


@pytest.mark.parametrize("endpoint", [None, "started for this run"])
def test_an_audit_starts_no_model_a_run_names_without_an_endpoint(qa_made, tmp_path, endpoint):
    """A run recording no URL for its judge (null, or a judge started for the run) would have
    an audit start the model it names here (a hub id downloaded, a folder of the bundle's
    loaded): refused in one line unless the user names the model or the endpoint (--rerun and
    --paraphrase find their judge the same way, ``judge_config``)."""
    run = with_judge(qa_made, tmp_path / "run", endpoint=endpoint, model="sender/evil-model")
    refused = cli("agreement", run, "--swap-audit", 1)
    assert refused.exit_code != 0, refused.output
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), refused.output
    assert "records no endpoint for role 'judge'" in lines[0] and "--endpoint" in lines[0]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("[1]", "a JSON object is expected"),
        ('"text"', "a JSON object is expected"),
        ('{"id": "q0", "stage": "score", "label": 1, "key": "x"}', "field key: a whole number"),
        ('{"id": "q0", "stage": "score", "label": 1, "key": [1]}', "field key: a whole number"),
        ("[" * 100_000, "JSON nested too deeply"),
    ],
)
def test_a_sent_runs_odd_label_line_is_one_line_naming_it(made, tmp_path, line, said):
    run = received(made, tmp_path)
    (run / "labels").mkdir()
    (run / "labels" / "labels.jsonl").write_text(line + "\n")
    result = cli("agreement", run)
    assert result.exit_code != 0, result.output
    (error,) = one_error(result)
    assert "labels.jsonl:1: " in error and said in error, result.output


def test_a_manifest_nested_too_deeply_is_one_line(made, tmp_path):
    run = received(made, tmp_path)
    (run / "manifest.json").write_text("[" * 200_000)
    result = cli("report", run)
    assert result.exit_code != 0, result.output
    (error,) = one_error(result)
    assert "manifest.json: unreadable manifest: JSON nested too deeply" in error


def one_error(result: Result) -> list[str]:
    """The error lines of a refused command (the records-only note may come before): one, and
    no traceback."""
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors


def test_two_runs_no_item_of_which_both_scored_compare_with_no_test(made, tmp_path):
    """Every item failed in one run: nothing is paired, so there is no test (a traceback
    before)."""
    failed = received(made, tmp_path / "a")
    records = [json.loads(line) for line in (failed / "results.jsonl").read_text().splitlines()]
    for record in records:
        record |= {"status": "error", "score": None}
        record["failure"] = {"stage": "last-week", "error": "the endpoint went away"}
    (failed / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    compared = cli("compare", failed, made, "--json", "--resamples", 200)
    assert compared.exit_code == 0, compared.output
    (pair,) = json.loads(compared.stdout.splitlines()[-1])["pairs"]
    assert (pair["paired"], pair["test"], len(pair["unpaired"])) == (0, None, 3)


def test_recorded_options_the_framework_does_not_read_are_one_line(installed_run, tmp_path):
    run = tmp_path / "bundle" / "run"
    shutil.copytree(installed_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["options"]["dataset"] = "<not one of them>"
    (run / "manifest.json").write_text(json.dumps(manifest))
    for args in (
        ("report", run),
        ("report", run, "--export", tmp_path / "rows.csv"),
        ("compare", run, installed_run),
        ("agreement", run),
        ("labels", "export", run, tmp_path / "labels.csv"),
    ):
        result = cli(*args)
        assert result.exit_code != 0, result.output
        (error,) = one_error(result)
        assert "manifest.json: record: field options.dataset: Input should be" in error, error


def test_the_page_beside_a_run_that_is_a_link_is_beside_the_link(made, tmp_path):
    """A bundle's ``run`` is a link to a run of the reader's elsewhere (on a shared disk, say):
    ``report bundle/run --html`` writes ``bundle/run.html``, never the reader's page beside the
    run the link leads to."""
    mine = tmp_path / "mine" / "run"
    shutil.copytree(made, mine)
    page_of_mine = tmp_path / "mine" / "run.html"
    page_of_mine.write_text("my notes\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "run").symlink_to(mine, target_is_directory=True)
    written = cli("report", bundle / "run", "--html")
    assert written.exit_code == 0, written.output
    assert page_of_mine.read_text() == "my notes\n"
    assert (bundle / "run.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


# ---- the inputs a sent run names, checked before anything of them is read ---------------------

_WATCHED: list[tuple[tuple[str, ...], tuple[str, ...], list[str]]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Refuses (and notes) an open or a folder listing of a watched path while a test watches:
    a reader that would read it gets an error instead of reading it (or waiting forever)."""
    if not _WATCHED or not args:
        return
    if not isinstance(args[0], str | bytes | os.PathLike):
        return
    text = os.fsdecode(args[0])
    for prefixes, events, seen in _WATCHED:
        if event in events and any(text == p or text.startswith(p + "/") for p in prefixes):
            seen.append(f"{event} {text}")
            raise PermissionError(f"the test refuses {event} of {text}")


@contextlib.contextmanager
def reads_of(*prefixes: str, listings: bool = True) -> Iterator[list[str]]:
    """The opens (and folder listings) of ``prefixes`` and what is under them made meanwhile."""
    import sys

    if not getattr(sys, "_groundcover_test_audit", False):
        sys.addaudithook(_audit)  # hooks stay for the process: it watches nothing when idle
        sys._groundcover_test_audit = True  # type: ignore[attr-defined]
    seen: list[str] = []
    events = ("open", "os.scandir", "os.listdir") if listings else ("open",)
    entry = (prefixes, events, seen)
    _WATCHED.append(entry)
    try:
        yield seen
    finally:
        _WATCHED.remove(entry)


def naming_input(installed_run: Path, run: Path, path: object, **recorded: Any) -> Path:
    """A copy of ``installed_run`` whose options and recorded input name ``path``."""
    shutil.copytree(installed_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["options"]["input"] = str(path)
    manifest["inputs"]["input"] |= {"path": str(path)} | recorded
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def read_as_sent(run: Path) -> list[str]:
    """The notes of ``report --export`` and that ``labels export`` ran, with no item text."""
    out = run.parent / "rows.csv"
    exported = cli("report", run, "--export", out)
    assert exported.exit_code == 0, exported.output
    assert "Where?" not in out.read_text(encoding="utf-8")
    labelled = cli("labels", "export", run, run.parent / "labels.csv")
    assert labelled.exit_code == 0, labelled.output
    notes: list[str] = json.loads(Path(f"{out}.tables.json").read_text())["runs"][0]["notes"]
    return notes


@pytest.mark.parametrize(
    ("target", "kind"),
    [("pagemap", "file"), ("status", "file"), ("fdinfo", "dir"), ("/dev/zero", "file")],
)
def test_an_input_a_sent_run_names_on_a_kernel_file_system_is_never_read(
    installed_run, tmp_path, target, kind
):
    """``/proc/self/pagemap`` (hashing it never ends: report --export, labels export and the
    labelling page hung), a procfs file or folder, a device: refused by where they are, before
    any of them is opened or listed, with no digest memo left for them."""
    path = target if target.startswith("/") else f"/proc/self/{target}"
    own = path.replace("/proc/self/", f"/proc/{os.getpid()}/")
    run = naming_input(installed_run, tmp_path / "bundle" / "run", path, size=0, files=1)
    with reads_of(path, own) as seen:
        notes = read_as_sent(run)
    assert seen == []
    assert len(notes) == 1 and notes[0].startswith("input ("), notes
    assert not (tmp_path / "home" / "digests").exists()


def folder_of(where: Path, files: int) -> Path:
    where.mkdir(parents=True)
    for k in range(files):
        (where / f"notes{k}.txt").write_text(f"private {k}\n")  # 10 bytes each
    return where


@pytest.mark.parametrize("shape", ["more files", "more bytes", "a link loop"])
def test_a_folder_a_sent_run_names_is_walked_not_read_beyond_what_it_records(
    installed_run, tmp_path, shape
):
    """A run naming a folder of the reader's (``/usr``, a home folder) had every file in it read
    and hashed, and a memo of it kept; one holding a link to itself was walked until the links
    ran out. Now the folder is walked without reading, and left at the first file or byte
    beyond what the run recorded, or at the loop."""
    mine = folder_of(tmp_path / "reader" / "notes", 3)
    recorded = {"more files": (1, 10), "more bytes": (3, 25), "a link loop": (9, 90)}[shape]
    if shape == "a link loop":
        (mine / "again").symlink_to(mine, target_is_directory=True)
    run = naming_input(
        installed_run,
        tmp_path / "bundle" / "run",
        mine,
        kind="dir",
        files=recorded[0],
        size=recorded[1],
    )
    with reads_of(str(mine), listings=False) as seen:
        notes = read_as_sent(run)
    assert seen == []
    assert len(notes) == 1 and notes[0].startswith("input"), notes
    if shape == "a link loop":
        assert "link loop" in notes[0]
    assert not (tmp_path / "home" / "digests").exists()


def test_a_folder_as_recorded_has_the_digest_it_was_made_with(tmp_path):
    """The user's own runs keep their item text: a folder as recorded (nested folders, a linked
    folder, dot-names, a FIFO, hundreds of files) has ``digest_path``'s digest, read once, and
    remembered; one byte more, or another SHA-256, is refused."""
    from groundcover.serving.content import NotAsRecorded, digest_as_recorded, digest_path

    root = folder_of(tmp_path / "data" / "corpus", 300)
    folder_of(root / "part" / "deeper", 4)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("not content\n")
    (root / ".hidden").write_text("neither\n")
    folder_of(tmp_path / "data" / "shared", 2)
    (root / "shared").symlink_to(tmp_path / "data" / "shared", target_is_directory=True)
    os.mkfifo(root / "pipe")
    made = digest_path(root, memo=tmp_path / "made")
    sizes = [len(f"private {k}\n") for k in range(300)] + [10] * 6
    assert (made.files, made.size) == (306, sum(sizes))
    memo = tmp_path / "memo"
    again = digest_as_recorded(root, made.size, made.files, made.sha256.__eq__, memo=memo)
    assert again == made and len(list(memo.iterdir())) == 1
    (root / "notes0.txt").write_text("private 0!\n")
    with pytest.raises(NotAsRecorded):
        digest_as_recorded(root, made.size, made.files, made.sha256.__eq__)
    (root / "notes0.txt").write_text("private X\n")  # the same size, another SHA-256
    with pytest.raises(NotAsRecorded):
        digest_as_recorded(root, made.size, made.files, made.sha256.__eq__, memo=tmp_path / "m2")
    assert not (tmp_path / "m2").exists()


def test_a_study_roots_options_the_study_does_not_read_are_one_line(installed_run, tmp_path):
    """``report STUDYROOT`` read ``study.json``'s options unchecked: a traceback."""
    root = tmp_path / "study"
    shutil.copytree(installed_run, root / "run")
    study = {"format_version": 2, "study": "comprehensiveness", "runs": ["run"]}
    study["options"] = {"method": "<not one of them>"}
    (root / "study.json").write_text(json.dumps(study))
    result = cli("report", root)
    assert result.exit_code != 0, result.output
    (error,) = one_error(result)
    assert f"{root / 'study.json'}: record: field options.method: Input should be" in error


@pytest.mark.parametrize("record", ["[]", '{"study": "comprehensiveness", "runs": "run"}', "{"])
def test_a_study_record_compare_cannot_read_is_one_line(installed_run, tmp_path, record):
    """``compare`` read ``study.json`` as bare JSON: a list, a record without runs, or a cut
    file ended in a traceback."""
    root = tmp_path / "study"
    root.mkdir()
    (root / "study.json").write_text(record)
    result = cli("compare", root, installed_run)
    assert result.exit_code != 0, result.output
    (error,) = one_error(result)
    assert f"{root / 'study.json'}: " in error, error


def test_the_nli_model_a_run_names_is_neither_asked_of_the_hub_nor_hashed_by_calibrate(
    installed_run, tmp_path, monkeypatch
):
    """``cascade calibrate`` names a run's NLI tier by the model's content: with no record of
    it in the run, the name the run gives was asked of the Hub (with the reader's token) or
    hashed as a path. Now: the local cache's commit for a hub id, else an explicit unknown."""
    import huggingface_hub.constants
    from aiohttp import web

    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.reports.audits.cascade import UNKNOWN_NLI_MODEL, nli_model_of
    from groundcover.pipelines.runtime.store.run_dir import read_manifest
    from groundcover.serving import content
    from tests.support.loopback import serve_app

    asked: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"sha": "0" * 40, "id": "sender/nli-beacon"})

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", anything)
    manifest = read_manifest(installed_run / "manifest.json")
    mine = folder_of(tmp_path / "reader" / "checkpoint", 2)
    cache = tmp_path / "hf"
    refs = cache / "models--reader--nli" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    content._hub_commit.cache_clear()
    found = {}
    with serve_app(application) as url, reads_of(str(mine)) as seen:
        hub = url.removesuffix("/v1")
        monkeypatch.setenv("HF_ENDPOINT", hub)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub)
        for model in ("sender/nli-beacon", str(mine), "reader/nli"):
            options = ComprehensivenessOptions(
                input=tmp_path / "items.jsonl",
                method="nli",
                nli_backend="cross-encoder",
                nli_model=model,
            )
            found[model] = nli_model_of(manifest, options)
    content._hub_commit.cache_clear()
    assert asked == [] and seen == []
    assert found == {
        "sender/nli-beacon": UNKNOWN_NLI_MODEL,
        str(mine): UNKNOWN_NLI_MODEL,
        "reader/nli": "c" * 40,  # the reader's own cache says which commit it is
    }


SENT_IDS = ["../../../../tmp/gc-planted", "/tmp/gc-absolute", "a\\..\\..\\b", "..", "q.ok-1"]


def test_an_inspect_logs_sample_files_are_named_inside_the_archive_whatever_the_ids(
    installed_run, tmp_path
):
    """inspect_ai names each sample's file in the ``.eval`` zip after its id: a sent run's ids
    named ``samples/../../../../tmp/...`` and absolute paths, which an unzipper writes where
    they lead. The names are plain now, the ids kept as data, and inspect_ai reads it all."""
    import zipfile

    inspect_log = pytest.importorskip("inspect_ai.log", reason="inspect_ai not installed")
    run = tmp_path / "bundle" / "run"
    shutil.copytree(installed_run, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2
    for record, sent in zip(records, SENT_IDS[:2], strict=True):
        record["id"] = sent
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.eval"
    exported = cli("report", run, "--export", out)
    assert exported.exit_code == 0, exported.output
    names = zipfile.ZipFile(out).namelist()
    for name in names:
        parts = name.replace("\\", "/").split("/")
        assert not name.startswith("/") and ".." not in parts and "tmp" not in parts, name
    samples = [n for n in names if n.startswith("samples/")]
    assert len(samples) == 2 and all(n.count("/") == 1 for n in samples), names
    log = inspect_log.read_eval_log(str(out))
    assert sorted(s.metadata["id"] for s in log.samples) == sorted(SENT_IDS[:2])
    for sample in log.samples:
        again = inspect_log.read_eval_log_sample(str(out), id=sample.id, epoch=1)
        assert again.metadata["id"] == sample.metadata["id"]


def test_sample_ids_are_plain_names_made_of_the_ids():
    from groundcover.pipelines.reports.exports.inspect_log import sample_id

    made = [sample_id(i) for i in SENT_IDS]
    assert made[-1] == "q.ok-1" and len(set(made)) == len(SENT_IDS)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", m) and ".." not in m for m in made), made


@pytest.mark.parametrize("name", ["x.eval", "x.csv", "x.parquet", "page.html", "labels.csv"])
def test_an_output_in_a_folder_that_is_not_there_is_one_line(made, tmp_path, name):
    """``report --export DIR/x.eval`` (csv, parquet, ``--html``, ``labels export``) with no
    folder DIR ended in a FileNotFoundError traceback: one line naming the path, nothing
    written."""
    out = tmp_path / "not-there" / name
    if name == "page.html":
        args: tuple[object, ...] = ("report", made, "--html", out)
    elif name == "labels.csv":
        args = ("labels", "export", made, out)
    else:
        args = ("report", made, "--export", out)
    result = cli(*args)
    assert result.exit_code != 0, result.output
    (error,) = one_error(result)
    assert f"{out}: no folder {out.parent} to write it in" in error, error
    assert not out.parent.exists()


def test_two_items_never_share_fact_graph_files_whatever_their_ids(tmp_path):
    """An item's graph files were named by its id with its last dotted part taken for a suffix
    and replaced: ``q.1`` and ``q.2`` both wrote ``graphs/q.json``, the second item's graph
    drawn for the first. Each id now has files of its own, plain names inside ``graphs/``."""
    from groundcover.pipelines.comprehensiveness.framework import graph_name
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import ITEM, QA_SCRIPTS

    ids = ["q.1", "q.2"]
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(ITEM.model_dump() | {"id": i}) + "\n" for i in ids))
    done = groundcover.evaluate(
        "comprehensiveness",
        options={"input": items, "protocol": "spec", "method": "qa"},
        run={"run_dir": tmp_path / "run", "cache": None},
        client=ScriptedClient(QA_SCRIPTS),
    )
    recorded = {r.id: r.details["graph_files"]["node_link"] for r in done.results}
    assert recorded == {"q.1": "graphs/q.1.json", "q.2": "graphs/q.2.json"}
    assert all((done.run_dir / path).is_file() for path in recorded.values())
    odd = ["..", ".", ".hidden", "a/b", "a_b", "/tmp/x", "x" * 130, "x" * 131]
    names = [graph_name(i) for i in odd]
    assert len(set(names)) == len(odd), names
    assert all(re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", n) for n in names), names
