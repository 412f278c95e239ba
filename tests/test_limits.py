"""Adaptive concurrency (``--concurrency auto``): AIMD on the requests in flight."""

from __future__ import annotations

import asyncio

from aiohttp import web

from groundcover.serving.client import EvalClient
from groundcover.serving.limits import AdaptiveLimit
from tests.test_transport import COMPLETION


def answer(limit: AdaptiveLimit, n: int, seconds: float, overloaded: bool = False) -> None:
    for _ in range(n):
        limit.in_flight += 1
        limit.release(seconds, overloaded)


def test_slow_start_doubles_per_window_up_to_the_ceiling():
    limit = AdaptiveLimit(ceiling=40, start=8)
    answer(limit, 7, 0.01)
    assert limit.limit == 8  # a window is `limit` answers
    answer(limit, 1, 0.01)
    assert limit.limit == 16
    answer(limit, 16, 0.01)
    assert limit.limit == 32
    answer(limit, 32, 0.01)
    assert limit.limit == 40 and limit.peak == 40  # the ceiling holds


def test_an_overload_halves_once_per_burst_then_growth_is_additive():
    limit = AdaptiveLimit(ceiling=256, start=32)
    answer(limit, 32, 0.01)
    assert limit.limit == 64
    answer(limit, 3, 0.01, overloaded=True)  # one burst of 429s: one decrease
    assert limit.limit == 32 and limit.decreases == 1 and not limit.slow_start
    answer(limit, 32, 0.01)
    assert limit.limit == 33  # +1 per window from now on


def test_growth_holds_while_latency_is_up():
    limit = AdaptiveLimit(ceiling=256, start=8)
    answer(limit, 8, 0.01)
    assert limit.limit == 16
    answer(limit, 64, 0.2)  # the median latency is now 20x the floor
    assert limit.limit == 16 and not limit.slow_start
    report = limit.report()
    assert report["mode"] == "auto" and report["settled"] == 16 and report["peak"] == 16


async def test_acquire_waits_for_a_free_slot():
    limit = AdaptiveLimit(ceiling=2, start=2)
    await limit.acquire()
    await limit.acquire()
    third = asyncio.create_task(limit.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()
    limit.release(0.01, False)
    await asyncio.wait_for(third, 1)
    assert limit.in_flight == 2


async def test_auto_concurrency_finds_a_busy_endpoint_capacity():
    """A loopback endpoint that serves 24 requests at a time and answers 429 beyond: every call
    ends answered, the limit grew past its start, backed off, and settled near the capacity."""
    capacity, busy = 24, [0]

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if busy[0] >= capacity:
            return web.json_response({"error": {"message": "busy"}}, status=429)
        busy[0] += 1
        try:
            await asyncio.sleep(0.02)
        finally:
            busy[0] -= 1
        return web.json_response(COMPLETION)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with EvalClient(
            f"http://127.0.0.1:{port}/v1", "m", concurrency="auto", backoff=0.01, max_backoff=0.05
        ) as client:
            results = await asyncio.gather(
                *(client.chat([{"role": "user", "content": f"q{n}"}]) for n in range(1500))
            )
            report = client.limit.report()
    finally:
        await runner.cleanup()
    assert len(results) == 1500 and all(r.text == "yes" for r in results)
    assert report["peak"] > 16 and report["decreases"] >= 1
    assert capacity / 2 <= report["mean"] <= 3 * capacity, report
    assert client.usage["default"].retries >= 1  # the refused requests were asked again
