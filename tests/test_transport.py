"""EvalClient's HTTP layer against a real loopback HTTP server that answers as told: the wire
format, each fault class of ``serving.transport.FAULTS``, Retry-After, and errors in one line."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from groundcover.serving.client import EndpointError, EvalClient, RequestRejected
from groundcover.serving.transport import retry_after

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
}


class Scripted:
    """A loopback server: each request takes the next reply; the bodies it received are kept."""

    def __init__(self) -> None:
        self.replies: list[Callable[[web.Request], web.StreamResponse]] = []
        self.bodies: list[dict] = []
        self.times: list[float] = []
        self.headers: list[dict] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.times.append(time.monotonic())
        self.headers.append(dict(request.headers))
        reply = self.replies.pop(0) if self.replies else ok
        result = reply(request)
        return await result if asyncio.iscoroutine(result) else result  # type: ignore[return-value]


def ok(_request) -> web.Response:
    return web.json_response(COMPLETION)


def status(code: int, body: dict | str, headers: dict | None = None):
    def reply(_request) -> web.Response:
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(
            status=code, text=text, headers=headers or {}, content_type="application/json"
        )

    return reply


def body_of(text: str):
    return lambda _request: web.Response(text=text, content_type="application/json")


async def dropped(request: web.Request) -> web.StreamResponse:
    """Headers promise a body the server never finishes: the connection closes mid-response."""
    response = web.StreamResponse(headers={"Content-Length": "4000"})
    await response.prepare(request)
    await response.write(b'{"choices": [')
    assert request.transport is not None
    request.transport.close()
    return response


@pytest.fixture
async def server() -> AsyncIterator[Scripted]:
    scripted = Scripted()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted.handle)
    app.router.add_get(
        "/v1/models", lambda r: web.json_response({"data": [{"id": "m"}, {"id": "m:lora"}]})
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scripted.url = f"http://127.0.0.1:{port}/v1"
    yield scripted
    await runner.cleanup()


def client(url: str, **kwargs) -> EvalClient:
    return EvalClient(url, "m", api_key="secret", backoff=0.01, max_backoff=0.05, **kwargs)


async def test_the_request_is_the_openai_wire_format(server):
    async with client(server.url, adapter="lora") as c:
        result = await c.chat(
            [{"role": "user", "content": "q"}],
            temperature=0.0,
            max_tokens=4,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        )
        assert await c.served_models() == ["m", "m:lora"]
    assert result.text == "yes" and result.prompt_tokens == 7 and not result.cached
    assert server.bodies == [
        {
            "model": "lora",
            "messages": [{"role": "user", "content": "q"}],
            "temperature": 0.0,
            "max_tokens": 4,
            "structured_outputs": {"choice": ["yes", "no"]},
        }
    ]  # extra_body's fields at the top level, as the openai SDK sent them
    assert server.headers[0]["Authorization"] == "Bearer secret"


@pytest.mark.parametrize(
    "fault",
    [
        status(503, {"error": {"message": "overloaded"}}),
        status(500, "internal"),
        status(429, {"error": {"message": "slow down"}}),
        body_of('{"id": "c1", "choices": [{"message": {"content": "ye'),  # cut off
        body_of("<html>gateway</html>"),  # not JSON
        body_of('{"object": "error", "message": "no choices here"}'),
        dropped,
    ],
    ids=["503", "500", "429", "cut-off", "not-json", "no-choices", "dropped"],
)
async def test_transient_faults_are_retried_and_counted(server, fault):
    server.replies = [fault, fault]
    async with client(server.url) as c:
        result = await c.chat([{"role": "user", "content": "q"}], stage="judge")
    assert result.text == "yes" and len(server.bodies) == 3
    assert c.usage["judge"].retries == 2 and c.usage["judge"].requests == 1


async def test_retry_after_is_honoured_in_seconds_and_as_a_date(server):
    def date_ahead(request):  # an HTTP date 3 s after the reply (whole seconds: 2-3 s away)
        when = email.utils.formatdate(time.time() + 3, usegmt=True)
        return status(503, "{}", {"Retry-After": when})(request)

    server.replies = [status(429, "{}", {"Retry-After": "1"}), date_ahead]
    async with client(server.url) as c:
        await c.chat([{"role": "user", "content": "q"}])
    first, second, third = server.times
    assert second - first >= 0.95  # the backoff alone would be 0.05 s at most
    assert third - second >= 1.9
    assert retry_after("7") == 7.0 and retry_after("soon") is None
    assert retry_after(email.utils.formatdate(100.0, usegmt=True), now=90.0) == 10.0


async def test_a_persistent_fault_gives_up_with_the_last_error(server):
    """A server that answers but keeps failing one request fails that request's item (the run
    goes on); one that fails every request (GIVE_UP_RUN in a row) stops the run."""
    from groundcover.serving.client import GIVE_UP_RUN

    server.replies = [status(503, {"error": {"message": "still overloaded"}})] * 4
    async with client(server.url, max_retries=3) as c:
        with pytest.raises(RequestRejected, match="gave up after 4 attempts: 503 still overloaded"):
            await c.chat([{"role": "user", "content": "q"}], stage="judge")
        server.replies = [body_of("<html>gateway</html>")]  # then a success: the count resets
        await c.chat([{"role": "user", "content": "q2"}])
        server.replies = [status(500, "{}")] * (4 * GIVE_UP_RUN)
        for n in range(GIVE_UP_RUN - 1):
            with pytest.raises(RequestRejected):
                await c.chat([{"role": "user", "content": f"r{n}"}], stage="judge")
        with pytest.raises(EndpointError, match="gave up after 4 attempts") as stopped:
            await c.chat([{"role": "user", "content": "last"}], stage="judge")
        assert not isinstance(stopped.value, RequestRejected)  # the endpoint is down: stop


async def test_a_malformed_request_fails_its_item_and_auth_stops_the_run(server):
    too_long = {
        "error": {
            "message": "This model's maximum context length is 512 tokens.",
            "type": "BadRequestError",
        }
    }
    server.replies = [
        status(400, too_long),
        status(401, {"detail": "bad key"}),
        status(404, {"error": {"message": "The model `x` does not exist."}}),
    ]
    async with client(server.url) as c:
        with pytest.raises(RequestRejected, match="400 This model's maximum context length"):
            await c.chat([{"role": "user", "content": "q"}], stage="claims")
        with pytest.raises(EndpointError, match="401 bad key") as stopped:
            await c.chat([{"role": "user", "content": "q"}])
        assert not isinstance(stopped.value, RequestRejected)
        with pytest.raises(EndpointError, match="404 The model `x` does not exist"):
            await c.chat([{"role": "user", "content": "q"}])
    assert len(server.bodies) == 3  # none of them retried


async def test_a_refused_connection_is_retried_then_reported():
    async with client("http://127.0.0.1:9/v1", max_retries=2) as c:
        with pytest.raises(EndpointError, match="gave up after 3 attempts: .*Connect") as gone:
            await c.chat([{"role": "user", "content": "q"}])
        assert not isinstance(gone.value, RequestRejected)  # unreachable: the run stops
        assert c.usage["default"].retries == 2 and c.usage["default"].failures == 1


async def test_one_client_serves_many_requests_in_flight_over_its_pool(server):
    """64 requests at concurrency 16: the server holds each until 16 are open at once (or one
    deadline 20 s from the start passes), so it sees 16 in flight over the client's pool,
    never more, whatever the machine's load (a wall-time bound here once depended on it), and
    over at most 16 connections: the pool's, kept and used again."""
    in_flight, peak, full = 0, 0, asyncio.Event()
    until = asyncio.get_running_loop().time() + 20  # one deadline for every held request
    connections: set[tuple[str, int]] = set()

    async def held(request):
        nonlocal in_flight, peak
        connections.add(request.transport.get_extra_info("peername")[:2])
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 16:
            full.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until):
                await full.wait()
        in_flight -= 1
        return ok(request)

    server.replies = [held] * 64
    async with client(server.url, concurrency=16) as c:
        await asyncio.gather(*(c.chat([{"role": "user", "content": f"q{n}"}]) for n in range(64)))
    assert c.peak_in_flight == 16 and len(server.bodies) == 64
    assert peak == 16  # requests overlapped at the server: 16 at a time, no more
    assert len(connections) <= 16  # each kept open and used again, not one per request


def test_one_client_across_event_loops_answers_and_leaves_no_session_open():
    """A client used by three ``asyncio.run`` calls (a CLI that runs twice, then closes) opens a
    new pool in each loop and marks the one of an ended loop closed: both calls answer, and no
    session is reported unclosed (a dead loop's sockets are the garbage collector's)."""
    import gc
    import threading
    import warnings

    box: list[int] = []
    ready, stop = threading.Event(), threading.Event()

    def serve() -> None:
        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", lambda r: web.json_response(COMPLETION))
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await runner.cleanup()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    c = client(f"http://127.0.0.1:{box[0]}/v1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = asyncio.run(c.chat([{"role": "user", "content": "one"}]))
        second = asyncio.run(c.chat([{"role": "user", "content": "two"}]))
        asyncio.run(c.aclose())
        gc.collect()
    stop.set()
    thread.join(10)
    assert first.text == second.text == "yes"
    unclosed = [str(w.message) for w in caught if "Unclosed client session" in str(w.message)]
    assert not unclosed
