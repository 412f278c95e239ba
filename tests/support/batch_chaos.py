"""A Batch API that misbehaves as hosted ones do, with a seeded schedule of faults, and the
harness that runs batchers against it and kills them dead (``tests/test_batch_chaos.py``,
``scripts/benchmarks/bench_batch_chaos.py``)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from groundcover.serving.batch import Batcher, OpenAIBatches
from tests.support.loopback import serve_app


def answer_of(prompt: str) -> str:
    """The stub model: stage one echoes a word, stage two its length."""
    if prompt.startswith("first "):
        return prompt.split()[1].upper()
    return str(len(prompt))


def completion(body: dict[str, Any]) -> dict[str, Any]:
    reply = {"role": "assistant", "content": answer_of(body["messages"][-1]["content"])}
    return {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


ENQUEUED = (  # OpenAI's words (PROVIDER_MESSAGES): the organisation's queue is full
    "Enqueued token limit reached for judge in organization org-chaos. Limit: 90,000 enqueued "
    "tokens. Please try again once some in_progress batches have been completed."
)


class ChaosBatches:
    """An OpenAI-style Batch API with a seeded schedule of faults. ``paid`` counts each custom
    id answered 200 in a completed (or cancelled) batch's output: what a provider bills;
    ``kill`` is called at ``kill_at`` (``upload``, ``create``: after the batch is made, before
    its answer; ``poll``, ``download``), once.

    The faults of a provider that is slow, forgetful or odd, each off by default:

    - ``list_lag``: a new batch stays out of ``GET /batches`` this many seconds (eventual);
    - ``bad_cursor``: the listing ignores ``after`` (its first page again, ``has_more`` true),
      and ``page_size`` caps a page whatever ``limit`` asks;
    - ``late``: a share of creates (and the first ``late_first``) answered 504 at once, the
      batch made ``late_by`` s later;
    - ``cut``: the first ``cut`` downloads of each output cut mid-line (the transfer whole);
    - ``garble``: the first ``garble`` downloads of each output with a line not UTF-8;
    - ``odd``: custom ids whose line comes back in an odd shape (``response`` a string, the
      error a list; not billed, as a provider bills no failed line);
    - ``stuck``: the first this many batches ``in_progress`` forever, their ``expires_at``
      passed; a cancel ends one with the first half of its lines done (billed) in its output
      (none, cancelled while still validating);
    - ``enqueued``: the first this many batches fail validating with the enqueued-token limit
      (``errors`` as ``errors_shape``: OpenAI's ``{"data": [...]}`` or a bare ``list``);
    - ``vanish``: the first ``vanish`` downloads of each output answered 404 (not there yet);
    - ``broken``: batch id -> ``gone`` (its output 404 for good), ``cut`` (cut every time),
      ``garble`` (a line not UTF-8 every time)."""

    def __init__(self, seed: int, blip: float = 0.2, lost: float = 0.3, expire: float = 0.1):
        self.rng = random.Random(seed)
        self.blip, self.lost, self.expire = blip, lost, expire
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.paid: Counter[str] = Counter()
        self.hold = False
        self.kill_at: str | None = None
        self.kill: Callable[[], None] | None = None
        self.polls_before_done = 2
        self.failing_lines: set[str] = set()  # custom ids answered 500 the first time
        self.shape = "openai"  # or "wrapped": {"job": {...}}, statuses in capitals
        self.upload_delay = 0.0
        self.expired: set[str] = set()
        self.lock = threading.Lock()
        self.list_lag = 0.0
        self.bad_cursor, self.page_size = False, 100
        self.late, self.late_by, self.late_first = 0.0, 0.0, 0
        self.cut = self.garble = self.vanish = 0
        self.odd: set[str] = set()
        self.stuck = 0
        self.broken: dict[str, str] = {}
        self.enqueued, self.errors_shape = 0, "data"
        self.downloads: Counter[str] = Counter()
        self.cancels = 0
        self.listings = 0
        self._made = 0

    def _maybe_kill(self, point: str) -> None:
        if self.kill_at == point and self.kill is not None:
            kill, self.kill, self.kill_at = self.kill, None, None
            kill()

    def _blip(self) -> web.Response | None:
        roll = self.rng.random()
        if roll < self.blip / 2:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if roll < self.blip:
            return web.json_response(
                {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"}
            )
        return None

    def _shaped(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.shape == "wrapped":
            return {"job": batch | {"status": str(batch["status"]).upper()}}
        return batch

    def _public(self, batch_id: str) -> dict[str, Any]:
        batch = self.batches[batch_id]
        hidden = ("lines", "polls", "order", "stuck", "listed_at", "share")
        shown = {k: v for k, v in batch.items() if k not in hidden}
        return self._shaped(shown | {"id": batch_id, "object": "batch"})

    def _make(self, body: dict[str, Any]) -> str:
        lines = [json.loads(x) for x in self.files[body["input_file_id"]].splitlines()]
        with self.lock:
            batch_id = f"batch-{len(self.batches)}"
            now = time.time()
            self._made += 1
            self.batches[batch_id] = {
                "status": "validating",
                "input_file_id": body["input_file_id"],
                "metadata": body.get("metadata") or {},
                "lines": lines,
                "polls": self.polls_before_done,
                "order": len(self.batches),
                "created_at": int(now),
                "listed_at": now + self.list_lag,
                "expires_at": int(now) + 86_400,
                "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "stuck": self.enqueued < self._made <= self.enqueued + self.stuck,
            }
            if self.batches[batch_id]["stuck"]:
                self.batches[batch_id]["expires_at"] = now - 1  # it should have ended by now
            if self._made <= self.enqueued:
                entry = {"code": "token_limit_exceeded", "message": ENQUEUED, "line": None}
                errors = [entry] if self.errors_shape == "list" else {"data": [entry]}
                self.batches[batch_id] |= {"status": "failed", "errors": errors}
        return batch_id

    def app(self) -> web.Application:
        async def upload(request: web.Request) -> web.Response:
            form = await request.post()
            await asyncio.sleep(self.upload_delay)
            if (blip := self._blip()) is not None:
                return blip
            file_id = f"file-{len(self.files)}"
            self.files[file_id] = form["file"].file.read()  # type: ignore[union-attr]
            return web.json_response({"id": file_id, "object": "file", "purpose": "batch"})

        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            if (blip := self._blip()) is not None:
                return blip
            self._maybe_kill("upload")  # the upload is recorded: the run dies before creating
            if self.late_first > 0 or self.rng.random() < self.late:  # the batch comes later
                self.late_first -= 1
                loop = asyncio.get_running_loop()
                loop.call_later(self.late_by, self._make, body)
                return web.json_response({"error": {"message": "gateway timeout"}}, status=504)
            batch_id = self._make(body)
            self._maybe_kill("create")  # made; the run dies before it hears
            if self.rng.random() < self.lost:  # made, but the answer never arrives
                return web.json_response({"error": {"message": "gateway"}}, status=502)
            return web.json_response(self._public(batch_id))

        async def listing(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            self.listings += 1
            limit = min(int(request.query.get("limit", "20")), self.page_size)
            after = None if self.bad_cursor else request.query.get("after")
            now = time.time()
            shown = [b for b in self.batches if self.batches[b]["listed_at"] <= now]
            newest = sorted(shown, key=lambda b: -self.batches[b]["order"])
            if after in newest:
                newest = newest[newest.index(after) + 1 :]
            page = newest[:limit]
            data = [self._public(b).get("job", self._public(b)) for b in page]
            more = len(newest) > limit
            return web.json_response(
                {
                    "object": "list",
                    "data": data,
                    "first_id": page[0] if page else None,
                    "has_more": more,
                    "last_id": page[-1] if page else None,
                }
            )

        async def retrieve(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            self._maybe_kill("poll")
            batch_id = request.match_info["id"]
            batch = self.batches[batch_id]
            if batch["status"] in ("failed", "cancelled"):
                pass
            elif batch["status"] == "cancelling":
                self._finish(batch_id, batch, partial=True)
            elif self.hold or batch["polls"] > 0 or batch["stuck"]:
                batch["polls"] -= 1
                batch["status"] = "in_progress"
            elif batch["status"] not in ("completed", "expired"):
                self._finish(batch_id, batch)
            return web.json_response(self._public(batch_id))

        async def cancel(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            batch = self.batches[request.match_info["id"]]
            self.cancels += 1
            if batch["status"] in ("validating", "in_progress"):
                batch["share"] = 0.5 if batch["status"] == "in_progress" else 0.0
                batch["status"] = "cancelling"
            return web.json_response(self._public(request.match_info["id"]))

        async def content(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            self._maybe_kill("download")
            file_id = request.match_info["id"]
            self.downloads[file_id] += 1
            served = self.downloads[file_id]
            data = self.files[file_id]
            data = data.encode() if isinstance(data, str) else data
            broken = self.broken.get(file_id.removeprefix("file-out-"))
            if file_id.startswith("file-out-") and data:
                if broken == "gone" or served <= self.vanish:
                    return web.json_response({"error": {"message": "No such File"}}, status=404)
                if broken == "cut" or served <= self.vanish + self.cut:
                    data = data[: len(data) - 9]  # the transfer ends mid-line
                elif broken == "garble" or served <= self.vanish + self.cut + self.garble:
                    data = data.replace(b'"content"', b'"cont\xffent"', 1)
            return web.Response(body=data, content_type="application/octet-stream")

        app = web.Application()
        app.router.add_post("/v1/files", upload)
        app.router.add_post("/v1/batches", create)
        app.router.add_get("/v1/batches", listing)
        app.router.add_get("/v1/batches/{id}", retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", cancel)
        app.router.add_get("/v1/files/{id}/content", content)
        return app

    def run_the_rest(self) -> None:
        """What a provider does with the batches nobody polls any more: it runs them all (a
        batch made twice is billed twice, whether or not its client ever looked at it), a
        cancelled one only as far as it got, a stuck one to half before it expires."""
        for batch_id, batch in self.batches.items():
            if batch["status"] in ("validating", "in_progress"):
                if batch["stuck"]:
                    batch["share"] = 0.5
                self._finish(batch_id, batch, partial=batch["stuck"])
            elif batch["status"] == "cancelling":
                self._finish(batch_id, batch, partial=True)

    def _finish(self, batch_id: str, batch: dict[str, Any], partial: bool = False) -> None:
        ids = {line["custom_id"] for line in batch["lines"]}
        if not partial and not ids & self.expired and self.rng.random() < self.expire:
            self.expired |= ids  # a line expires once
            batch |= {"status": "expired", "output_file_id": None}
            return
        done = int(len(batch["lines"]) * batch.get("share", 1.0)) if partial else None
        lines = batch["lines"][:done]
        output, errors = [], []
        for line in lines:
            cid = line["custom_id"]
            if cid in self.failing_lines:
                self.failing_lines.discard(cid)
                errors.append(
                    {
                        "custom_id": cid,
                        "response": {"status_code": 500},
                        "error": {"message": "oops"},
                    }
                )
                continue
            if cid in self.odd:  # an error line in odd dress: not billed
                self.odd.discard(cid)
                row = {"custom_id": cid, "response": "upstream", "error": [{"message": "odd"}]}
                errors.append(row)
                continue
            self.paid[cid] += 1
            response = {"status_code": 200, "body": completion(line["body"])}
            output.append({"id": f"r-{cid}", "custom_id": cid, "response": response, "error": None})
        self.rng.shuffle(output)  # providers do not keep the input's order
        out_id, err_id = f"file-out-{batch_id}", f"file-err-{batch_id}"
        self.files[out_id] = "".join(json.dumps(row) + "\n" for row in output).encode()
        self.files[err_id] = "".join(json.dumps(row) + "\n" for row in errors).encode()
        batch |= {
            "status": "cancelled" if partial else "completed",
            "output_file_id": out_id,
            "error_file_id": err_id if errors else None,
            "request_counts": {
                "total": len(batch["lines"]),
                "completed": len(output),
                "failed": len(errors),
            },
        }


def request(prompt: str) -> dict[str, Any]:
    return {"model": "judge", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}


async def solve(batcher: Batcher, word: str) -> tuple[str, str]:
    """Two stages: the second's request exists only once the first has answered."""
    first = await batcher.ask(f"a-{word}", request(f"first {word}"))
    upper = first["choices"][0]["message"]["content"]
    second = await batcher.ask(f"b-{word}-{upper}", request(f"second {upper}"))
    return upper, second["choices"][0]["message"]["content"]


def expected(word: str) -> tuple[str, str]:
    return word.upper(), str(len(f"second {word.upper()}"))


def batcher_for(
    url: str, folder: Path, executor: dict[str, Any] | None = None, **kw: Any
) -> Batcher:
    """A batcher of short windows against the chaos API at ``url`` (``executor``: the
    ``OpenAIBatches`` options, ``kw`` the ``Batcher``'s)."""
    calls = {"patience": 60, "find_window": 0.2, "download_pause": 0.02} | (executor or {})
    options: dict[str, Any] = {"settle": 0.05, "poll": 0.01, "retry_base": 0.01} | kw
    return Batcher(OpenAIBatches(url, "sk-test-0000000000", **calls), folder, **options)


def invocation(
    server: ChaosBatches, url: str, shards: list[tuple[Path, list[str], dict[str, Any]]]
) -> dict[str, Any] | None:
    """One run of the batchers ``shards`` (folder, words, Batcher options) in an event loop
    of its own, which ``server.kill`` stops dead (a kill -9: no cleanup, no last record).
    The answers by word, or None when killed."""
    loop = asyncio.new_event_loop()

    async def main() -> dict[str, Any]:
        batchers = [batcher_for(url, folder, **kw) for folder, _, kw in shards]
        found = await asyncio.gather(
            *(
                solve(b, w)
                for b, (_, words, _) in zip(batchers, shards, strict=True)
                for w in words
            ),
            return_exceptions=True,  # a line that failed: its word's answer is the error
        )
        for batcher in batchers:  # a killed run never gets here: it closes nothing
            await batcher.close()
        words = [w for _, ws, _ in shards for w in ws]
        return dict(zip(words, found, strict=True))

    def kill() -> None:
        loop.call_soon_threadsafe(loop.stop)

    server.kill = kill
    task = loop.create_task(main())
    try:
        return loop.run_until_complete(task)
    except RuntimeError as exc:  # stopped: the kill
        assert "stopped" in str(exc), exc
        KILLED.append(loop)  # left as the kill left it: never run again, never collected
        return None
    finally:
        server.kill = None


KILLED: list[asyncio.AbstractEventLoop] = []


WORDS = [f"w{k}" for k in range(8)]
KILL_POINTS = ("upload", "create", "poll", "download")


def seeded_schedule(folder: Path, seed: int, words: list[str] = WORDS) -> dict[str, Any]:
    """One schedule: faults by ``seed``, a kill at one step (by the seed), then a resume in
    the same folder to the end. What came of it: the answers right, each id paid once."""
    server = ChaosBatches(seed)
    rng = random.Random(seed)
    server.kill_at = KILL_POINTS[seed % len(KILL_POINTS)]
    server.failing_lines = {f"a-{rng.choice(words)}"}
    kill_at = server.kill_at
    with serve_app(server.app()) as url:
        first = invocation(server, url, [(folder, words, {})])
        resumed = invocation(server, url, [(folder, words, {})])
    server.run_the_rest()
    return {
        "seed": seed,
        "kill_at": kill_at,
        "killed": first is None,
        "right": resumed == {w: expected(w) for w in words},
        "paid_once": set(server.paid.values()) == {1} and len(server.paid) == 2 * len(words),
        "batches": len(server.batches),
    }


# ---- named schedules: one fault of a slow, forgetful or odd provider each ------------------

SCHEDULES: dict[str, dict[str, Any]] = {
    # every create's answer lost; the listing 0.3 s behind the creates
    "eventual listing": {"server": {"lost": 1.0, "list_lag": 0.3}},
    # the listing ignores its cursor, one batch a page; creates' answers lost
    "bad cursor": {"server": {"lost": 1.0, "bad_cursor": True, "page_size": 1}},
    # every create answered 504 at once, its batch made 0.2 s later
    "late creates": {"server": {"late": 1.0, "late_by": 0.2, "list_lag": 0.1}},
    # each output cut mid-line in its first download, another not UTF-8 in its second
    "cut files": {"server": {"cut": 1, "garble": 1}},
    # lines whose response is a string and whose error is a list
    "odd shapes": {"server": {"odd": {"a-w1", "b-w5-W5"}}},
    # the first batch in_progress forever, past its expires_at: cancelled, half done
    "stuck batch": {"server": {"stuck": 1}, "batcher": {"grace": 0.2}},
    # the first two batches fail for the organisation's enqueued tokens (errors a list)
    "enqueued limit": {"server": {"enqueued": 2, "errors_shape": "list"}},
    # each output 404 for its first two downloads (not there yet)
    "vanished file": {"server": {"vanish": 2}},
    "all at once": {
        "server": {
            "lost": 0.3,
            "list_lag": 0.2,
            "late": 0.3,
            "late_by": 0.1,
            "cut": 1,
            "odd": {"a-w2"},
            "stuck": 1,
            "enqueued": 1,
            "vanish": 1,
        },
        "batcher": {"grace": 0.2},
    },
}


def run_schedule(
    folder: Path, name: str, seed: int, kill_at: str | None = None, blip: float = 0.1
) -> dict[str, Any]:
    """One named schedule (``SCHEDULES``) with ``blip`` of the calls 503 / 429, a kill at
    ``kill_at`` if given, then resumes (at most three) until every word is answered. Each of
    the run's lines counted by how often the provider billed it: once, twice (or more), and
    lost (never billed, or its answer wrong in the end)."""
    plan = SCHEDULES[name]
    server = ChaosBatches(seed, blip=blip, lost=0.0, expire=0.0)
    for key, value in plan["server"].items():
        setattr(server, key, set(value) if isinstance(value, set) else value)
    options = plan.get("batcher", {}) | {"executor": {"find_window": 0.6}}
    server.kill_at = kill_at
    found: dict[str, Any] | None = None
    invocations = 0
    with serve_app(server.app()) as url:
        for _ in range(4):
            invocations += 1
            found = invocation(server, url, [(folder, WORDS, options)])
            if found is not None and found == {w: expected(w) for w in WORDS}:
                break
        time.sleep(0.2)  # a late create still to come is made before the end
    server.run_the_rest()
    lines = [f"a-{w}" for w in WORDS] + [f"b-{w}-{w.upper()}" for w in WORDS]
    right = {f"a-{w}" for w in WORDS if found and found.get(w) == expected(w)}
    right |= {f"b-{w}-{w.upper()}" for w in WORDS if found and found.get(w) == expected(w)}
    return {
        "schedule": name,
        "seed": seed,
        "once": sum(server.paid[cid] == 1 and cid in right for cid in lines),
        "twice": sum(server.paid[cid] >= 2 for cid in lines),
        "lost": sum(cid not in right or server.paid[cid] == 0 for cid in lines),
        "batches": len(server.batches),
        "invocations": invocations,
        "listings": server.listings,
    }
