"""Hostile text stays text. Strings anybody can write (rich markup, HTML, JavaScript URLs,
template syntax, control and bidirectional characters, spreadsheet formulas, mathtext) go into
every text field of a run -- ids, a framework's table cells and figure labels (a one-file
framework whose tables name each item's free-text source), questions, answers, explanations,
failures, labels and notes -- and come out inert: the report page and the viewer's pages carry
no tag, attribute or script the page did not write (an HTML parser checks every one; Chromium
runs a few), the exports hold no formula, the terminal no control character and no markup
read. The viewer's routes, fuzzed with malformed requests, answer 4xx and stay up."""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import groundcover
from groundcover.pipelines.reports.exports.cells import (
    from_spreadsheet,
    spreadsheet_cell,
)
from groundcover.pipelines.runtime.contract.plugins import from_file
from groundcover.pipelines.runtime.terminal import UNPRINTABLE, printable
from groundcover.testing import ScriptedClient

FRAMEWORK = Path(__file__).parent / "fixtures" / "frameworks" / "sources.py"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
MARK = "data-pwned"  # what a payload that ran sets on <body>
RUN_IT = f"document.body.setAttribute('{MARK}','1')"

HOSTILE = [
    f'[link=x"><img/src/onerror={RUN_IT}>]sys[/link]',
    f'<img src=x onerror="{RUN_IT}">',
    f'"><script>{RUN_IT}</script>',
    f"</script><script>{RUN_IT}</script><!--",
    f"javascript:{RUN_IT}",
    f"<svg onload={RUN_IT}><a xlink:href='javascript:{RUN_IT}'>x</a></svg>",
    "{{ 7*7 }}{% if 1 %}jinja{% endif %}${7*7}#{7*7}",
    "[bold red]loud[/] [/] [link=https://x.example]link[/link]",
    "\x1b[31mred\x1b]0;title\x07\x1b]8;;http://x.example\x1b\\osc8\x1b]8;;\x1b\\\x9b2J",
    "\u202egnp.exe\u2066iso\u2069\u200f\u061c",
    '=HYPERLINK("http://x.example","click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "\tTAB",
    "\rCR",
    "$\\frac{x$ and $$",
    "'=quoted",
]
SURROGATE_FREE = st.characters(blacklist_categories=("Cs",))
HOSTILE_TEXT = st.one_of(
    st.sampled_from(HOSTILE),
    st.lists(
        st.one_of(st.sampled_from(HOSTILE), st.text(SURROGATE_FREE, max_size=12)),
        min_size=1,
        max_size=3,
    ).map("".join),
).filter(lambda text: 0 < len(text) <= 160)


@pytest.fixture(scope="module")
def sources():
    _, found = from_file(str(FRAMEWORK))
    return found


def make_run(framework: Any, hostile: str, root: Path) -> Path:
    """A run of the sources framework with ``hostile`` in every text field: one scored item,
    one whose stage failed, one that raised (scripted judge: yes)."""
    items = root / "items.jsonl"
    rows = [
        {"id": f"a{hostile}", "question": f"Q {hostile}", "answer": f"A {hostile}"}
        | {"source": hostile},
        {"id": f"b{hostile}", "question": f"Q {hostile}", "answer": hostile}
        | {"source": f"{hostile}!", "fail": "parse"},
        {"id": f"c{hostile}", "question": hostile, "answer": "x"}
        | {"source": hostile, "fail": "raise"},
    ]
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = groundcover.evaluate(
        framework,
        options={"input": str(items)},
        client=ScriptedClient({"sourced": "yes"}),
        run={"run_dir": str(root / "run"), "cache": None},
    )
    assert [r.status for r in done.results] == ["ok", "unparseable", "error"]
    return done.run_dir


class Structure(HTMLParser):
    """Every tag, attribute and script of a page, as a browser's parser finds them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str, str]] = []
        self.scripts: list[tuple[str, str]] = []  # (type, text)
        self._in_script: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]
        if tag == "script":
            self._in_script = dict(attrs).get("type") or ""
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            kind, text = self.scripts[-1]
            self.scripts[-1] = (kind, text + data)


def structure(page: str) -> Structure:
    parsed = Structure()
    parsed.feed(page)
    parsed.close()
    return parsed


def assert_inert(page: str, baseline: Structure) -> None:
    """No tag the page's own template does not write, no event handler, no script URL, the
    page's own scripts only, and every JSON block still JSON."""
    found = structure(page)
    assert found.tags <= baseline.tags, found.tags - baseline.tags
    handlers = [(t, n) for t, n, _ in found.attributes if n.lower().startswith("on")]
    assert not handlers, handlers
    for tag, name, value in found.attributes:
        if name.lower() in ("href", "src", "action", "formaction", "xlink:href", "data"):
            assert not re.sub(r"[\s\x00-\x1f]", "", value).lower().startswith("javascript:"), (
                tag,
                name,
                value,
            )
    assert [kind for kind, _ in found.scripts] == [kind for kind, _ in baseline.scripts]
    for kind, text in found.scripts:
        if kind == "application/json":
            json.loads(text)


@pytest.fixture(scope="module")
def baseline(sources, tmp_path_factory) -> dict[str, Structure]:
    """The page's own structure, from a run of plain text."""
    from groundcover.pipelines.reports.pages.report_html import render

    run = make_run(sources, "plain words", tmp_path_factory.mktemp("plain"))
    with served(run) as (url, _):
        pages = {"view": get(url + "/"), "label": get(url + "/label?run=0")}
    return {"report": structure(render([run]))} | {k: structure(v) for k, v in pages.items()}


@contextlib.contextmanager
def served(run: Path) -> Iterator[tuple[str, Any]]:
    from groundcover.pipelines.reports.pages.viewer import Viewer, make_server

    viewer = Viewer([run])
    server = make_server(viewer, "127.0.0.1", 0, None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", viewer
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback only
        return response.read().decode()


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a JSON answer")

    return json.loads(text, parse_constant=refuse)


def post(url: str, path: str, body: Any, token: str) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("X-Groundcover-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.status, strict_json(response.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, strict_json(exc.read().decode())


def token_of(label_page: str) -> str:
    found = re.search(r'<meta name="gc-token" content="([^"]+)">', label_page)
    assert found is not None
    return found[1]


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=HOSTILE_TEXT)
@example(hostile="\r")  # an id that ends in a blank is that item, never another
@example(hostile="0\xa01")  # a no-break space in a table cell
def test_hostile_text_in_every_field_leaves_page_view_exports_and_terminal_inert(
    sources, baseline, hostile
):
    from groundcover.pipelines.reports.exports.export import export_runs
    from groundcover.pipelines.reports.pages.report_html import render
    from groundcover.pipelines.reports.report import report
    from groundcover.pipelines.runtime.terminal import terminal

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        run = make_run(sources, hostile, root)
        assert_inert(render([run]), baseline["report"])
        with served(run) as (url, _viewer):
            label_page = get(url + "/label?run=0")
            assert_inert(label_page, baseline["label"])
            token = token_of(label_page)
            item = f"a{hostile}"
            status, _ = post(
                url,
                "/api/labels",
                {"id": item, "label": 0.5}
                | {"annotator": hostile[:150] or "x", "note": hostile, "run": 0},
                token,
            )
            assert status in (200, 400)  # an annotator of blanks is refused, with a reason
            status, _ = post(
                url,
                "/api/overrides",
                {"id": item, "score": 0.0}
                | {"reason": f"because {hostile}", "annotator": "reviewer", "run": 0},
                token,
            )
            assert status == 200
            assert_inert(get(url + "/"), baseline["view"])
            for path in ("/api/items?run=0", "/api/queue?run=0&annotator=reviewer"):
                strict_json(get(url + path))
        exported = export_runs([run], root / "rows.csv", "csv")[0]
        with exported.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                for cell in row.values():
                    if cell and cell.startswith(("=", "+", "-", "@", "\t", "\r")):
                        float(cell)  # only a number may begin so: it stays a number
        shown = io.StringIO()
        report([run], False, terminal(file=shown, width=400))
        text = shown.getvalue()
        assert not UNPRINTABLE.search(text)
        # the source's cell as written, its escapes shown (a long one wrapped in its column)
        unwrapped = re.sub(r"[\s│]", "", text)  # any blank (no-break spaces too) and the box
        assert re.sub(r"\s", "", printable(hostile)) in unwrapped


def test_the_terminal_shows_markup_as_written_and_writes_no_control_character(sources, tmp_path):
    run = make_run(sources, HOSTILE[7] + HOSTILE[8] + HOSTILE[9], tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "groundcover", "report", str(run), "--framework", str(FRAMEWORK)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "400"} | dict(__import__("os").environ),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\x1b" not in done.stdout + done.stderr and "\u202e" not in done.stdout
    assert "[bold red]loud[/]" in done.stdout  # read as text, not as a style
    assert "\\x1b[31mred" in done.stdout and "\\u202egnp.exe" in done.stdout


@pytest.mark.skipif(BROWSER is None, reason="no chromium: ./setup.sh installs Debian's chromium")
def test_payloads_never_run_in_chromium_on_the_page_or_the_labelling_page(sources, tmp_path):
    from groundcover.pipelines.reports.pages.report_html import write_html

    hostile = "".join(HOSTILE[:6])
    run = make_run(sources, hostile, tmp_path)
    page = write_html([run], tmp_path / "page.html")
    pages = [page.resolve().as_uri(), page.resolve().as_uri() + "#item=0:" + f"a{hostile}"]
    with served(run) as (url, _):
        pages += [url + "/", url + "/label?run=0"]
        for address in pages:
            dom = subprocess.run(
                [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
                + ["--disable-background-networking", "--virtual-time-budget=4000"]
                + ["--dump-dom", address],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            assert "<body" in dom, address
            assert not re.search(rf"<body[^>]*{MARK}", dom), address  # no payload ran
            assert "sys[/link]" in dom or "/label" in address  # the text is there, as text


# ---- the viewer's routes, fuzzed ----------------------------------------------------------


def raw_request(port: int, request: bytes) -> bytes:
    """``request`` sent as it is; the whole answer (an answer, never a dropped connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        connection.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    head = answer.split(b"\r\n", 1)[0].split()
    assert len(head) >= 2 and head[0].startswith(b"HTTP/1."), answer[:200]
    return int(head[1])


@pytest.fixture(scope="module")
def fuzzed(sources, tmp_path_factory) -> Iterator[tuple[int, str]]:
    run = make_run(sources, "plain", tmp_path_factory.mktemp("fuzz"))
    with served(run) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        yield port, token_of(get(url + "/label?run=0"))


HEADERS = st.dictionaries(
    st.sampled_from(["Content-Length", "Content-Type", "Origin", "Sec-Fetch-Site", "Host"]),
    st.one_of(
        st.sampled_from(["-1", "abc", "1e3", " 5", "99999999999", "", "0", "null"]),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    ),
    max_size=4,
)
BODIES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [b"NaN", b'{"run": NaN}', b'{"run": "0"}', b'{"run": 1.5}', b'{"run": true}', b"[]"]
        + [b'{"run": 0, "id": 5}', b'{"run": 0, "id": "aplain", "label": Infinity}']
        + [b'{"run": 0, "id": "aplain", "label": 1e999}', b'{"run": 99}', b"{" * 5000]
        + [b'{"run": 0, "id": "aplain", "label": 0.5, "annotator": "x", "note": 3}']
        + [b'{"run": 0, "id": "aplain", "score": "high", "reason": "r", "annotator": "x"}']
        + [b'{"run": 0, "id": "aplain", "withdraw": "yes", "annotator": "x"}']
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.one_of(
        st.sampled_from(["/", "/label", "/api/labels", "/api/overrides", "/api/items"]),
        st.sampled_from(["/api/item?run=x", "/api/unit?run=0&key=-1", "/label?run=7"]),
        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map("/".__add__),
    ),
    headers=HEADERS,
    body=BODIES,
    with_token=st.booleans(),
)
def test_malformed_requests_are_answered_4xx_and_the_server_stays_up(
    fuzzed, method, path, headers, body, with_token
):
    port, token = fuzzed
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if with_token:
        lines.append(f"X-Groundcover-Token: {token}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if "Content-Length" not in headers and method == "POST" and body:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\nConnection: close\r\n\r\n").encode() + body
    status = status_of(raw_request(port, request))
    assert status < 500, (method, path, headers, body[:80], status)
    assert (
        status_of(
            raw_request(
                port,
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode(),
            )
        )
        == 200
    )


def test_a_foreign_host_or_origin_is_refused_and_the_page_keeps_its_token(fuzzed):
    """DNS rebinding: a page on another name that resolves to 127.0.0.1 reaches the server
    but is not answered, so it never reads the labelling page's token; a write from another
    origin is refused even with the token."""
    port, token = fuzzed
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1:1", "localhost.:80"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/label?run=0", headers={"Host": host})
        answer = connection.getresponse()
        assert answer.status == 421 and token not in answer.read().decode()
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/api/ready", headers={"Host": name})
        assert connection.getresponse().status == 200
    body = json.dumps({"run": 0, "id": "aplain", "label": 0.5, "annotator": "x"})
    for origin, expected in (("http://attacker.example", 403), (f"http://localhost:{port}", 200)):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request(
            "POST",
            "/api/labels",
            body=body,
            headers={"Origin": origin, "X-Groundcover-Token": token, "Host": f"127.0.0.1:{port}"}
            | {"Content-Type": "application/json"},
        )
        assert connection.getresponse().status == expected, origin


def test_each_malformed_write_names_its_field(fuzzed):
    port, token = fuzzed
    cases = {
        b'{"run": "0"}': (400, "run"),
        b'{"run": 0, "id": "aplain", "label": NaN, "annotator": "x"}': (400, "NaN"),
        b'{"run": 0, "id": "aplain", "label": 1e999, "annotator": "x"}': (400, "label"),
        b'{"run": 0, "id": "aplain", "label": 7, "annotator": "x"}': (400, "label"),
        b'{"run": 0, "id": "aplain", "label": 0.5, "annotator": "x", "note": 3}': (400, "note"),
    }
    for body, (status, field) in cases.items():
        answer = raw_request(
            port,
            f"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Groundcover-Token: "
            f"{token}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body,
        )
        assert status_of(answer) == status and field in answer.decode().split("\r\n\r\n")[1]
    for length, status in (("-1", 400), ("abc", 400), (str(2 << 20), 413)):
        answer = raw_request(
            port,
            f"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Groundcover-Token: "
            f"{token}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{{}}".encode(),
        )
        assert status_of(answer) == status
    missing = f"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Groundcover-Token: "
    assert status_of(raw_request(port, (missing + f"{token}\r\n\r\n").encode())) == 411


def test_the_usual_port_taken_a_free_one_is_used(sources, tmp_path):
    from groundcover.pipelines.reports.pages.viewer import DEFAULT_PORT, Viewer, bind

    run = make_run(sources, "plain", tmp_path)
    holder = socket.socket()
    try:
        with contextlib.suppress(OSError):  # held by someone else already: the same case
            holder.bind(("127.0.0.1", DEFAULT_PORT))
        holder.listen()
        server = bind(Viewer([run]), "127.0.0.1", None, None)
        try:
            assert server.server_address[1] != DEFAULT_PORT
        finally:
            server.server_close()
    finally:
        holder.close()


# ---- exports and secrets, worked out by hand ----------------------------------------------


def test_spreadsheet_cells_by_hand():
    assert spreadsheet_cell('=HYPERLINK("x")') == '\'=HYPERLINK("x")'
    assert spreadsheet_cell("+1+1") == "'+1+1"
    assert spreadsheet_cell("@SUM(A1)") == "'@SUM(A1)"
    assert spreadsheet_cell("\tx") == "'\tx" and spreadsheet_cell("\rx") == "'\rx"
    assert spreadsheet_cell("-2+3") == "'-2+3"
    assert spreadsheet_cell("-0.5") == "-0.5" and spreadsheet_cell("+3e-2") == "+3e-2"
    assert spreadsheet_cell(-0.5) == -0.5 and spreadsheet_cell(None) is None
    assert spreadsheet_cell("plain") == "plain" and spreadsheet_cell("a=b") == "a=b"
    assert spreadsheet_cell("'=x") == "''=x"  # a quote of its own survives the way back
    assert spreadsheet_cell("'plain") == "'plain"


@given(st.text(SURROGATE_FREE))
def test_a_cell_read_back_is_the_text_written(text):
    cell = spreadsheet_cell(text)
    assert from_spreadsheet(cell) == text
    if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
        float(cell)


def test_labels_exported_to_csv_come_back_with_their_ids(sources, tmp_path):
    from groundcover.pipelines.reports.people.exchange import export_tasks, import_labels

    hostile = '=HYPERLINK("http://x.example")'
    run = make_run(sources, hostile, tmp_path)
    out = tmp_path / "tasks.csv"
    export_tasks(run, out, "csv")
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert all(not row["id"].startswith("=") for row in rows)
    for row in rows:
        row["score"] = "1"
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert import_labels(run, out) >= 1
    labelled = [json.loads(line)["id"] for line in (run / "labels" / "labels.jsonl").open()]
    assert f"a{hostile}" in labelled  # the id as it was, the quote taken off


def test_secrets_are_redacted_by_hand():
    from groundcover.serving.redact import REDACTED, redact, remember

    remember("sk-live-0123456789abcdef")
    remember("EMPTY")  # a placeholder, not a key
    assert redact("401: key sk-live-0123456789abcdef is wrong") == f"401: key {REDACTED} is wrong"
    assert redact("Authorization: Bearer abc.def-ghi_jkl") == f"Authorization: Bearer {REDACTED}"
    assert redact("http://user:hunter22@judge:8000/v1") == f"http://user:{REDACTED}@judge:8000/v1"
    assert redact("url?api_key=abcdef123&x=1") == f"url?api_key={REDACTED}&x=1"
    assert redact('{"api-key": "abcdef123"}') == f'{{"api-key": "{REDACTED}"}}'
    assert redact("EMPTY answers stay") == "EMPTY answers stay"


def test_a_server_that_echoes_the_key_never_gets_it_stored_or_printed(sources, tmp_path):
    """A judge answering 400 with the request's own Authorization header in its error body:
    the item is recorded as an error whose failure holds no key, and nothing printed does."""
    from aiohttp import web

    from tests.support.loopback import serve_app

    key = "sk-echo-9876543210fedcba"

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "root": "m"}]})

    async def complete(request: web.Request) -> web.Response:
        echoed = request.headers.get("Authorization", "")
        return web.json_response({"error": {"message": f"bad request from {echoed}"}}, status=400)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "q", "question": "Q?", "answer": "A", "source": "s"}))
    env = dict(__import__("os").environ) | {"ECHO_KEY": key}
    with serve_app(app) as url:
        done = subprocess.run(
            [sys.executable, "-m", "groundcover", "eval", str(FRAMEWORK), str(items)]
            + ["--endpoint", url, "--model", "m", "--api-key-env", "ECHO_KEY", "--no-cache"]
            + ["--run-dir", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    assert done.returncode == 4, done.stderr[-2000:]  # the item failed, recorded
    stored = "".join(p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file())
    record = json.loads((tmp_path / "run" / "results.jsonl").read_text().splitlines()[0])
    assert record["status"] == "error" and "[redacted]" in record["failure"]["error"]
    assert key not in stored and key not in done.stdout + done.stderr


def test_label_files_from_elsewhere_nan_and_links_are_refused(sources, tmp_path):
    from groundcover.pipelines.reports.people.labels import append_labels, label_rows
    from groundcover.pipelines.runtime.contract.errors import UserError

    run = make_run(sources, "plain", tmp_path)
    labels = run / "labels"
    labels.mkdir(exist_ok=True)
    (labels / "labels.jsonl").write_text('{"id": "aplain", "stage": "score", "label": NaN}\n')
    with pytest.raises(UserError, match=r"labels.jsonl:1: record 'aplain': field label"):
        label_rows(run)
    # a label file linked to a file of the reader's: never appended to, never read
    precious = tmp_path / "bashrc"
    precious.write_text("mine\n")
    (labels / "labels.jsonl").unlink()
    (labels / "labels.jsonl").symlink_to(precious)
    line = {"id": "aplain", "stage": "score", "key": 0, "label": 1.0}
    with pytest.raises(UserError, match="symbolic link"):
        append_labels(run, [line])
    with pytest.raises(UserError, match="symbolic link"):
        label_rows(run)
    assert precious.read_text() == "mine\n"
    # the folder itself a link
    (labels / "labels.jsonl").unlink()
    labels.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    labels.symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        append_labels(run, [line])
    assert not list(elsewhere.iterdir())
