"""What a number rests on: every input by content digest, every model by what it is, a changed
input refused by name, an endpoint asked before anything is written, and all of it shown.

The CRUX runs here score with ``--no-rate`` (the ratings file alone decides), so they need no
model; the endpoint runs talk to a real HTTP server on 127.0.0.1 that answers like vLLM.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Annotated, Any

import pytest
from aiohttp import web
from pydantic import BaseModel
from typer.testing import CliRunner

from groundcover.pipelines.cli.main import app
from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
from groundcover.pipelines.runtime.contract.plugins import studies
from groundcover.pipelines.runtime.contract.roles import RoleSpec
from groundcover.pipelines.runtime.store.provenance import (
    InputFile,
    NotContent,
    input_records,
    unmarked_fields,
)
from groundcover.serving import content
from groundcover.serving.content import digest_path, file_digest, filesystem_of
from tests.support.loopback import serve_app
from tests.test_crux import crux_options, write_crux

runner = CliRunner()


def crux_data(where: Path) -> dict[str, Path]:
    where.mkdir(parents=True, exist_ok=True)
    return write_crux(where)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- the contract: every options model says which fields are content ---------------------------


def test_every_options_model_says_which_of_its_fields_are_content():
    models = [s.Options for s in studies().values()] + [EvaluatorConfig, RunConfig, RoleSpec]
    unmarked = sorted({f for m in models for f in unmarked_fields(m)})
    assert unmarked == [], f"neither Content nor NotContent (with a reason): {unmarked}"


def test_the_contract_catches_a_path_or_model_field_left_unmarked():
    class Options(BaseModel):
        data: Path
        maybe: Path | None = None
        tokenizer: str = "bert"
        judge_models: list[str] = []
        given: InputFile
        where: Annotated[Path, NotContent("only where output goes")]
        max_model_len: int = 4  # a number, not a model

    found = unmarked_fields(Options)
    assert found == [
        "Options.data",
        "Options.maybe",
        "Options.tokenizer",
        "Options.judge_models",
    ]


def test_every_crux_input_enters_the_identity_by_digest(tmp_path):
    paths = write_crux(tmp_path)
    options = crux_options(paths)
    records = input_records(options)
    assert {name: r["sha256"] for name, r in records.items()} == {
        name: sha(paths[key])
        for name, key in [
            ("input", "run"),
            ("topics", "topics"),
            ("passages", "passages"),
            ("ratings", "ratings"),
        ]
    }
    assert records["ratings"]["size"] == paths["ratings"].stat().st_size


# ---- digests -------------------------------------------------------------------------------------


def test_a_directory_digest_is_its_files_by_content_and_a_rerun_reads_nothing(
    tmp_path, monkeypatch
):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "weights.bin").write_bytes(b"w" * 5000)
    (model / "sub" / "config.json").write_text("{}")
    (model / ".cache").mkdir()
    (model / ".cache" / "download.lock").write_text("timestamps of a download")
    memo = tmp_path / "memo"
    old = time.time() - 60  # older than the racy window: remembered
    for f in [model / "weights.bin", model / "sub" / "config.json"]:
        import os

        os.utime(f, (old, old))
    first = digest_path(model, memo)
    lines = f"sub/config.json\0{sha(model / 'sub' / 'config.json')}\n"
    lines += f"weights.bin\0{sha(model / 'weights.bin')}\n"
    assert first.sha256 == hashlib.sha256(lines.encode()).hexdigest()
    assert (first.size, first.files) == (5002, 2)  # the dot-folder is not content

    read: list[Path] = []
    monkeypatch.setattr(content, "file_digest", lambda p: read.append(p) or file_digest(p))
    assert digest_path(model, memo) == first and read == []  # a stat per file, no read
    (model / ".cache" / "download.lock").write_text("other timestamps")
    assert digest_path(model, memo) == first
    (model / "weights.bin").write_bytes(b"v" * 5000)  # retrained in place: same size
    changed = digest_path(model, memo)
    assert changed.sha256 != first.sha256 and read == [model / "weights.bin"]
    assert digest_path(model / "weights.bin", memo).sha256 == sha(model / "weights.bin")


def test_a_file_written_just_now_is_hashed_but_not_remembered(tmp_path, monkeypatch):
    path = tmp_path / "ratings.jsonl"
    path.write_text("a\n")
    read: list[Path] = []
    monkeypatch.setattr(content, "file_digest", lambda p: read.append(p) or file_digest(p))
    digest_path(path, tmp_path / "memo")
    digest_path(path, tmp_path / "memo")
    assert len(read) == 2  # its mtime could still change within the same tick


def test_the_file_system_of_a_path_is_read_from_the_mount_table(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/root / ext4 rw 0 0\n"
        "nas:/export/home /home nfs4 rw,relatime 0 0\n"
        "nas:/scratch /home/me/scratch lustre rw 0 0\n"
    )
    assert filesystem_of("/home/me/runs/cache.sqlite", str(mounts)) == "nfs4"
    assert filesystem_of("/home/me/scratch/x", str(mounts)) == "lustre"
    assert filesystem_of("/tmp/x", str(mounts)) == "ext4"
    monkeypatch.setenv("GROUNDCOVER_SHARED_FS", "1")
    assert content.on_network_filesystem(tmp_path)
    monkeypatch.setenv("GROUNDCOVER_SHARED_FS", "0")
    assert not content.on_network_filesystem(tmp_path)


# ---- a changed input is never reported as current ------------------------------------------------


def crux_command(paths: dict[str, Path], run_dir: Path | None, *extra: str) -> list[str]:
    where = ["--run-dir", str(run_dir)] if run_dir else []
    return [
        "eval",
        "crux",
        str(paths["run"]),
        "--topics",
        str(paths["topics"]),
        "--passages",
        str(paths["passages"]),
        "--ratings",
        str(paths["ratings"]),
        "--no-rate",
        *where,
        "--quiet",
        *extra,
    ]


def records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    return [{k: r[k] for k in ("id", "status", "score", "details")} for r in map(json.loads, lines)]


def rewrite_ratings(path: Path, rating: int) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r | {"rating": rating}) + "\n" for r in rows))


@pytest.mark.parametrize("default_dir", [False, True], ids=["run-dir", "default-dir"])
def test_rewritten_ratings_are_refused_by_name_then_superseded(tmp_path, monkeypatch, default_dir):
    monkeypatch.chdir(tmp_path)
    paths = crux_data(tmp_path / "data")
    run_dir = None if default_dir else tmp_path / "run"
    first = runner.invoke(app, crux_command(paths, run_dir))
    assert first.exit_code == 0, first.output
    made = run_dir or next((tmp_path / "runs").iterdir())
    before = records(made)
    assert before[0]["score"] > 0
    old_digest = sha(paths["ratings"])

    rewrite_ratings(paths["ratings"], 0)  # the same path, every rating 0
    refused = runner.invoke(app, crux_command(paths, run_dir))
    assert refused.exit_code == 2
    line = " ".join(refused.output.split())
    new_digest = sha(paths["ratings"])
    assert f"input ratings {old_digest[:12]} → {new_digest[:12]}" in line
    assert "--supersede" in line and "--run-dir" in line
    assert "passages" not in line and "topics" not in line  # only what changed is named
    assert records(made) == before  # nothing was written

    again = runner.invoke(app, crux_command(paths, run_dir, "--supersede"))
    assert again.exit_code == 0, again.output
    fresh = runner.invoke(app, crux_command(paths, tmp_path / "fresh"))
    assert fresh.exit_code == 0, fresh.output
    assert records(made) == records(tmp_path / "fresh") != before
    assert [r["status"] for r in records(made)] == ["undefined"]  # nothing answerable now
    kept = list((made / "superseded").iterdir())
    assert len(kept) == 1 and records(kept[0]) == before
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["inputs"]["ratings"]["sha256"] == new_digest
    assert manifest["inputs_fingerprinted"] is True

    resumed = runner.invoke(app, crux_command(paths, run_dir, "--supersede"))
    assert resumed.exit_code == 0  # unchanged: --supersede resumes, sets nothing aside
    assert len(list((made / "superseded").iterdir())) == 1


def test_rewritten_passages_are_refused_by_name(tmp_path):
    paths = crux_data(tmp_path / "data")
    run_dir = tmp_path / "run"
    assert runner.invoke(app, crux_command(paths, run_dir)).exit_code == 0
    old = sha(paths["passages"])
    rows = [json.loads(line) for line in paths["passages"].read_text().splitlines()]
    paths["passages"].write_text(
        "".join(json.dumps(r | {"text": r["text"] + " (revised)"}) + "\n" for r in rows)
    )
    refused = runner.invoke(app, crux_command(paths, run_dir))
    assert refused.exit_code == 2
    line = " ".join(refused.output.split())
    assert f"input passages {old[:12]} → {sha(paths['passages'])[:12]}" in line


def test_a_moved_input_with_the_same_content_resumes(tmp_path):
    paths = crux_data(tmp_path / "data")
    run_dir = tmp_path / "run"
    assert runner.invoke(app, crux_command(paths, run_dir)).exit_code == 0
    moved = tmp_path / "elsewhere.jsonl"
    moved.write_bytes(paths["ratings"].read_bytes())
    paths["ratings"] = moved
    again = runner.invoke(app, crux_command(paths, run_dir))
    assert again.exit_code == 0, again.output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["inputs"]["ratings"]["path"] == str(moved)  # where it lives now
    assert len(manifest["resumed_at"]) == 1


def test_report_html_and_compare_show_what_each_run_rests_on(tmp_path):
    paths = crux_data(tmp_path / "data")
    assert runner.invoke(app, crux_command(paths, tmp_path / "a")).exit_code == 0
    digest_a = sha(paths["ratings"])
    rewrite_ratings(paths["ratings"], 5)
    assert runner.invoke(app, crux_command(paths, tmp_path / "b")).exit_code == 0
    digest_b = sha(paths["ratings"])

    shown = runner.invoke(app, ["report", str(tmp_path / "a"), "--json"])
    provenance = json.loads(shown.output.splitlines()[0])["provenance"]
    assert provenance["fingerprinted"] is True
    by_name = {i["name"]: i for i in provenance["inputs"]}
    assert by_name["ratings"]["sha256"] == digest_a
    assert by_name["topics"]["sha256"] == sha(paths["topics"])
    text = runner.invoke(app, ["report", str(tmp_path / "a")], env={"COLUMNS": "200"})
    assert "rests on" in text.output and digest_a[:12] in text.output

    page = tmp_path / "page.html"
    made = runner.invoke(app, ["report", str(tmp_path / "a"), "--html", str(page)])
    assert made.exit_code == 0, made.output
    html = page.read_text()
    assert "What these numbers rest on" in html and digest_a[:12] in html

    compared = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert compared.exit_code == 0, compared.output
    pair = json.loads(compared.output)["pairs"][0]
    assert pair["differs"] == [{"what": "input ratings", "a": digest_a[:12], "b": digest_b[:12]}]
    said = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert f"input ratings {digest_a[:12]} → {digest_b[:12]}" in " ".join(said.output.split())


# ---- endpoints: asked before anything is written -------------------------------------------------


class FakeVllm:
    """A server on 127.0.0.1 shaped like vLLM: ``GET /v1/models`` with root and max_model_len,
    and chat completions whose answer is the weights' name (what changes when a model does)."""

    def __init__(self, weights: str = "A", root: str = "/models/tiny", max_len: int = 2048):
        self.weights, self.root, self.max_len = weights, root, max_len
        self.requests = 0

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            entry = {"id": "tiny", "object": "model", "root": self.root}
            entry["max_model_len"] = self.max_len
            adapter = {"id": "claims", "root": "/adapters/claims", "parent": "tiny"}
            return web.json_response({"object": "list", "data": [entry, adapter]})

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests += 1
            text = f"{body['model']} weights {self.weights}"
            message = {"role": "assistant", "content": text}
            return web.json_response(
                {
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                    "model": body["model"],
                }
            )

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        return app


def questions(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"q{n}", "question": f"Q{n}?"}) + "\n" for n in (1, 2))
    )
    return path


def generate(q: Path, url: str, run_dir: Path, *extra: str):
    return runner.invoke(
        app,
        ["generate", str(q), "--endpoint", url, "--run-dir", str(run_dir), "--quiet", *extra],
    )


def test_a_dead_endpoint_is_one_line_within_seconds_and_nothing_is_written(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nobody listens on: refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    done = generate(questions(tmp_path), f"http://127.0.0.1:{port}/v1", tmp_path / "run")
    took = time.monotonic() - started
    assert done.exit_code == 1
    assert f"http://127.0.0.1:{port}/v1: connection refused" in done.output
    assert len(done.output.strip().splitlines()) == 1, done.output  # one line
    assert took < 3.0, took
    assert not (tmp_path / "run").exists()


def test_a_model_or_adapter_the_server_does_not_serve_is_one_line_listing_what_it_does(tmp_path):
    with serve_app(FakeVllm().app()) as url:
        wrong = generate(questions(tmp_path), url, tmp_path / "run", "--model", "tiny-2")
        assert wrong.exit_code == 2
        assert "--model tiny-2:" in wrong.output and "it serves: claims, tiny" in wrong.output
        adapter = generate(
            questions(tmp_path), url, tmp_path / "run", "--model", "tiny", "--adapter", "other"
        )
        assert adapter.exit_code == 2 and "adapter 'other' is not served" in adapter.output
    assert not (tmp_path / "run").exists()


def test_what_the_endpoint_reports_identifies_the_model(tmp_path):
    q = questions(tmp_path)
    server = FakeVllm()
    cache = tmp_path / "c.yaml"
    cache.write_text(f"run:\n  cache: {tmp_path / 'responses.sqlite'}\n")
    with serve_app(server.app()) as url:
        first = generate(q, url, tmp_path / "run", "--model", "tiny", "--config", str(cache))
        assert first.exit_code == 0, first.output
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        base = manifest["roles"]["answer"]["content"]["base"]
        assert base["root"] == "/models/tiny" and base["max_model_len"] == 2048
        assert base["revision"].startswith("endpoint:")
        assert server.requests == 2

        # the server now serves other weights from another root: the run is another run, and
        # the cache does not answer for the old model
        server.root, server.weights = "/models/tiny-v2", "B"
        refused = generate(q, url, tmp_path / "run", "--model", "tiny", "--config", str(cache))
        assert refused.exit_code == 2 and "model answer" in refused.output
        fresh = generate(q, url, tmp_path / "run2", "--model", "tiny", "--config", str(cache))
        assert fresh.exit_code == 0, fresh.output
        assert server.requests == 4
        answers = [r["details"]["response"] for r in records(tmp_path / "run2")]
        assert answers == ["tiny weights B", "tiny weights B"]

        # a declared revision is part of the identity too
        labelled = generate(
            q,
            url,
            tmp_path / "run2",
            "--model",
            "tiny",
            "--model-revision",
            "v2",
            "--config",
            str(cache),
        )
        assert labelled.exit_code == 2 and "revision" in labelled.output
