"""The HTTP layer under ``EvalClient``: JSON over one pooled aiohttp session.

Any OpenAI-compatible endpoint (vLLM, SGLang, TGI, Ray Serve, OpenAI) takes the same POST of
``/chat/completions`` and answers with the same JSON; the client keeps that JSON as a plain dict
(what it caches and parses), so no per-response model objects are built. Every failure is sorted
into one of the classes in ``FAULTS``; the client retries the transient ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import time
from typing import Any

import aiohttp
import orjson

from .credentials import authorization, take_credentials
from .redact import clipped, redact

# status -> what the client does with it (docs/serving.md's table is this one)
FAULTS = {
    "connection refused, reset or dropped; timeout": "retried with backoff; then the run stops",
    "200 whose body is not a complete completion (cut off, not JSON, no choices)": (
        "retried; then the item fails with the last error"
    ),
    "408, 409, 425, 429, 500, 502, 503, 504 and other 5xx": (
        "retried, Retry-After honoured; then the item fails with the last error (8 calls given "
        "up in a row: the run stops)"
    ),
    "400, 413, 422": "the item fails (its request is malformed, e.g. longer than the context)",
    "401, 403, 404 and other 4xx": "the run stops with one line (auth, unknown model or adapter)",
}
RETRY_STATUS = frozenset({408, 409, 425, 429})


class TransportError(Exception):
    """A request that did not produce a completion; its words never hold a key (``redact``:
    a server's error body may echo the key it was sent)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))

    retryable = True
    overloaded = False  # the server says it is too busy: an adaptive limit backs off
    status: int | None = None
    retry_after: float | None = None


class ConnectionFault(TransportError):
    """The connection failed or timed out before a whole response arrived."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.overloaded = timed_out


class BrokenBody(TransportError):
    """A 2xx whose body is not a complete completion: cut off, not JSON, or without choices."""


class StatusError(TransportError):
    """The server answered with an HTTP error status."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        message = redact(message)
        super().__init__(f"{status} {message}")
        self.status, self.message, self.retry_after = status, message, retry_after
        self.retryable = status >= 500 or status in RETRY_STATUS
        self.overloaded = status in (429, 503, 504)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_message(payload: bytes) -> str:
    """The server's own words, on one line: OpenAI's {"error": {"message"}}, FastAPI's
    {"detail"}, or the text."""
    text = payload.decode("utf-8", "replace")
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            text = str(error["message"])
        elif isinstance(error, str):
            text = error
        elif data.get("detail"):
            text = str(data["detail"])
        elif data.get("message"):
            text = str(data["message"])
    return clipped(text, 300)  # redacted before the cut: no head of a key left behind


class HttpTransport:
    """POST and GET JSON on one endpoint through one keep-alive connection pool sized to the
    client's concurrency. The session belongs to the event loop that first used it; a client
    used from a later loop (a second ``asyncio.run``) gets a new one."""

    def __init__(self, base_url: str, api_key: str, timeout: float, connections: int):
        self.base_url = take_credentials(base_url).rstrip("/")  # user-info: held, never shown
        self.headers = {
            "Authorization": authorization(self.base_url, api_key),
            "Content-Type": "application/json",
        }
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.connections = max(1, connections)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._forget_session()
            connector = aiohttp.TCPConnector(
                limit=self.connections, limit_per_host=self.connections, keepalive_timeout=75
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, headers=self.headers
            )
            self._loop = loop
        return self._session

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A completion as a dict, or a ``TransportError`` saying which kind of failure."""
        payload = await self._send("POST", path, orjson.dumps(body))
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise BrokenBody(
                f"the response body is not JSON ({len(payload)} bytes): {exc}"
            ) from exc
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise BrokenBody(f"the response has no choices: {error_message(payload)}")
        if not data["choices"]:
            raise BrokenBody("the response has an empty list of choices")
        return data

    async def get(self, path: str) -> Any:
        return orjson.loads(await self._send("GET", path, None))

    async def _send(self, method: str, path: str, data: bytes | None) -> bytes:
        try:
            async with self.session().request(method, self.base_url + path, data=data) as response:
                payload = await response.read()
                if response.status >= 400:
                    raise StatusError(
                        response.status,
                        error_message(payload),
                        retry_after(response.headers.get("Retry-After")),
                    )
                return payload
        except asyncio.TimeoutError as exc:
            raise ConnectionFault(f"no answer within {self.timeout.total} s", True) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionFault(f"{type(exc).__name__}: {exc}") from exc

    def _forget_session(self) -> None:
        """Drop a session whose event loop has ended (a second ``asyncio.run``): its sockets
        cannot be closed from this loop; mark it closed so it does not warn as unclosed."""
        old, self._session = self._session, None
        if old is None or old.closed:
            return
        connector = old.connector
        old.detach()
        close = getattr(connector, "_close", None)  # aiohttp's own: sync, no await needed
        if callable(close):
            with contextlib.suppress(Exception):
                close()

    async def close(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            session, self._session = self._session, None
            if not session.closed:
                await session.close()
        else:
            self._forget_session()
