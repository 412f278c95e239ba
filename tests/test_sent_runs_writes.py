"""A run you receive is data, for what is written and shown (issue 88: one way to write a file,
credentials never stored, text stays text). Runs are sent here as someone would send them:
with the temporary names every writer used to open (``report.html.tmp``, ``rows.csv.tmp``,
``.rows.eval.tmp.eval``, ``.queue.jsonl.PID.tmp``) planted as links to a file of the reader's,
with a target or a folder (``labels -> elsewhere``) that is a link, with endpoints whose URL
carries a password (holding an ``@``) or a token, and with error text whose key straddles the
old 300-character cut. Every writer (report --html, --export csv | parquet | eval, labels
export, agreement --sample, the viewer's labels, a resumed run) either writes its own output
or refuses in one line; no file outside the outputs changes (the reader's files are
snapshotted, times and bytes), and no secret is in the run, the cache, the page, an export or
what the commands print. The readers run in this process (``CliRunner``); the endpoint runs
are real processes against a real HTTP server on loopback that demands its credentials."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner, Result

import groundcover
from groundcover.pipelines.cli.main import app
from groundcover.pipelines.runtime.contract import plugins
from groundcover.pipelines.runtime.contract.errors import UserError
from groundcover.serving.files import UnsafePath
from groundcover.testing import ScriptedClient
from tests.support.loopback import serve_app

FRAMEWORK = Path(__file__).parent / "fixtures" / "frameworks" / "sources.py"
REFUSED = "symbolic link"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished run of the one-file framework ``sources.py`` (scripted judge: yes), one item
    whose explanation carries a bidirectional override, an ANSI escape and an emoji code."""
    root = tmp_path_factory.mktemp("made")
    _, found = plugins.from_file(str(FRAMEWORK))
    items = root / "items.jsonl"
    rows = [
        {"id": "a", "question": "Q?", "answer": "A", "source": "left\u202eright \x1b[31m:warning:"},
        {"id": "b", "question": "Q2?", "answer": "B", "source": "plain"},
    ]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    groundcover.evaluate(
        found,
        options={"input": str(items)},
        client=ScriptedClient({"sourced": "yes"}),
        run={"run_dir": str(root / "run"), "cache": None},
    )
    plugins._GIVEN.pop(found.name, None)  # given to make the run, not to read it
    return root / "run"


@pytest.fixture(autouse=True)
def own_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))


def cli(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def received(made: Path, where: Path) -> Path:
    """A copy of the run as someone sent it: ``where/bundle/run``."""
    run = where / "bundle" / "run"
    shutil.copytree(made, run)
    return run


def reader_files(where: Path) -> Path:
    """The reader's own files a sender would aim at: a shell's rc file and a config folder."""
    victim = where / "victim"
    (victim / "config").mkdir(parents=True)
    (victim / "bashrc").write_text("export PATH=mine\n")
    (victim / "config" / "queue.jsonl").write_text('{"mine": true}\n')
    return victim


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file below ``folder``: its modification time and bytes (links not followed)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(folder))] = (path.stat().st_mtime_ns, path.read_bytes())
    return found


def one_line_refusal(result: Result) -> str:
    """A refusal is one line, saying why, and a non-zero exit."""
    assert result.exit_code != 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert REFUSED in lines[0], result.output
    return lines[0]


# ---- every writer, with the temporary names the old writers opened planted as links ---------


def test_no_writer_follows_a_temporary_name_planted_as_a_link(made, tmp_path):
    """Beside the run (the bundle's folder, where --html alone and outputs the user names
    there are written) the links lead to the reader's files; inside the run they lead to the
    run's own records (a link leading out of a run has the run refused before any write)."""
    run = received(made, tmp_path)
    bundle = run.parent
    victim = reader_files(tmp_path)
    bashrc, manifest = victim / "bashrc", run / "manifest.json"
    planted = {
        bundle / "run.html.tmp": bashrc,  # report --html alone: RUN.html beside the run
        bundle / "page.html.tmp": bashrc,
        bundle / "rows.csv.tmp": bashrc,
        bundle / "rows.parquet.tmp": bashrc,
        bundle / ".rows.eval.tmp.eval": bashrc,  # the inspect log's old temporary name
        bundle / "tasks.csv.tmp": bashrc,
        bundle / "tasks.json.tmp": bashrc,
        run / "inside.csv.tmp": manifest,
        run / "labels" / f".queue.jsonl.{os.getpid()}.tmp": manifest,  # agreement --sample
    }
    (run / "labels").mkdir()
    for link, target in planted.items():
        link.symlink_to(target)
    before, records = snapshot(victim), snapshot(run)

    results = {
        "html beside": cli("report", run, "--html"),
        "html": cli("report", run, "--html", bundle / "page.html"),
        "csv": cli("report", run, "--export", bundle / "rows.csv"),
        "csv in the run": cli("report", run, "--export", run / "inside.csv"),
        "parquet": cli("report", run, "--export", bundle / "rows.parquet"),
        "inspect": cli("report", run, "--export", bundle / "rows.eval"),
        "labels csv": cli("labels", "export", run, bundle / "tasks.csv"),
        "labels studio": cli(
            "labels", "export", run, bundle / "tasks.json", "--format", "label-studio"
        ),
        "queue": cli("agreement", run, "--sample", "1", "--seed", "0"),
    }
    from groundcover.pipelines.reports.pages.viewer import Viewer

    Viewer([run]).add_label(0, {"id": "b", "label": 1.0, "annotator": "me"})
    for name, result in results.items():
        assert result.exit_code == 0, (name, result.output)
    assert snapshot(victim) == before  # the reader's files: not a byte, not a time changed
    now = snapshot(run)
    assert {k: now[k] for k in records} == records  # nor the run's own records
    for link, target in planted.items():
        assert link.is_symlink() and link.resolve() == target  # left as it was, never written
    outputs = [
        bundle / "run.html",
        bundle / "page.html",
        bundle / "rows.csv",
        bundle / "rows.csv.tables.json",
        run / "inside.csv",
        bundle / "rows.parquet",
        bundle / "rows.eval",
        bundle / "tasks.csv",
        bundle / "tasks.json",
        bundle / "tasks.label-config.xml",
        run / "labels" / "queue.jsonl",
        run / "labels" / "labels.jsonl",
    ]
    for out in outputs:
        assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0, out
    assert "<html" in (bundle / "run.html").read_text()
    assert json.loads((run / "labels" / "labels.jsonl").read_text())["id"] == "b"
    leftovers = {p for p in bundle.rglob("*.tmp*")} - set(planted)
    assert not leftovers  # every writer's own temporary file is gone


def test_a_linked_target_or_folder_is_refused_in_one_line(made, tmp_path):
    run = received(made, tmp_path)
    bundle = run.parent
    victim = reader_files(tmp_path)
    before = snapshot(victim)

    # report --html alone writes RUN.html beside the run: a name the user never typed
    (bundle / "run.html").symlink_to(victim / "bashrc")
    assert "run.html" in one_line_refusal(cli("report", run, "--html"))
    # a name made beside the one typed: refused before anything is written
    (bundle / "rows.csv.tables.json").symlink_to(victim / "bashrc")
    one_line_refusal(cli("report", run, "--export", bundle / "rows.csv"))
    assert not (bundle / "rows.csv").exists()
    (bundle / "tasks.label-config.xml").symlink_to(victim / "bashrc")
    studio = cli("labels", "export", run, bundle / "tasks.json", "--format", "label-studio")
    one_line_refusal(studio)
    assert not (bundle / "tasks.json").exists()

    # labels/ a link to a folder of the reader's: the run is not even read
    (run / "labels").symlink_to(victim / "config")
    one_line_refusal(cli("agreement", run, "--sample", "1", "--seed", "0"))
    from groundcover.pipelines.reports.pages.viewer import Viewer

    with pytest.raises(UserError, match=REFUSED):
        Viewer([run]).add_label(0, {"id": "b", "label": 1.0, "annotator": "me"})
    # labels/ a link to another folder of the run: read, but never written through
    (run / "labels").unlink()
    (run / "elsewhere").mkdir()
    (run / "labels").symlink_to(run / "elsewhere")
    assert "labels" in one_line_refusal(cli("agreement", run, "--sample", "1", "--seed", "0"))
    with pytest.raises(UserError, match=REFUSED):
        Viewer([run]).add_label(0, {"id": "b", "label": 1.0, "annotator": "me"})
    assert not list((run / "elsewhere").iterdir())
    # a label file that is a link (inside the run): never appended to
    (run / "labels").unlink()
    (run / "labels").mkdir()
    (run / "labels" / "labels.jsonl").symlink_to(run / "manifest.json")
    kept = (run / "manifest.json").read_bytes()
    with pytest.raises(UserError, match=REFUSED):
        Viewer([run]).add_label(0, {"id": "b", "label": 1.0, "annotator": "me"})
    assert (run / "manifest.json").read_bytes() == kept
    assert snapshot(victim) == before
    assert sorted(p.name for p in (victim / "config").iterdir()) == ["queue.jsonl"]


def test_a_resumed_run_never_truncates_or_appends_through_a_linked_results_file(made, tmp_path):
    """A run resumed in place (``eval ... --run-dir RECEIVED``) repairs a torn tail and appends:
    a results file that is a link (here to a file of the run) is refused before either."""
    run = received(made, tmp_path)
    aside = run / "aside.jsonl"
    aside.write_bytes((run / "results.jsonl").read_bytes() + b'{"torn')  # a tail to cut
    (run / "results.jsonl").unlink()
    (run / "results.jsonl").symlink_to(aside)
    kept = aside.read_bytes()
    _, found = plugins.from_file(str(FRAMEWORK))
    manifest = json.loads((run / "manifest.json").read_text())
    with pytest.raises(UnsafePath, match=REFUSED):
        groundcover.evaluate(
            found,
            options=manifest["options"],
            client=ScriptedClient({"sourced": "yes"}),
            run={"run_dir": str(run), "cache": None},
        )
    plugins._GIVEN.pop(found.name, None)
    assert aside.read_bytes() == kept


# ---- credentials in endpoint URLs ------------------------------------------------------------

PASSWORD = "pa@ss-Qm7xK2vR9tLw4Zp"  # an '@' in it: once half redacted
TOKEN = "tok-Hq8Lw3Nv6Rb2Xc5Jy"  # user-info of a token alone: once never redacted
OLD_CUT = 300


def basic(userinfo: str) -> str:
    return "Basic " + base64.b64encode(userinfo.encode()).decode()


@contextlib.contextmanager
def guarded_judge(userinfo: str, secret: str, asked: list[str]) -> Iterator[str]:
    """A chat-completions server on loopback that answers only requests carrying ``userinfo``
    as HTTP Basic (401 otherwise). A question holding ECHO is refused (400) with an error that
    echoes the credential, the ``secret`` across the old 300-character cut."""
    expected = basic(userinfo if ":" in userinfo else f"{userinfo}:")

    def authorised(request: web.Request) -> bool:
        asked.append(request.headers.get("Authorization", ""))
        return request.headers.get("Authorization") == expected

    async def models(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.json_response({"error": {"message": "who are you"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "m", "root": "m"}]})

    async def complete(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.json_response({"error": {"message": "who are you"}}, status=401)
        body = await request.json()
        if "ECHO" in json.dumps(body["messages"]):
            head = "." * (OLD_CUT - len(secret) // 2 - 4)  # the old cut fell inside the key
            message = f"{head}key {secret} ({expected}) refused"
            return web.json_response({"error": {"message": message}}, status=400)
        reply = {"role": "assistant", "content": "yes"}
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        choice = {"index": 0, "message": reply, "finish_reason": "stop"}
        return web.json_response({"id": "x", "choices": [choice], "usage": usage})

    application = web.Application()
    application.router.add_get("/v1/models", models)
    application.router.add_post("/v1/chat/completions", complete)
    with serve_app(application) as url:
        yield url


def with_userinfo(url: str, userinfo: str) -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


def test_credentials_in_endpoint_urls_are_never_stored_shown_or_exported(tmp_path):
    items = tmp_path / "items.jsonl"
    rows = [
        {"id": "ok", "question": "Q?", "answer": "A", "source": "s"},
        {"id": "echo", "question": "ECHO?", "answer": "A", "source": "s"},
    ]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    home = tmp_path / "home"  # the trust list and the response cache (responses.sqlite)
    env = dict(os.environ) | {"GROUNDCOVER_HOME": str(home)}
    printed, runs = [], []
    forms = {  # --endpoint with a password; a role's own URL with a token alone
        "password": (f"alice:{PASSWORD}", PASSWORD, ["--model", "m", "--endpoint", "{url}"]),
        "token": (TOKEN, TOKEN, ["--role", "judge=m@{url}"]),
    }
    for name, (userinfo, secret, flags) in forms.items():
        asked: list[str] = []
        with guarded_judge(userinfo, secret, asked) as url:
            given = [f.format(url=with_userinfo(url, userinfo)) for f in flags]
            run = tmp_path / f"run-{name}"
            done = subprocess.run(
                [sys.executable, "-m", "groundcover", "eval", str(FRAMEWORK), str(items)]
                + [*given, "--run-dir", str(run)],
                capture_output=True,
                text=True,
                env=env,
                timeout=240,
            )
        printed += [done.stdout, done.stderr]
        assert done.returncode == 4, done.stderr[-3000:]  # the echoing item failed, recorded
        records = {
            r["id"]: r for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())
        }
        assert records["ok"]["status"] == "ok"  # its requests authenticated
        assert records["echo"]["status"] == "error"
        assert "[redacted]" in records["echo"]["failure"]["error"]
        assert asked and not [a for a in asked if a != asked[0]]  # one credential, every time
        manifest = json.loads((run / "manifest.json").read_text())
        recorded = json.dumps(manifest["models"]) + json.dumps(manifest.get("roles"))
        assert url in recorded  # the endpoint is recorded: by its URL without user-info
        runs.append(run)

    out = tmp_path / "out"
    out.mkdir()
    for run in runs:
        stem = out / run.name
        for args in (
            ["report", run, "--html", f"{stem}.html", "--export", f"{stem}.csv"],
            ["report", run, "--export", f"{stem}.parquet"],
            ["report", run, "--export", f"{stem}.eval"],
            ["labels", "export", run, f"{stem}-tasks.csv"],
        ):
            result = cli(*args)
            assert result.exit_code == 0, result.output
            printed.append(result.output)
    assert list(home.rglob("responses*.sqlite"))
    stored = [
        p.read_bytes() for folder in (*runs, home, out) for p in folder.rglob("*") if p.is_file()
    ]
    everything = b"".join(p for p in stored if p) + "".join(printed).encode()
    everything += b"".join(_unzipped(p) for folder in (out,) for p in folder.glob("*.eval"))
    for secret in (PASSWORD, TOKEN):
        for form in (secret, secret[: len(secret) // 2], basic(f"alice:{secret}")[6:]):
            assert form.encode() not in everything, form


def _unzipped(path: Path) -> bytes:
    """An inspect log is a zip: its members' bytes, uncompressed."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return b"".join(archive.read(name) for name in archive.namelist())


def test_user_info_is_taken_off_where_an_endpoint_is_read():
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig
    from groundcover.pipelines.runtime.contract.roles import RoleSpec, parse_spec
    from groundcover.serving.credentials import authorization, split_userinfo

    assert split_userinfo("http://u:p@ss@h:8/v1?x=@") == ("http://h:8/v1?x=@", "u:p@ss")
    assert split_userinfo("https://h/v1") == ("https://h/v1", None)
    config = EvaluatorConfig(model="m", endpoint=f"http://bob:{PASSWORD}@10.0.0.9:8000/v1")
    assert config.endpoint == "http://10.0.0.9:8000/v1"
    assert PASSWORD not in config.model_dump_json()
    assert authorization("http://10.0.0.9:8000/v1/", "sk-x") == basic(f"bob:{PASSWORD}")
    assert authorization("http://10.0.0.10:8000/v1", "sk-unheld") == "Bearer sk-unheld"
    # a role's URL: its user-info taken off before an adapter after it is looked for
    spec = parse_spec(f"m@http://{TOKEN}@10.0.0.11:9000:reviewer")
    assert spec == {"model": "m", "endpoint": "http://10.0.0.11:9000", "adapter": "reviewer"}
    assert authorization("http://10.0.0.11:9000", "k") == basic(f"{TOKEN}:")
    yaml_role = RoleSpec.model_validate({"model": "m", "endpoint": f"https://{TOKEN}@h.example"})
    assert yaml_role.endpoint == "https://h.example"


def test_redaction_runs_before_the_cut_and_covers_every_form_of_user_info():
    from groundcover.serving.redact import REDACTED, clipped, redact, remember

    assert redact(f"http://{TOKEN}@h/v1") == f"http://{REDACTED}@h/v1"
    assert redact(f"x http://alice:{PASSWORD}@h:1/v1 y") == f"x http://alice:{REDACTED}@h:1/v1 y"
    assert redact('["http://h/v1", "a@b"]') == '["http://h/v1", "a@b"]'  # no user-info: kept
    key = "sk-straddle-0123456789abcdef"
    remember(key)
    text = "." * (OLD_CUT - 10) + f"key {key} refused"
    assert key[:6] in " ".join(text.split())[:OLD_CUT]  # what the old cut left behind
    cut = clipped(text, OLD_CUT)
    assert len(cut) <= OLD_CUT and key[:6] not in cut and "[redacted]"[:4] in cut


# ---- text stays text -------------------------------------------------------------------------


def test_the_page_shows_bidi_controls_and_escapes_as_the_terminal_does(made, tmp_path):
    """In the page's markup and data (the server's escapes), in its drill-down and in the
    viewer's rows (drawn by the page's script from what the viewer answers)."""
    from groundcover.pipelines.reports.pages.report_html import write_html
    from groundcover.pipelines.runtime.terminal import printable
    from tests.support.browser import BROWSER, page_text
    from tests.test_hostile_inputs import served

    page = write_html([made], tmp_path / "page.html")
    html = page.read_text(encoding="utf-8")
    assert "\u202e" not in html and "\x1b" not in html  # not in the markup, nor the data script
    assert "\\u202e" in html
    if BROWSER is None:
        pytest.skip("no chromium for the drill-down")
    shown = printable("left\u202eright \x1b[31m:warning:")
    drill = page_text(page.resolve().as_uri() + "#item=a", ["Item a"])
    with served(made) as (url, _):
        rows = page_text(url + "/", [shown])
    for text in (drill, rows):
        assert shown in text
        assert "\u202e" not in text and "\x1b" not in text


def test_the_terminal_reads_no_emoji_code_and_agreement_no_markup(made, tmp_path):
    from groundcover.pipelines.runtime.terminal import terminal

    console = terminal(record=True, width=80)
    console.print("data says :warning: and :smile:")
    assert ":warning:" in console.export_text() and "\u26a0" not in console.export_text()
    result = cli("agreement", received(made, tmp_path))
    assert result.exit_code == 0, result.output
    assert "[bold]" not in result.output and "[/bold]" not in result.output
    assert "bundle/run" in "".join(result.output.split())  # the path may wrap at the width


def test_index_search_prints_a_corpus_through_the_console(tmp_path, monkeypatch):
    """A corpus's ids and text are data. The index answers with them as it would (its search
    stands in here: BM25's first query compiles for tens of seconds; tests/test_retrieval.py
    searches real indexes)."""
    from groundcover.retrieval import index as retrieval

    evil = "evil\x1b]0;owned\x07\u202e"
    hit = retrieval.Hit(row=0, chunk_id=f"{evil}@0", doc_id=evil, score=1.0, text=evil)

    class Answering:
        def search(self, queries: list[str], **_: object) -> list[list[retrieval.Hit]]:
            return [[hit] for _ in queries]

    monkeypatch.setattr(retrieval.SearchIndex, "load", classmethod(lambda cls, path: Answering()))
    result = cli("index", "search", tmp_path / "idx", "harbour Marseille", "--mode", "bm25")
    assert result.exit_code == 0, result.output
    assert "evil\\x1b]0;owned\\x07\\u202e@0" in result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output


def test_an_override_reason_is_capped_as_a_note_is(made, tmp_path):
    from groundcover.pipelines.reports.people.overrides import add_override, read_overrides
    from groundcover.pipelines.runtime.store.labels import TEXT_LIMIT
    from groundcover.pipelines.runtime.store.run_dir import RESULTS, results_by_id

    run = received(made, tmp_path)
    records = {r.id: r for r in results_by_id(run / RESULTS)}
    made_now = add_override(run, records, "b", 0.0, "  " + "why " * 5000, "me")
    assert len(made_now.reason) == TEXT_LIMIT
    with (run / "labels" / "overrides.jsonl").open("a") as sent:  # a sent run's own line
        sent.write(json.dumps({"id": "a", "score": 1.0, "reason": "x" * 50_000}) + "\n")
    assert {len(o.reason) for o in read_overrides(run).values()} == {TEXT_LIMIT}


def test_the_viewer_closes_a_connection_that_says_nothing(made, monkeypatch):
    """A half-open connection is closed after the viewer's socket timeout (shortened here),
    not held by a thread forever; the server goes on answering."""
    import threading
    import urllib.request

    from groundcover.pipelines.reports.pages import viewer as viewing

    monkeypatch.setattr(viewing, "SOCKET_SECONDS", 0.5)
    server = viewing.make_server(viewing.Viewer([made]), "127.0.0.1", 0, None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port)) as silent:
            silent.settimeout(60)  # a bound for a broken test, not a timing assertion
            silent.sendall(b"GET / HTTP/1.1\r\n")  # and then nothing more
            assert silent.recv(1024) == b""  # closed by the server
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/ready", timeout=60) as r:
            assert json.loads(r.read())["ready"] in (True, False)
    finally:
        server.shutdown()
        server.server_close()
