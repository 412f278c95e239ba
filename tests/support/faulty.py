"""A chat-completions server on 127.0.0.1 that fails on purpose: each fault class of the wire,
injected into a share of the requests, over answers that depend on the prompt alone (a
``ScriptedClient``'s scripts, the stage read off the prompt), so a run under faults must end
with exactly the scores of a clean run.

Transient classes (the client retries them): ``503``, ``429`` (with ``Retry-After: 1``),
``cut`` (a 200 whose JSON body is cut off), ``not_json`` (a 200 with an HTML page), ``no_choices``
(a 200 JSON without ``choices``) and ``drop`` (the connection closed without an answer). A
prompt is failed at most ``max_per_prompt`` times in a row, so every call gets through within the
client's retries. Permanent classes (``400``, ``401``, ``404``) answer every request whose prompt
contains one of ``permanent``'s keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from tests.support.loopback import StageByPrompt, serve_app
from tests.support.scripted import ScriptedClient

TRANSIENT = ("503", "429", "cut", "not_json", "no_choices", "drop")
PERMANENT = {"400": "prompt too long", "401": "invalid API key", "404": "no such model"}


class FaultyServer:
    def __init__(
        self,
        scripted: ScriptedClient,
        stage_of: StageByPrompt,
        share: float = 0.0,
        classes: tuple[str, ...] = TRANSIENT,
        seed: int = 0,
        max_per_prompt: int = 3,
    ):
        self.scripted, self.stage_of = scripted, stage_of
        self.share, self.classes = share, classes
        self.random = random.Random(seed)
        self.max_per_prompt = max_per_prompt
        self.permanent: dict[str, str] = {}  # prompt substring -> permanent class
        self.failed_in_a_row: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()  # class -> requests failed with it
        self.asked: Counter[str] = Counter()  # prompt -> requests with it
        self.answered = 0

    def fault_for(self, prompt: str) -> str | None:
        for key, kind in self.permanent.items():
            if key in prompt:
                return kind
        key = hashlib.sha256(prompt.encode()).hexdigest()
        if self.failed_in_a_row[key] >= self.max_per_prompt or self.random.random() >= self.share:
            self.failed_in_a_row[key] = 0
            return None
        self.failed_in_a_row[key] += 1
        return self.random.choice(self.classes)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages, model = body.pop("messages"), body.pop("model")
        prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
        self.asked[prompt] += 1
        kind = self.fault_for(prompt)
        if kind is not None:
            self.injected[kind] += 1
            return self.fail(kind, request)
        raw = self.scripted.respond(model, messages, body, self.stage_of(messages))
        self.answered += 1
        return web.json_response(raw)

    def fail(self, kind: str, request: web.Request) -> web.StreamResponse:
        if kind in PERMANENT:  # (a permanent 503 is the transient one, every time)
            return web.json_response({"error": {"message": PERMANENT[kind]}}, status=int(kind))
        if kind == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if kind == "429":
            error = {"error": {"message": "rate limited"}}
            return web.json_response(error, status=429, headers={"Retry-After": "1"})
        if kind == "cut":
            whole = json.dumps({"choices": [{"message": {"content": "x" * 200}}]})
            return web.Response(body=whole[: len(whole) // 2], content_type="application/json")
        if kind == "not_json":
            return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
        if kind == "no_choices":
            return web.json_response({"object": "error", "message": "internal error"})
        assert kind == "drop"
        assert request.transport is not None
        request.transport.close()  # the client sees the connection end without an answer
        return web.Response()


@contextlib.contextmanager
def faulty_judge(server: FaultyServer) -> Iterator[str]:
    """Serves ``server`` on 127.0.0.1 (a free port) from its own thread for the block; yields
    the base URL."""

    async def complete(request: web.Request) -> web.StreamResponse:
        return await server.complete(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/v1/models", models)
    with serve_app(app) as url:
        yield url


async def models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "scripted"}]})


def usage_total(usage: dict[str, Any], key: str) -> float:
    """``key`` summed over a usage table's stages (or roles)."""
    return sum(u.get(key, 0) for u in usage.values())
