"""How many requests one client keeps in flight: a fixed number, or found by AIMD (``auto``).

``AdaptiveLimit`` starts small and doubles after each full window of answers (slow start) until
the first sign of congestion, then grows by one per window (additive increase) while latency
holds: the recent median stays under ``latency_factor`` times the lowest seen. A 429, 503, 504
or timeout halves it (multiplicative decrease, at most once per round trip, so one burst of
refusals counts once). It never leaves [1, ceiling]. A shared endpoint (a team's vLLM, a
provider's API) gets as much as it serves without falling over.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from typing import Any


class FixedLimit:
    def __init__(self, limit: int):
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)

    async def acquire(self) -> None:
        await self._semaphore.acquire()

    def release(self, seconds: float, overloaded: bool) -> None:
        self._semaphore.release()

    def report(self) -> dict[str, Any]:
        return {"mode": "fixed", "limit": self.limit}


class AdaptiveLimit:
    def __init__(self, ceiling: int = 256, start: int = 8, latency_factor: float = 2.5):
        self.ceiling = max(1, ceiling)
        self.limit = min(start, self.ceiling)
        self.start = self.limit
        self.latency_factor = latency_factor
        self.in_flight = 0
        self.slow_start = True
        self.answers_in_window = 0
        self.latencies: deque[float] = deque(maxlen=64)
        self.floor = float("inf")  # the lowest latency seen: the endpoint unloaded
        self.decreases = 0
        self.last_decrease = 0.0
        self.peak = self.limit
        self.changes: list[tuple[float, int]] = [(time.monotonic(), self.limit)]
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        while self.in_flight >= self.limit:
            future = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            try:
                await future
            except asyncio.CancelledError:
                if future in self._waiters:
                    self._waiters.remove(future)
                raise
        self.in_flight += 1

    def release(self, seconds: float, overloaded: bool) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        if overloaded:
            recent = statistics.median(self.latencies) if self.latencies else 0.0
            if now - self.last_decrease > max(recent, 0.05):  # one burst of refusals: once
                self.slow_start = False
                self.decreases += 1
                self.last_decrease = now
                self._set(max(1, self.limit // 2), now)
        else:
            self.latencies.append(seconds)
            self.floor = min(self.floor, seconds)
            self.answers_in_window += 1
            if self.answers_in_window >= self.limit:
                self.answers_in_window = 0
                if statistics.median(self.latencies) <= self.latency_factor * self.floor:
                    grown = self.limit * 2 if self.slow_start else self.limit + 1
                    self._set(min(self.ceiling, grown), now)
                else:
                    self.slow_start = False  # latency grew: hold, and grow by one from now on
        self._wake()

    def _set(self, limit: int, now: float) -> None:
        if limit != self.limit:
            self.limit = limit
            self.peak = max(self.peak, limit)
            self.changes.append((now, limit))

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        while free > 0 and self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                free -= 1

    def report(self) -> dict[str, Any]:
        """Where it settled: the final limit, the time-weighted mean, the peak, the decreases."""
        now = time.monotonic()
        spans = list(zip(self.changes, self.changes[1:] + [(now, self.limit)], strict=True))
        total = sum(b[0] - a[0] for a, b in spans)
        mean = sum((b[0] - a[0]) * a[1] for a, b in spans) / total if total > 0 else self.limit
        return {
            "mode": "auto",
            "ceiling": self.ceiling,
            "start": self.start,
            "settled": self.limit,
            "mean": round(mean, 1),
            "peak": self.peak,
            "decreases": self.decreases,
        }
