"""A review of "bought once" against a Batch API of this file's own (independent of
``tests/support/batch_chaos.py``) that misbehaves as the OpenAI and Azure OpenAI Batch APIs do:
a listing that lags its creates or pages badly, creates answered 500 or too late after the
batch was made, output files in odd encodings and orders, ``request_counts`` that lie, 429s
with ``Retry-After``, long ``finalizing``, an expired batch with no output, a file that is 404
before it is there. Real ``groundcover eval`` runs (the two-stage framework of
``tests/test_batch.py``) are driven at it and every line the provider bills is counted by
``custom_id``: each must be billed exactly once and every record must be right."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from tests.support.loopback import serve_app
from tests.test_batch import TEXTS, completion, eval_args, records, write_config

ROOT = Path(__file__).resolve().parents[1]

# the org's other batches, made by someone else between two of ours (the listing is shared)
NOISE = {"groundcover": "someone-else"}


class LyingBatches:
    """An OpenAI-shaped Batch API that bills each line it answers (``billed``, by custom id)
    when its batch finishes -- at ``work`` seconds after the create, polled or not, as a real
    provider's batch runs whether anyone asks -- unless it was cancelled before then.

    Its faults, each off by default: ``lag`` (a batch shows in the listing this many seconds
    after it is made), ``page`` (the most batches a page holds), ``omit_newest`` (every other
    listing page leaves out the newest batch), ``stuck_cursor`` (``after`` ignored: always the
    first page, ``has_more`` true), ``more_forever`` (``has_more`` true on every page),
    ``shuffle_pages`` (a page's batches in another order, the previous page's last one again),
    ``noise`` (others' batches made right after each of ours), ``create_500`` (creates that
    make the batch then answer 500), ``create_late`` (seconds a create waits, the batch made
    after the client gave up), ``styles`` (output oddities: ``crlf``, ``bom``, ``blank_tail``,
    ``extra``, ``dup``, ``foreign``, ``reorder``, ``split``), ``counts`` (``more``: completed
    says two more lines than written; ``zero``), ``poll_429`` (the first polls of each batch
    answered 429 with ``Retry-After: 1``), ``finalizing`` (polls a batch stays
    ``finalizing``), ``expire`` (batch numbers that end ``expired`` with no output file),
    ``missing_first`` (an output file 404 on its first download), ``auth`` (the Authorization
    header every call must carry: 401 otherwise), ``retry_after`` (the header of its 429s)."""

    def __init__(self, work: float = 0.3, **faults: Any):
        self.work = work
        self.lag = faults.pop("lag", 0.0)
        self.page = faults.pop("page", 100)
        self.omit_newest = faults.pop("omit_newest", False)
        self.stuck_cursor = faults.pop("stuck_cursor", False)
        self.more_forever = faults.pop("more_forever", False)
        self.shuffle_pages = faults.pop("shuffle_pages", False)
        self.noise = faults.pop("noise", 0)
        self.create_500: set[int] = set(faults.pop("create_500", ()))
        self.create_late = faults.pop("create_late", 0.0)
        self.styles: set[str] = set(faults.pop("styles", ()))
        self.counts = faults.pop("counts", "")
        self.poll_429 = faults.pop("poll_429", 0)
        self.finalizing = faults.pop("finalizing", 0)
        self.expire: set[int] = set(faults.pop("expire", ()))
        self.missing_first = faults.pop("missing_first", False)
        self.stuck = faults.pop("stuck", False)  # batches stay in_progress
        self.overdue = faults.pop("overdue", False)  # made with expires_at two hours ago
        self.cancelling_forever = faults.pop("cancelling_forever", False)
        self.file_pending = faults.pop("file_pending", 0)  # creates refused: file not processed
        self.create_429 = faults.pop("create_429", 0)  # creates refused by the rate limiter
        self.auth = faults.pop("auth", None)
        self.retry_after = faults.pop("retry_after", "1")
        assert not faults, faults
        self.rng = random.Random(7)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []  # batch ids, oldest first
        self.billed: Counter[str] = Counter()
        self.creates = self.listings = self.online = 0
        self.downloads: Counter[str] = Counter()
        self.cancels: list[str] = []

    # ---- the provider's own clock: batches finish whether polled or not --------------------

    def advance(self) -> None:
        now = time.time()
        for batch in self.batches.values():
            if self.stuck:
                continue
            if batch["status"] == "in_progress" and now >= batch["done_at"]:
                self._finish(batch)

    def settle_all(self) -> None:
        """The end of the test: every batch still running finishes (and bills) as it would."""
        for batch in self.batches.values():
            if batch["status"] in ("in_progress", "finalizing"):
                self._finish(batch)

    def _finish(self, batch: dict[str, Any]) -> None:
        if batch["number"] in self.expire:
            batch["status"] = "expired"
            return
        lines = batch["lines"]
        # "split": the second batch's last two lines fail (server_error, not billed), in the
        # error file, counted as failed; the rest answer in the output file
        failing = 2 if "split" in self.styles and batch["number"] == 2 else 0
        answered, refused = lines[: len(lines) - failing], lines[len(lines) - failing :]
        for line in answered:
            self.billed[line["custom_id"]] += 1
        batch["status"] = "finalizing" if self.finalizing else "completed"
        batch["finalizing_left"] = self.finalizing
        rows = [
            {
                "id": f"req-{batch['id']}-{n}",
                "custom_id": line["custom_id"],
                "response": {
                    "status_code": 200,
                    "request_id": f"r{n}",
                    "body": completion(line["body"]),
                },
                "error": None,
            }
            for n, line in enumerate(answered)
        ]
        errors = [
            {
                "id": f"req-{batch['id']}-e{n}",
                "custom_id": line["custom_id"],
                "response": {
                    "status_code": 500,
                    "request_id": f"e{n}",
                    "body": {
                        "error": {"message": "The server had an error", "type": "server_error"}
                    },
                },
                "error": None,
            }
            for n, line in enumerate(refused)
        ]
        if "extra" in self.styles:
            rows = [row | {"x_region": "eu", "response_ms": 12} for row in rows]
        if "reorder" in self.styles:
            self.rng.shuffle(rows)
        if "dup" in self.styles:
            rows.append(dict(rows[0]))
        if "foreign" in self.styles:
            foreign = dict(rows[0]) | {"custom_id": "not-one-of-yours"}
            rows.insert(1, foreign)
        newline = "\r\n" if "crlf" in self.styles else "\n"
        text = "".join(json.dumps(r) + newline for r in rows)
        if "blank_tail" in self.styles:
            text += newline * 3
        data = text.encode()
        if "bom" in self.styles:
            data = b"\xef\xbb\xbf" + data
        out_id = f"file-out-{batch['id']}"
        self.files[out_id] = data
        batch["output_file_id"] = out_id
        if errors:
            err_id = f"file-err-{batch['id']}"
            self.files[err_id] = "".join(json.dumps(r) + "\n" for r in errors).encode()
            batch["error_file_id"] = err_id
        completed = len(answered)
        if self.counts == "more":
            completed += 2
        elif self.counts == "zero":
            completed = 0
        batch["request_counts"] = {
            "total": len(lines),
            "completed": completed,
            "failed": len(refused),
        }

    # ---- the API ---------------------------------------------------------------------------

    def _public(self, batch: dict[str, Any]) -> dict[str, Any]:
        hidden = ("lines", "done_at", "number", "visible_at", "finalizing_left", "polls")
        return {k: v for k, v in batch.items() if k not in hidden}

    def _make(self, body: dict[str, Any], number: int) -> dict[str, Any]:
        raw = self.files[body["input_file_id"]].decode()
        lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
        now = time.time()
        batch_id = f"batch_{len(self.batches):04d}"
        batch = {
            "id": batch_id,
            "object": "batch",
            "endpoint": body["endpoint"],
            "errors": None,
            "input_file_id": body["input_file_id"],
            "completion_window": body.get("completion_window", "24h"),
            "status": "in_progress",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(now),
            "expires_at": int(now) + (-7200 if self.overdue else 86400),
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
            "lines": lines,
            "done_at": now + self.work,
            "visible_at": now + self.lag,
            "number": number,
            "polls": 0,
        }
        self.batches[batch_id] = batch
        self.order.append(batch_id)
        for _ in range(self.noise):
            other = f"batch_{len(self.batches):04d}"
            self.batches[other] = batch | {"id": other, "metadata": NOISE, "lines": []}
            self.batches[other]["number"] = -1
            self.order.append(other)
        return batch

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "judge"}]})

        async def chat(request: web.Request) -> web.Response:
            self.online += 1
            return web.json_response(completion(await request.json()))

        async def upload(request: web.Request) -> web.Response:
            form = await request.post()
            file_id = f"file-in-{len(self.files)}"
            self.files[file_id] = form["file"].file.read()  # type: ignore[union-attr]
            return web.json_response(
                {"id": file_id, "object": "file", "purpose": "batch", "status": "processed"}
            )

        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            self.creates += 1
            number = self.creates
            if number <= self.create_429:  # refused before anything is made
                message = "Rate limit reached for requests. Please try again in 1s."
                return web.json_response(
                    {"error": {"message": message, "code": "rate_limit_exceeded"}},
                    status=429,
                    headers={"Retry-After": self.retry_after},
                )
            if number <= self.file_pending:  # Azure, just after the upload
                message = (
                    f"The input file '{body['input_file_id']}' is in 'pending' state. Only files "
                    "with status 'Processed' are accepted for batch inferencing. Please check "
                    "the file status and try again"
                )
                return web.json_response(
                    {"error": {"code": "invalid_request", "message": message}}, status=400
                )
            if self.create_late and number == 1:
                await asyncio.sleep(self.create_late)  # the client has given up by now
                self._make(body, number)
                return web.json_response({"error": {"message": "late"}}, status=504)
            batch = self._make(body, number)
            if number in self.create_500:  # made, and the answer says it was not
                message = "The server had an error while processing your request. Sorry about that!"
                return web.json_response(
                    {"error": {"message": message, "type": "server_error"}}, status=500
                )
            return web.json_response(self._public(batch))

        async def listing(request: web.Request) -> web.Response:
            self.advance()
            self.listings += 1
            now = time.time()
            newest_first = [b for b in reversed(self.order) if now >= self.batches[b]["visible_at"]]
            if self.omit_newest and self.listings % 2 and newest_first:
                newest_first = newest_first[1:]
            limit = min(int(request.query.get("limit", 20)), self.page)
            after = request.query.get("after")
            start = 0
            if after and not self.stuck_cursor and after in newest_first:
                start = newest_first.index(after) + 1
            ids = newest_first[start : start + limit]
            if self.shuffle_pages and start:
                ids = [newest_first[start - 1], *ids]
                self.rng.shuffle(ids)
            more = start + limit < len(newest_first)
            page = {
                "object": "list",
                "data": [self._public(self.batches[b]) for b in ids],
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
                "has_more": more or self.stuck_cursor or self.more_forever,
            }
            return web.json_response(page)

        async def retrieve(request: web.Request) -> web.Response:
            self.advance()
            batch = self.batches.get(request.match_info["id"])
            if batch is None:
                return web.json_response({"error": {"message": "No such batch"}}, status=404)
            batch["polls"] += 1
            if batch["polls"] <= self.poll_429:
                message = "Rate limit reached for requests. Please try again in 1s."
                return web.json_response(
                    {"error": {"message": message, "type": "requests"}},
                    status=429,
                    headers={"Retry-After": self.retry_after},
                )
            if batch["status"] == "finalizing":
                batch["finalizing_left"] -= 1
                if batch["finalizing_left"] < 0:
                    batch["status"] = "completed"
            return web.json_response(self._public(batch))

        async def cancel(request: web.Request) -> web.Response:
            self.advance()
            batch = self.batches[request.match_info["id"]]
            self.cancels.append(batch["id"])
            if batch["status"] == "in_progress":
                batch["status"] = "cancelling" if self.cancelling_forever else "cancelled"
            return web.json_response(self._public(batch))

        async def content(request: web.Request) -> web.Response:
            file_id = request.match_info["id"]
            self.downloads[file_id] += 1
            if self.missing_first and self.downloads[file_id] == 1:
                message = f"No such File object: {file_id}"
                return web.json_response({"error": {"message": message}}, status=404)
            return web.Response(body=self.files[file_id], content_type="application/octet-stream")

        @web.middleware
        async def authenticated(request: web.Request, handler: Any) -> web.StreamResponse:
            if self.auth is not None and request.headers.get("Authorization") != self.auth:
                return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)
            return await handler(request)

        application = web.Application(middlewares=[authenticated])
        application.router.add_get("/v1/models", models)
        application.router.add_post("/v1/chat/completions", chat)
        application.router.add_post("/v1/files", upload)
        application.router.add_post("/v1/batches", create)
        application.router.add_get("/v1/batches", listing)
        application.router.add_get("/v1/batches/{id}", retrieve)
        application.router.add_post("/v1/batches/{id}/cancel", cancel)
        application.router.add_get("/v1/files/{id}/content", content)
        return application


def expected_records() -> dict[str, tuple[Any, Any]]:
    """The two-stage framework's records by hand: the summary is the text's first three
    words; the rating is the summary's length mod 5, plus 1, scored out of 5."""
    found = {}
    for k, text in enumerate(TEXTS):
        summary = "S: " + " ".join(text.split()[:3])
        found[f"i{k}"] = ((len(summary) % 5 + 1) / 5, summary)
    return found


def run_eval(tmp_path: Path, url: str, **evaluator: Any) -> Any:
    """One real ``groundcover eval`` with a batch judge at ``url``, in this process."""
    config = write_config(tmp_path, **{"batch_settle": 0.5} | evaluator)
    args = eval_args(tmp_path, url, "batch", "--config", str(config))
    return CliRunner().invoke(app, args)


def ledger_text(run_dir: Path) -> str:
    return "".join(f.read_text() for f in run_dir.glob("batches/*/ledger.jsonl"))


def bought_once(server: LyingBatches) -> None:
    server.settle_all()
    twice = {cid: n for cid, n in server.billed.items() if n > 1}
    assert not twice, f"billed more than once: {twice}"
    assert len(server.billed) == 2 * len(TEXTS), server.billed  # draft and rate per item


# the run's batch settings in these tests: short rounds, polls and searches (a lost create is
# looked for 3 s, where a run's default is 30 s)
FAST: dict[str, Any] = {"batch_settle": 0.5, "batch_poll": 0.1, "batch_find": 3.0}

HELD: dict[str, dict[str, Any]] = {
    # 0.6 s behind the creates, every other page without the newest batch, pages repeated and
    # reordered, has_more true forever, others' batches between ours; creates answered 500
    # after they made the batch
    "listing": {
        "lag": 0.6,
        "omit_newest": True,
        "shuffle_pages": True,
        "more_forever": True,
        "noise": 3,
        "page": 2,
        "create_500": [1, 2],
    },
    # a UTF-8 byte order mark before the first line, CRLF, blank lines after the last, unknown
    # fields, another order, a duplicate line, a line for a request nobody made;
    # request_counts of zero
    "output": {
        "styles": ["bom", "crlf", "blank_tail", "extra", "reorder", "dup", "foreign"],
        "counts": "zero",
    },
    # 429 with Retry-After, a long finalizing, the first batch expired without an output file,
    # the second's failed lines in its error file, each output 404 at its first download
    "polls": {
        "poll_429": 2,
        "retry_after": "0.2",
        "finalizing": 4,
        "expire": [1],
        "styles": ["split"],
        "missing_first": True,
    },
    # a create answered only after the client's timeout (0.5 s), the batch made meanwhile
    "late create": {"create_late": 1.5},
    # request_counts that say two more lines than the file holds
    "counts more": {"counts": "more"},
}


@pytest.mark.parametrize("name", list(HELD))
def test_a_run_against_a_provider_that_misbehaves_bills_each_line_once(tmp_path, name):
    """A real ``groundcover eval`` against the provider's faults: every record right, every
    line billed exactly once by the provider's own count, nothing asked online."""
    server = LyingBatches(**HELD[name])
    evaluator = {"timeout": 0.5} if "create_late" in HELD[name] else {}
    with serve_app(server.app()) as url:
        done = run_eval(tmp_path, url, **FAST, **evaluator)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)
    assert server.online == 0
    if "create_late" in HELD[name]:
        assert server.creates == 2  # one per round: the late one found, never asked again
    if "create_500" in HELD[name]:
        assert server.creates == 2 and server.listings > 0
    if name == "output":  # odd but whole: each file believed at its first download
        assert set(server.downloads.values()) == {1}


def test_a_utf8_byte_order_mark_is_not_read_as_a_line():
    """An output file that starts with a UTF-8 byte order mark: its first line is an answer,
    not a line "not JSON" (which was downloaded three times and bought again)."""
    from groundcover.serving.batch import read_output, shortfall

    line = b'{"custom_id": "a", "response": {"status_code": 200, "body": {"choices": [{}]}}}\n'
    data = b"\xef\xbb\xbf" + line + line.replace(b'"a"', b'"b"')
    assert sorted(read_output(data).answers) == ["a", "b"] and not read_output(data).problems
    assert shortfall(data, 2) == ""


# ---- creates: refused, lost, or listed too late -----------------------------------------------


def test_a_create_refused_429_or_for_an_unprocessed_file_is_asked_again_never_searched(
    tmp_path,
):
    """A create answered 429 ("Rate limit reached ...", Retry-After) made nothing, and so did
    Azure's 400 for a file still 'pending' just after its upload (a documented WAIT): each is
    asked again after its wait, never looked for in the listing (which was searched for the
    whole find window, and Azure's refusal stopped the run with its raw JSON body)."""
    server = LyingBatches(create_429=1, file_pending=2, retry_after="0.2")
    with serve_app(server.app()) as url:
        done = run_eval(tmp_path, url, **FAST)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)
    assert server.listings == 0 and server.creates == 4  # 429, pending, made; round two


def test_an_error_line_gives_the_provider_s_message_not_its_json_body():
    from groundcover.serving.batch import said_in

    body = json.dumps({"error": {"code": "invalid_request", "message": "The input file ..."}})
    assert said_in(body) == ("The input file ...", "invalid_request")
    assert said_in("<html>Bad gateway</html>") == ("<html>Bad gateway</html>", "")
    assert said_in(json.dumps({"detail": "no"}))[0] == '{"detail": "no"}'


def test_a_cursor_that_does_not_move_never_leads_to_a_second_create(tmp_path):
    """The listing ignores ``after`` (its first page again, has_more true) and the org made
    two other batches after ours (two a page): the lost create's batch is on page 2, out of
    reach. Whether it was made cannot be told, so it is not created again: the run stops in
    one line saying so (it made a second batch: 6 lines billed twice, the first never
    collected), and the resume, once the listing pages again, finds and collects it."""
    server = LyingBatches(stuck_cursor=True, create_500=[1], noise=2, page=2)
    settings = FAST | {"batch_find": 0.3}
    with serve_app(server.app()) as url:
        stopped = run_eval(tmp_path, url, **settings)
        assert stopped.exit_code != 0
        assert "whether the batch of file file-in-0" in stopped.output
        assert "cannot be told" in stopped.output and "not created again" in stopped.output
        assert server.creates == 1
        server.stuck_cursor = False
        done = run_eval(tmp_path, url, **settings)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)
    assert server.creates == 2  # the lost one found, then round two


@pytest.mark.parametrize("lag", [2.5, 60.0])
def test_a_create_listed_only_after_the_find_window_is_collected_before_the_run_ends(tmp_path, lag):
    """The listing lags past the find window (1 s) and the first create is answered 500
    after making the batch: a second batch is made (the Batch API has no idempotency key).
    Before the run ends the listing is looked at once more, over the window: the first batch
    is recorded (adopted) and collected, its answers kept, where it was never listed again,
    downloaded or cancelled (billed and unused). Listed later still, the ledger notes it
    unfound and ``batch status`` says so; the next invocation's batcher, as it closes, looks
    once more, adopts and collects it."""
    server = LyingBatches(lag=lag, create_500=[1])
    run_dir = tmp_path / "batch"
    with serve_app(server.app()) as url:
        done = run_eval(tmp_path, url, **FAST | {"batch_find": 1.0})
        assert done.exit_code == 0, done.output
    assert records(run_dir) == expected_records()
    events = [json.loads(line) for line in ledger_text(run_dir).splitlines()]
    first = [e["event"] for e in events if e.get("batch") == "batch_0000"]
    shown = CliRunner().invoke(app, ["batch", "status", str(run_dir)])
    if lag < 60:
        assert first == ["submitted", "finished"], first  # adopted and collected
        assert server.downloads["file-out-batch_0000"] == 1
        assert "not found in the provider's listing" not in shown.output
    else:
        assert first == [] and [e["creates"] for e in events if e["event"] == "unfound"] == [1]
        assert "1 create(s) whose answer was lost were not found" in shown.output
        # listed at last: the next invocation's batcher adopts it as it closes (one pass)
        for batch in server.batches.values():
            batch["visible_at"] = 0.0
        with serve_app(server.app()) as url:
            asyncio.run(next_close(url, next(run_dir.glob("batches/*/ledger.jsonl")).parent))
        events = [json.loads(line) for line in ledger_text(run_dir).splitlines()]
        first = [e["event"] for e in events if e.get("batch") == "batch_0000"]
        assert first == ["submitted", "finished"], first  # adopted and collected
        assert server.downloads["file-out-batch_0000"] == 1


async def next_close(url: str, folder: Path) -> None:
    """A later invocation's batcher of ``folder``, opened and closed without a line asked."""
    from groundcover.serving.batch import Batcher, OpenAIBatches

    executor = OpenAIBatches(url, "sk-test-0000000000", find_window=0.2)
    await Batcher(executor, folder, poll=0.1).close()


# ---- the command line, and credentials in the URL --------------------------------------------


def test_batch_status_shows_each_batch_id_whole_on_one_line(tmp_path):
    """``groundcover batch status RUN`` in an 80-column terminal shows an OpenAI batch id
    (batch_ and 32 hex digits) whole on one line: it is what ``batch forget`` takes (it was
    wrapped into four pieces)."""
    folder = tmp_path / "batches" / "judge-0123456789"
    folder.mkdir(parents=True)
    ids = [f"batch_{k:032x}" for k in (0x6A1F, 0x6A20)]
    events = [
        {"event": "submitted", "batch": b, "round": 1, "custom_ids": ["a", "b"], "at": 1.0}
        for b in ids
    ]
    (folder / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    shown = CliRunner().invoke(app, ["batch", "status", str(tmp_path)], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert all(b in shown.output for b in ids), shown.output


def test_an_endpoint_with_credentials_in_its_url_is_asked_as_the_client_asks_it(tmp_path):
    """``--endpoint http://user:secret@host/v1``: every batch call (upload, create, poll,
    download) carries the URL's credential as HTTP Basic, as every other call of the client
    does (a Bearer of the API key was sent instead: 401), and the secret is nowhere in the run
    directory."""
    import base64

    secret = "pw-Zq81-not-for-the-ledger"
    server = LyingBatches(auth="Basic " + base64.b64encode(f"bob:{secret}".encode()).decode())
    with serve_app(server.app()) as url:
        done = run_eval(tmp_path, url.replace("://", f"://bob:{secret}@"), **FAST)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)
    assert secret not in done.output
    for path in (tmp_path / "batch").rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


# ---- kill -9 at each step, resumed; two resumes at once; the way out ------------------------


def command(tmp_path: Path, url: str) -> list[str]:
    config = write_config(tmp_path, **FAST)
    args = eval_args(tmp_path, url, "batch", "--config", str(config))
    return [sys.executable, "-m", "groundcover", *args]


def environment(tmp_path: Path) -> dict[str, str]:
    return os.environ | {"GROUNDCOVER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}


def killed_when(tmp_path: Path, url: str, event: str, count: int = 1, after: float = 0.0) -> bool:
    """The run started and killed with its group ``after`` seconds once its ledgers hold
    ``count`` events ``event`` (False: it ended first)."""
    run = subprocess.Popen(
        command(tmp_path, url),
        env=environment(tmp_path),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    mark = f'"event": "{event}"'
    deadline = time.monotonic() + 120
    while ledger_text(tmp_path / "batch").count(mark) < count:
        if run.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"no {event} event"
        time.sleep(0.02)
    time.sleep(after)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(30)
    return True


def resumed(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The killed run's command again, in this process (its home, its config)."""
    monkeypatch.setenv("GROUNDCOVER_HOME", str(tmp_path / "home"))
    return run_eval(tmp_path, url, **FAST)


def test_two_resumes_at_once_one_runs_the_other_is_refused(tmp_path):
    server = LyingBatches(work=1.0)
    with serve_app(server.app()) as url:
        assert killed_when(tmp_path, url, "submitted")
        both = [
            subprocess.Popen(
                command(tmp_path, url),
                env=environment(tmp_path),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        ended = [(p.wait(240), p.stderr.read() if p.stderr else "") for p in both]
        codes = sorted(code for code, _ in ended)
        assert codes[0] == 0, ended
        if codes[1] != 0:  # refused in one line naming the holder
            refused = next(err for code, err in ended if code != 0)
            assert "another process is writing this run: pid" in refused, refused
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)


def test_a_batch_past_expires_at_whose_cancel_never_ends_is_given_up(tmp_path):
    """Batches in_progress two hours past their expires_at, whose cancel never ends
    (``cancelling`` forever): every wait ends, the lines fail naming the batch (a Batcher with
    a grace of 1 s: a run's grace is an hour)."""
    from groundcover.serving.batch import Batcher, LineFailed, OpenAIBatches

    server = LyingBatches(stuck=True, overdue=True, cancelling_forever=True)
    body = {"model": "judge", "messages": [{"role": "user", "content": "Summarise: a b c d"}]}

    async def ask() -> Any:
        executor = OpenAIBatches(url, "sk-test-0000000000", patience=30, find_window=0.2)
        batcher = Batcher(executor, tmp_path / "b", settle=0.1, poll=0.1, grace=1.0)
        try:
            return await asyncio.wait_for(batcher.ask("one", body), 60)
        except LineFailed as failed:
            return failed
        finally:
            await batcher.close()
            await executor.close()

    with serve_app(server.app()) as url:
        got = asyncio.run(ask())
    assert isinstance(got, LineFailed), got
    assert "paid for and lost twice: batch batch_0001 cancelled" in str(got)
    # each batch cancelled once it was past its expires_at, then given up
    assert server.creates == 2 and set(server.cancels) == {"batch_0000", "batch_0001"}


KILL_POINTS = [
    ("uploaded", 1, 0.0),  # the file uploaded, its create (answered 500) not yet recorded
]


@pytest.mark.parametrize("event,count,after", KILL_POINTS)
def test_a_kill_at_a_step_then_a_resume_bills_each_line_once(
    tmp_path, monkeypatch, event, count, after
):
    server = LyingBatches(work=0.5, create_500=[1], noise=1, lag=0.5)
    with serve_app(server.app()) as url:
        assert killed_when(tmp_path, url, event, count, after)
        done = resumed(tmp_path, url, monkeypatch)
        assert done.exit_code == 0, done.output
    assert records(tmp_path / "batch") == expected_records()
    bought_once(server)


@pytest.mark.parametrize("at_the_provider", ["ended", "running"])
def test_a_batch_forgotten_is_cancelled_or_collected_never_billed_twice(
    tmp_path, monkeypatch, at_the_provider
):
    """A batch that never ends, the run killed while it waits: ``batch status`` shows it
    pending and ``batch forget RUN BATCH`` records it forgotten. The resume asks the provider
    about it once: ended meanwhile, its answers are kept (not bought again: they were billed);
    still running, it is cancelled (noted in the ledger) and its lines bought, where it was
    left running and billed a second time when it ended."""
    server = LyingBatches(stuck=True)
    run_dir = tmp_path / "batch"
    with serve_app(server.app()) as url:
        assert killed_when(tmp_path, url, "submitted", after=0.5)
        shown = CliRunner().invoke(app, ["batch", "status", str(run_dir), "--json"])
        assert shown.exit_code == 0, shown.output
        (listed,) = json.loads(shown.output)["clients"].values()
        assert [(b["batch"], b["status"]) for b in listed] == [("batch_0000", "pending")]
        forgot = CliRunner().invoke(app, ["batch", "forget", str(run_dir), "batch_0000"])
        assert forgot.exit_code == 0, forgot.output
        server.stuck = False
        if at_the_provider == "running":
            for batch in server.batches.values():
                batch["done_at"] += 30  # it ends later at the provider, as a stuck batch does
        done = resumed(tmp_path, url, monkeypatch)
        assert done.exit_code == 0, done.output
    assert records(run_dir) == expected_records()
    bought_once(server)
    shown = CliRunner().invoke(app, ["batch", "status", str(run_dir), "--json"])
    (listed,) = json.loads(shown.output)["clients"].values()
    forgotten = {b["batch"]: b for b in listed}["batch_0000"]
    assert forgotten["status"] == "forgotten"
    events = [json.loads(line) for line in ledger_text(run_dir).splitlines()]
    ended = [e for e in events if e["event"] == "forgotten_ended"]
    if at_the_provider == "running":
        assert server.cancels == ["batch_0000"] and ended[0]["cancelled"] is True
        assert server.creates == 3  # the forgotten batch's round bought again, then round two
        assert forgotten["note"].startswith("forgotten; cancelled at the provider")
    else:
        assert server.cancels == [] and ended[0]["status"] == "completed"
        assert server.creates == 2  # its answers kept: only round two bought
        assert "completed at the provider, its answers kept" in forgotten["note"]
