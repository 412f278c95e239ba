"""A Batch API that misbehaves as hosted ones do, with a seeded schedule of faults, and the
harness that runs batchers against it and kills them dead (``tests/test_batch_chaos.py``,
``scripts/benchmarks/bench_batch_chaos.py``)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
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


class ChaosBatches:
    """An OpenAI-style Batch API with a seeded schedule of faults. ``paid`` counts each custom
    id answered 200 in a completed batch (what a provider bills); ``kill`` is called at
    ``kill_at`` (``upload``, ``create``: after the batch is made, before its answer; ``poll``,
    ``download``), once."""

    def __init__(self, seed: int, blip: float = 0.2, lost: float = 0.3, expire: float = 0.1):
        self.rng = random.Random(seed)
        self.blip, self.lost, self.expire = blip, lost, expire
        self.files: dict[str, str] = {}
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
        shown = {k: v for k, v in batch.items() if k not in ("lines", "polls")}
        return self._shaped(shown | {"id": batch_id, "object": "batch"})

    def app(self) -> web.Application:
        async def upload(request: web.Request) -> web.Response:
            form = await request.post()
            await asyncio.sleep(self.upload_delay)
            if (blip := self._blip()) is not None:
                return blip
            file_id = f"file-{len(self.files)}"
            self.files[file_id] = form["file"].file.read().decode()  # type: ignore[union-attr]
            return web.json_response({"id": file_id, "object": "file", "purpose": "batch"})

        async def create(request: web.Request) -> web.Response:
            body = await request.json()
            if (blip := self._blip()) is not None:
                return blip
            self._maybe_kill("upload")  # the upload is recorded: the run dies before creating
            lines = [json.loads(x) for x in self.files[body["input_file_id"]].splitlines()]
            with self.lock:
                batch_id = f"batch-{len(self.batches)}"
                self.batches[batch_id] = {
                    "status": "validating",
                    "input_file_id": body["input_file_id"],
                    "metadata": body.get("metadata") or {},
                    "lines": lines,
                    "polls": self.polls_before_done,
                    "created_at": len(self.batches),
                }
            self._maybe_kill("create")  # made; the run dies before it hears
            if self.rng.random() < self.lost:  # made, but the answer never arrives
                return web.json_response({"error": {"message": "gateway"}}, status=502)
            return web.json_response(self._public(batch_id))

        async def listing(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            limit = int(request.query.get("limit", "20"))
            after = request.query.get("after")
            newest = sorted(self.batches, key=lambda b: -self.batches[b]["created_at"])
            if after in newest:
                newest = newest[newest.index(after) + 1 :]
            page = newest[:limit]
            data = [self._public(b).get("job", self._public(b)) for b in page]
            more = len(newest) > limit
            return web.json_response(
                {
                    "object": "list",
                    "data": data,
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
            if self.hold or batch["polls"] > 0:
                batch["polls"] -= 1
                batch["status"] = "in_progress"
            elif batch["status"] not in ("completed", "expired"):
                self._finish(batch_id, batch)
            return web.json_response(self._public(batch_id))

        async def content(request: web.Request) -> web.Response:
            if (blip := self._blip()) is not None:
                return blip
            self._maybe_kill("download")
            return web.Response(text=self.files[request.match_info["id"]])

        app = web.Application()
        app.router.add_post("/v1/files", upload)
        app.router.add_post("/v1/batches", create)
        app.router.add_get("/v1/batches", listing)
        app.router.add_get("/v1/batches/{id}", retrieve)
        app.router.add_get("/v1/files/{id}/content", content)
        return app

    def _finish(self, batch_id: str, batch: dict[str, Any]) -> None:
        ids = {line["custom_id"] for line in batch["lines"]}
        if not ids & self.expired and self.rng.random() < self.expire:  # a line expires once
            self.expired |= ids
            batch |= {"status": "expired", "output_file_id": None}
            return
        output, errors = [], []
        for line in batch["lines"]:
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
            self.paid[cid] += 1
            response = {"status_code": 200, "body": completion(line["body"])}
            output.append({"id": f"r-{cid}", "custom_id": cid, "response": response, "error": None})
        self.rng.shuffle(output)  # providers do not keep the input's order
        out_id, err_id = f"file-out-{batch_id}", f"file-err-{batch_id}"
        self.files[out_id] = "".join(json.dumps(row) + "\n" for row in output)
        self.files[err_id] = "".join(json.dumps(row) + "\n" for row in errors)
        batch |= {
            "status": "completed",
            "output_file_id": out_id,
            "error_file_id": err_id if errors else None,
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


def batcher_for(url: str, folder: Path, **kw: Any) -> Batcher:
    executor = OpenAIBatches(url, "sk-test-0000000000", patience=60)
    options: dict[str, Any] = {"settle": 0.05, "poll": 0.01, "retry_base": 0.01} | kw
    return Batcher(executor, folder, **options)


def invocation(
    server: ChaosBatches, url: str, shards: list[tuple[Path, list[str], dict[str, Any]]]
) -> dict[str, tuple[str, str]] | None:
    """One run of the batchers ``shards`` (folder, words, Batcher options) in an event loop
    of its own, which ``server.kill`` stops dead (a kill -9: no cleanup, no last record).
    The answers by word, or None when killed."""
    loop = asyncio.new_event_loop()

    async def main() -> dict[str, tuple[str, str]]:
        batchers = [batcher_for(url, folder, **kw) for folder, _, kw in shards]
        found = await asyncio.gather(
            *(solve(b, w) for b, (_, words, _) in zip(batchers, shards, strict=True) for w in words)
        )
        for batcher in batchers:  # a killed run never gets here: it closes nothing
            await batcher.close()
        words = [w for _, ws, _ in shards for w in ws]
        return dict(zip(words, found, strict=True))

    server.kill = lambda: loop.call_soon_threadsafe(loop.stop)
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
    return {
        "seed": seed,
        "kill_at": kill_at,
        "killed": first is None,
        "right": resumed == {w: expected(w) for w in words},
        "paid_once": set(server.paid.values()) == {1} and len(server.paid) == 2 * len(words),
        "batches": len(server.batches),
    }
