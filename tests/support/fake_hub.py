"""A loopback HTTP server that answers what ``huggingface_hub`` asks a Hub for under
``HF_ENDPOINT``: a dataset's revision info (``/api/datasets/REPO/revision/REV``) and its files
(``HEAD`` / ``GET /datasets/REPO/resolve/REV/PATH``, with byte ranges). Tests make the repositories
(commits of {path: bytes}), can cut a download midway, and read the request log.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

API = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/?]+)$")
RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
# a model repository: the same answers, without the /datasets prefix
MODEL_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/?]+)$")
TREE = re.compile(r"^/api/(?:models|datasets)/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/?]+)$")
MODEL_RESOLVE = re.compile(
    r"^/(?P<repo>(?!datasets/|api/)[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"
)


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    license: str = "mit"
    token: str | None = None  # a gated repository: files only for ``Authorization: Bearer``

    def commit(self, files: dict[str, bytes], ref: str = "main", sha: str | None = None) -> str:
        """A commit of ``files`` that ``ref`` then names; ``sha`` makes it the commit a catalogue
        entry pins."""
        seed = json.dumps(sorted(files)).encode() + str(len(self.commits)).encode()
        sha = sha or hashlib.sha1(seed + b"".join(files.values())).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        return rev if rev in self.commits else self.refs.get(rev)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, range header)
        self.cut: dict[str, int] = {}  # path -> bytes to send before closing, once
        self.static: dict[str, bytes] = {}  # plain HTTPS homes: URL path -> bytes
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def repo(self, name: str) -> Repo:
        return self.repos.setdefault(name, Repo())

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        raw = urlsplit(req.path).path  # matched quoted: a revision may hold quoted slashes
        path = unquote(raw)
        self.log.append((req.command, path, req.headers.get("Range")))
        if m := API.match(raw) or MODEL_API.match(raw):
            return self._info(req, unquote(m["repo"]), unquote(m["rev"]), body)
        if m := TREE.match(raw):
            return self._tree(req, unquote(m["repo"]), unquote(m["rev"]), body)
        if m := RESOLVE.match(raw) or MODEL_RESOLVE.match(raw):
            return self._file(req, unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"]), body)
        if path in self.static:
            return self._bytes(req, path, self.static[path], {"Accept-Ranges": "bytes"}, body)
        self._send(req, 404, b'{"error": "not found"}', {}, body)

    def _info(self, req, repo_id: str, rev: str, body: bool) -> None:
        repo = self.repos.get(repo_id)
        sha = repo.resolve(rev) if repo else None
        if repo is None or sha is None:
            return self._send(req, 404, b'{"error": "Revision not found"}', {}, body)
        files = repo.commits[sha]
        siblings = [{"rfilename": p, "size": len(b)} for p, b in files.items()]
        info = {
            "id": repo_id,
            "sha": sha,
            "cardData": {"license": repo.license},
            "siblings": siblings,
        }
        self._send(req, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

    def _tree(self, req, repo_id: str, rev: str, body: bool) -> None:
        """Every file of the commit, as the Hub lists a repository's tree (one page)."""
        repo = self.repos.get(repo_id)
        sha = repo.resolve(rev) if repo else None
        if repo is None or sha is None:
            return self._send(req, 404, b'{"error": "Revision not found"}', {}, body)
        entries = [
            {"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
            for p, b in repo.commits[sha].items()
        ]
        headers = {"Content-Type": "application/json"}
        self._send(req, 200, json.dumps(entries).encode(), headers, body)

    def _file(self, req, repo_id: str, rev: str, file: str, body: bool) -> None:
        repo = self.repos.get(repo_id)
        sha = repo.resolve(rev) if repo else None
        if repo is None or sha is None or file not in repo.commits[sha]:
            headers = {"X-Error-Code": "EntryNotFound"}
            return self._send(req, 404, b'{"error": "Entry not found"}', headers, body)
        if repo.token and req.headers.get("Authorization") != f"Bearer {repo.token}":
            headers = {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to it is restricted"}
            return self._send(req, 401, b'{"error": "gated"}', headers, body)
        data = repo.commits[sha][file]
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
        }
        self._bytes(req, file, data, headers, body)

    def _bytes(self, req, file: str, data: bytes, headers: dict[str, str], body: bool) -> None:
        """``data`` from the requested byte on; ``file`` cut once if the test asked for it."""
        status, start = 200, 0
        if body and (wanted := req.headers.get("Range")):
            start = int(wanted.split("=")[1].split("-")[0])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if body and file in self.cut:  # send part of the body, then drop the connection
            sent = self.cut.pop(file)
            req.send_response(status)
            for k, v in headers.items():
                req.send_header(k, v)
            req.send_header("Content-Length", str(len(data) - start))
            req.end_headers()
            req.wfile.write(data[start : start + sent])
            req.wfile.flush()
            req.close_connection = True
            return
        self._send(req, status, data[start:], headers, body, length=len(data) - start)

    @staticmethod
    def _send(
        req,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
        length: int | None = None,
    ) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(data) if length is None else length))
        req.end_headers()
        if body:
            req.wfile.write(data)
