"""A chat-completions server on 127.0.0.1 shaped like vLLM serving a reasoning model, answering
from a ``ScriptedClient``'s scripts, and the real client that talks to it over HTTP.

The scripts are per stage, and a stage is the client's label, not part of an OpenAI request: the
test client sends it in the request's ``user`` field (an OpenAI field vLLM accepts and ignores),
after the cache key is made. How the server returns the reasoning is the ``parser`` it runs:

- ``"reasoning"``: vLLM with ``--reasoning-parser``: reasoning apart, in ``reasoning``;
- ``"reasoning_content"``: the same under the older vLLM field name;
- ``None``: no reasoning parser: ``<think>...</think>`` stays in ``content``, the logprobs list
  the reasoning's tokens, and no reasoning token count is reported (as vLLM without a parser).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from groundcover.serving.client import EvalClient, StageUsage
from groundcover.serving.reasoning import Reasoning
from groundcover.serving.templates import PromptTemplate
from tests.support.scripted import ScriptedClient

Parser = Literal["reasoning", "reasoning_content"] | None


class StagedClient(EvalClient):
    """The real client (HTTP transport, retries, accounting), naming each request's stage."""

    async def _request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        body: dict[str, Any],
        usage: StageUsage,
        *,
        stage: str,
        template: str | None,
    ) -> dict[str, Any]:
        return await super()._request(
            model, messages, body | {"user": stage}, usage, stage=stage, template=template
        )


def served(raw: dict[str, Any], parser: Parser) -> dict[str, Any]:
    """``raw`` (the scripted reply, reasoning in ``reasoning``) as a server with ``parser``
    returns it."""
    raw = copy.deepcopy(raw)
    choice = raw["choices"][0]
    message = choice["message"]
    thought = message.pop("reasoning", None)
    if thought is None or parser == "reasoning":
        if thought is not None:
            message["reasoning"] = thought
        return raw
    if parser == "reasoning_content":
        message["reasoning_content"] = thought
        return raw
    closed = choice["finish_reason"] != "length" or bool(message.get("content"))
    message["content"] = (
        f"<think>{thought}</think>" + (message.get("content") or "")
        if closed
        else f"<think>{thought}"
    )
    content = (choice.get("logprobs") or {}).get("content")
    if content is not None:  # the reasoning's tokens are the content's tokens too
        listed = [t for t in content if t.get("token") == "hmm "]
        answer = content[len(listed) :]
        hmm = {"token": "hmm ", "logprob": -0.1, "top_logprobs": []}
        close = {"token": "</think>", "logprob": -0.1, "top_logprobs": []}
        choice["logprobs"]["content"] = [
            {"token": "<think>", "logprob": -0.1, "top_logprobs": []},
            *([hmm] * len(thought.split())),
            close,
            *answer,
        ]
    raw.get("usage", {}).pop("completion_tokens_details", None)
    return raw


class StageByPrompt:
    """The stage of a request a plain client sent (no stage in ``user``: a run's driver in
    another process), read off its prompt: the template whose fixed opening the user message
    starts with (the longest such), named as ``stages`` says (template name -> stage)."""

    def __init__(self, templates: dict[str, PromptTemplate], stages: dict[str, str]):
        self.openings = sorted(
            ((templates[name].user.split("{")[0].strip(), stage) for name, stage in stages.items()),
            key=lambda pair: -len(pair[0]),
        )

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
        for opening, stage in self.openings:
            if prompt.startswith(opening):
                return stage
        raise ValueError(f"no template opens the prompt {prompt[:80]!r}")


@contextlib.contextmanager
def loopback_judge(
    scripted: ScriptedClient,
    parser: Parser,
    stage_of: StageByPrompt | None = None,
    delay: Callable[[], float] | None = None,
    listen: socket.socket | None = None,
) -> Iterator[str]:
    """Serves ``scripted`` on 127.0.0.1 (a free port; or on ``listen``, a bound socket), from a
    thread with its own event loop (a run under test has its own), for the block; yields the
    base URL. A request without its stage in ``user`` gets ``stage_of(messages)``; each answer
    waits ``delay()`` seconds."""

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        messages, model = body.pop("messages"), body.pop("model")
        stage = body.pop("user") if stage_of is None else stage_of(messages)
        if delay is not None:
            await asyncio.sleep(delay())
        if "structured_outputs" in body:  # the scripts check constraints where clients put them
            body["extra_body"] = {"structured_outputs": body.pop("structured_outputs")}
        try:
            raw = scripted.respond(model, messages, body, stage)
        except Exception as exc:  # noqa: BLE001 - a script's error is the server's 500
            return web.json_response({"error": {"message": str(exc)}}, status=500)
        return web.json_response(served(raw, parser))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    with serve_app(app, listen) as url:
        yield url


@contextlib.contextmanager
def serve_app(app: web.Application, listen: socket.socket | None = None) -> Iterator[str]:
    """``app`` on 127.0.0.1 (a free port; or on ``listen``, a bound socket: an address in a
    network namespace of a test's own), from a thread with its own event loop, for the block;
    yields the base URL (``.../v1``)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site: web.BaseSite = (
        web.TCPSite(runner, "127.0.0.1", 0) if listen is None else web.SockSite(runner, listen)
    )
    loop.run_until_complete(site.start())
    host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def replay_judged(
    case: Any,
    reasons: int,
    workdir: Path,
    parser: Parser = "reasoning",
    reasoning: Reasoning | None = None,
):
    """A fault-replay case (``tests.support.faults``) with well-formed answers only, by a plain
    judge (``reasons=0``, scripted in process) or, over HTTP, by the loopback server reasoning
    ``reasons`` tokens before every answer, returned as a server with ``parser`` does. Returns
    the outcomes and the scripted judge: its ``calls`` are the requests served, its ``client``
    the client that asked (None for the plain judge). ``reasoning``: how the client knows the
    model reasons (None: it finds out from the first reply)."""
    from tests.support.faults import AdversarialClient, Adversary
    from tests.test_runtime import run

    class Judge(AdversarialClient):
        def __init__(self, adversary: Adversary):
            super().__init__(adversary)
            self.reasons = reasons
            self.logprobs_with_reasoning = True  # the harder server: reasoning tokens listed
            self.client: EvalClient | None = None

    workdir.mkdir(parents=True)
    judge = Judge(Adversary(case.valid(), seed=0, share=1.0))
    if not reasons:
        return run(case.study(), case.options(workdir), judge, workdir / "run", 1), judge
    with loopback_judge(judge, parser) as url:
        judge.client = StagedClient(url, "scripted", max_retries=0, reasoning=reasoning)
        options = case.options(workdir)
        outcomes = run(case.study(), options, judge.client, workdir / "run", 1, close=True)
    return outcomes, judge
