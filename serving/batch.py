"""Judge calls bought as batch jobs instead of one request at a time.

A framework asks item by item, stage after stage, so the calls of a run do not exist up front:
``Batcher`` collects the requests of every item in flight until none has arrived for
``settle`` seconds (every item then waits on the model) or ``max_lines`` are queued, writes them
as one file in the OpenAI Batch API's JSONL (``custom_id`` = the request's content-addressed cache
key), submits it, and hands each answer to the request that waits on it; the items go on to
their next stage, whose requests make the next round.

Two executors run a batch file: ``OpenAIBatches`` (an OpenAI-compatible ``/files`` +
``/batches`` endpoint: a hosted provider at its batch price) and ``LocalRunBatch`` (``vllm
run-batch`` for a model served here, at the engine's own pace, with no server:
``batch_local.py``). What a provider's words mean is ``batch_said.py``'s table.

Bought once, whatever the provider does:

- **Write-ahead, found with patience.** A round's file is uploaded and its file id, its custom
  ids and a tag (sent as the batch's ``metadata``) recorded in the folder's ``ledger.jsonl``
  *before* the batch is created; the batch id is recorded as soon as it is known. A create
  refused (429, a limit's words) made nothing and is asked again after its wait. One whose
  answer is lost (a timeout, a reset, a 5xx, a kill) is looked for by its tag over a settle
  window (a provider's list is eventually consistent), paging by the last id seen; a pass that
  cannot read the listing to its end (a page repeated while it says there are more) never
  leads to a second create (``Undecided``: the run stops, a resume looks again). A tagged
  batch the ledger does not know, found on any listing, on the last look before the run ends,
  or on a resume, is adopted and collected (a duplicate still running is cancelled), never
  left billed and unused. A batch forgotten (``groundcover batch forget``) while it ran is
  cancelled once at the next open, what it answered kept.
- **A download is checked before it is believed**: its complete lines against the batch's
  ``request_counts``, a cut last line, its decoding. A short, cut or undecodable file (or a
  404 right after completion) is downloaded again, a few times; then its lines are read as far
  as they go and the missing ones treated by cause (``cut``, ``vanished``, ``unreadable``):
  bought again once, with a note in the ledger, never as if simply unanswered.
- **Odd shapes fail the line, not the run.** An unreadable line, ``errors`` of any shape, a
  file that is not UTF-8: recorded against their own requests with the provider's words (keys
  redacted before anything is cut); a batch that cannot be read at all fails its own lines and
  is released (asked again, it is polled again), and other batches go on.
- **Failures by what they mean** (``PROVIDER_MESSAGES``, one table): a rate, enqueued-token or
  capacity limit waits and creates the same file's batch again, with backoff, for at most the
  batch window; only a batch-specific size or token rejection splits it; a line answered
  400 / 413 / 422 fails its item; 401 / 403 / 404 stop the run.
- **Every wait ends.** A batch still running past its ``expires_at`` (or its completion
  window) plus ``grace`` is cancelled, its partial output used, its other lines bought again
  once (then failed with a line naming the batch).
- **Any drivers.** A pending batch of any folder of the client is waited for by whoever asks
  one of its lines; an upload left without a batch is recovered by the folder's owner, or by
  one adopter of a gone driver's folder. ``groundcover batch status RUN`` shows every batch;
  ``batch forget RUN BATCH [--rebuy]`` is the way out of one that cannot end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import re
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from .batch_local import (
    LocalRunBatch,
    command_line,
    end_engine_group,
    process_start,
)
from .batch_said import (
    PROVIDER_MESSAGES,
    REJECT,
    SPLIT,
    STOP,
    WAIT,
    BatchState,
    Said,
    batch_errors,
    error_text,
    meaning_of,
    words,
)
from .credentials import authorization, take_credentials
from .files import atomic_file, make_dirs, open_unlinked, write_atomic

__all__ = [  # re-exported: the local engine and the provider's words, from their own modules
    "PROVIDER_MESSAGES",
    "REJECT",
    "SPLIT",
    "STOP",
    "WAIT",
    "BatchState",
    "LocalRunBatch",
    "Said",
    "batch_errors",
    "command_line",
    "end_engine_group",
    "error_text",
    "meaning_of",
    "process_start",
    "words",
]

CHAT_URL = "/v1/chat/completions"  # the one endpoint a batch line names (the Batch API's)
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling", "queued", "pending"})
RETRY_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx: the provider, not the request
STOP_STATUS = frozenset({401, 403, 404})  # a key, a model or an endpoint is wrong
REJECT_STATUS = frozenset({400, 413, 422})  # the line itself is wrong: asking again cannot help
GONE_STATUS = frozenset({404, 410})  # a file the provider no longer has
MAX_BYTES = 200_000_000  # OpenAI's limit per batch file
TAG_FIELD = "groundcover"  # the metadata key a batch's tag goes in
FOLDER_FILE = "folder.json"  # a folder's own nonce: the tags of its batches
LEDGER = "ledger.jsonl"
DOWNLOADS = 3  # tries of a download that is short, cut, undecodable or not there yet
ONCE = frozenset({"cut", "vanished", "stuck"})  # lines paid for but lost: bought again once


class BatchError(RuntimeError):
    """The batch endpoint (or ``vllm run-batch``) cannot take or run batches: the run stops."""


class BatchUnreadable(BatchError):
    """One batch's answer cannot be read (no id, a status none of the Batch API's): its own
    lines fail, it is released, and every other batch goes on."""


class TooBig(BatchError):
    """The provider refused a file or a batch for its size: it is split and sent again."""


class Gone(Exception):
    """A file the provider no longer has (404 / 410)."""


class AskOnline(RuntimeError):
    """A failed batch line to be asked again online (``retry_online``), not in a round."""


class LineFailed(RuntimeError):
    """A request whose line failed in ``max_attempts`` batches, or was refused: its item
    fails."""


class Executor(Protocol):
    """Runs batch files: uploads one (a file id back), creates its batch (the batch id back),
    finds a batch it made by its tag or file, says where a batch stands, cancels one."""

    name: str
    window: str
    tagged: dict[str, str]  # batch id -> tag, of every tagged batch a listing showed
    seen: set[str]  # batch ids known to exist (made, listed, recorded): older than a create
    lost: Counter[str]  # tag -> creates whose answer was lost and whose batch was not found

    async def upload(self, path: Path) -> str: ...

    async def create(self, file_id: str, path: Path, tag: str) -> str: ...

    async def find(
        self, tag: str, file_id: str, since: float = 0.0, earlier: frozenset[str] = frozenset()
    ) -> str | None: ...

    async def scan(self, prefix: str, since: float) -> None: ...

    async def poll(self, batch_id: str, path: Path) -> BatchState: ...

    async def cancel(self, batch_id: str) -> None: ...

    def about(self, batch_id: str) -> dict[str, Any]: ...

    def found_pending(self, event: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Capped exponential backoff with full jitter: no two clients retry in step."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2**attempt)


def window_seconds(window: str) -> float:
    """ "24h" -> 86400 s (the Batch API's completion windows are hours)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([hms]?)\s*", window)
    if found is None:
        return 86_400.0
    return float(found[1]) * {"h": 3600, "m": 60, "s": 1, "": 3600}[found[2]]


class Blip(Exception):
    """A call that failed for a reason that passes (5xx, 429, a reset, a timeout). ``unclear``:
    whether the call took effect is unknown (a timeout, a reset, a 5xx, a body that is not
    JSON: a create may have made its batch); a refusal (429, a limit's words at a 4xx) made
    nothing."""

    def __init__(self, why: str, wait: float | None = None, unclear: bool = False):
        super().__init__(why)
        self.wait = wait
        self.unclear = unclear


class Undecided(BatchError):
    """Whether a lost create made its batch cannot be told: the provider's listing could not
    be read to its end (a page repeated while it said there were more, or too many pages).
    Nothing is created again (it would be bought twice): the run stops, a resume looks again."""


CLOCK_SLACK = 3600.0  # seconds a provider's clock may be behind ours: older batches are not ours
LIST_LIMIT = 100  # batches asked per listing page: OpenAI's most (its default is 20)


# ---- executors ------------------------------------------------------------------------------


class OpenAIBatches:
    """An OpenAI-compatible Batch API: upload the file (``purpose=batch``), create the batch
    (with its tag in ``metadata``), poll it, download its output and error files (checked
    against its ``request_counts``), list the batches to find one whose create answer was lost,
    cancel one that will not end.

    Answers in another shape are read where they are unambiguous (a batch wrapped in one key,
    ``{"job": {...}}`` or ``{"batch": {...}}``; statuses in capitals); a batch answer that is
    not (no id, a status none of the Batch API's) fails that batch's lines in one line naming
    what is missing, never an endless poll."""

    name = "openai-batch"

    def __init__(
        self,
        base_url: str,
        api_key: str,
        window: str = "24h",
        timeout: float = 300.0,
        patience: float | None = None,
        find_window: float = 30.0,
        downloads: int = DOWNLOADS,
        download_pause: float = 0.5,
    ):
        """``find_window``: how long a lost create is looked for in the listing (which lags
        the creates on real providers) before the batch is created again; ``downloads``: tries
        of an output file that comes short, cut or not there yet, the first ``download_pause``
        seconds apart (then doubling)."""
        # a URL's user-info is held apart and sent as the rest of the client sends it (HTTP
        # Basic); never in what is recorded or shown
        self.base_url = take_credentials(base_url).rstrip("/")
        self.headers = {"Authorization": authorization(self.base_url, api_key)}
        self.window = window
        # a connection or a read that stalls for ``timeout`` is a blip; a long download is not
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self.patience = min(patience or 3600.0, window_seconds(window))
        self.find_window = find_window
        self.downloads = max(1, downloads)
        self.download_pause = download_pause
        self.tagged: dict[str, str] = {}  # batch id -> tag, of every listing read
        self.seen: set[str] = set()  # batch ids known to exist: made, listed or recorded
        self.pages = 0  # listing pages read (the tests count them)
        self.lost: Counter[str] = Counter()  # tag -> creates lost and not found, asked again
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        return self._session

    async def _patiently(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` until it answers, waiting out blips for at most ``patience`` seconds."""
        deadline = time.monotonic() + self.patience
        attempt = 0
        while True:
            try:
                return await call()
            except Blip as exc:
                wait = exc.wait if exc.wait is not None else backoff(attempt)
                if time.monotonic() + wait > deadline:
                    raise BatchError(
                        f"{what}: still failing after {self.patience:.0f} s ({exc}); the same "
                        "command resumes"
                    ) from None
                attempt += 1
                await asyncio.sleep(wait)

    async def _once(
        self, method: str, path: str, to_file: Path | None = None, **kw: Any
    ) -> dict[str, Any]:
        """One call: its JSON object (or, ``to_file``, the body streamed there); a blip, a
        ``Gone`` file, a ``TooBig`` refusal or a ``BatchError`` saying why not."""
        url = f"{self.base_url}{path}"
        try:
            async with self.session.request(method, url, **kw) as response:
                if response.status >= 400:
                    said, code = said_in(await response.text(errors="replace"))
                    why = f"{method} {url}: {response.status} {said}"
                    meaning = meaning_of(said, code)
                    later = _retry_after(response.headers.get("Retry-After"))
                    if to_file is not None and response.status in GONE_STATUS:
                        raise Gone(why)
                    if meaning == STOP:  # no quota: waiting does not end it, even as a 429
                        raise BatchError(why)
                    if response.status >= 500:  # a gateway may have passed the call on
                        raise Blip(why, later, unclear=True)
                    if meaning == WAIT or response.status in RETRY_STATUS:
                        raise Blip(why, later)  # refused: nothing was done
                    if meaning == SPLIT or response.status == 413:
                        raise TooBig(why)
                    raise BatchError(why)
                if to_file is not None:
                    with atomic_file(to_file, "wb", within=to_file.parent) as handle:
                        async for chunk in response.content.iter_chunked(1 << 20):
                            handle.write(chunk)
                    return {}
                text = await response.text(errors="replace")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            why = f"{method} {url}: {type(exc).__name__}: {words(exc)}"
            raise Blip(why, unclear=True) from exc
        except asyncio.TimeoutError as exc:
            raise Blip(f"{method} {url}: no answer in time", unclear=True) from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            why = f"{method} {url}: the answer is not JSON ({len(text)} bytes)"
            raise Blip(why, unclear=True) from None
        if not isinstance(data, dict):
            raise BatchError(f"{method} {url}: the answer is not a JSON object")
        return data

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return await self._patiently(f"{method} {path}", lambda: self._once(method, path, **kw))

    async def upload(self, path: Path) -> str:
        def form() -> aiohttp.FormData:  # a form is sent once: a new one for each attempt
            data = aiohttp.FormData()
            data.add_field("purpose", "batch")
            data.add_field(
                "file", path.read_bytes(), filename=path.name, content_type="application/jsonl"
            )
            return data

        uploaded = await self._patiently(
            "POST /files", lambda: self._once("POST", "/files", data=form())
        )
        return str(unwrap(uploaded, "POST /files")["id"])

    @property
    def lost_creates(self) -> int:
        """Creates whose answer was lost and whose batch no search found (asked again)."""
        return sum(self.lost.values())

    async def create(self, file_id: str, path: Path, tag: str) -> str:
        """The batch of ``file_id``, made once. A create refused (429, a limit's words) made
        nothing: it is asked again after its ``Retry-After``. One whose answer is lost (a
        timeout, a reset, a 5xx, a body that is not JSON) is looked for by its tag, over
        ``find_window`` seconds, before it is asked again; where the listing cannot say, it is
        not asked again (``Undecided``)."""
        body = {
            "input_file_id": file_id,
            "endpoint": CHAT_URL,
            "completion_window": self.window,
            "metadata": {TAG_FIELD: tag},
        }

        async def attempt() -> dict[str, Any]:
            earlier = frozenset(self.seen)  # every batch known now is older than this one
            since = time.time() - CLOCK_SLACK
            try:
                return await self._once("POST", "/batches", json=body)
            except Blip as blip:
                if not blip.unclear:  # refused: nothing was made
                    raise
                found = await self.find(tag, file_id, since, earlier)  # made, its answer lost?
                if found is not None:
                    return {"id": found}
                self.lost[tag] += 1  # made later, perhaps: the next listings look
                raise

        created = unwrap(await self._patiently("POST /batches", attempt), "POST /batches")
        self.seen.add(str(created["id"]))
        return str(created["id"])

    async def find(
        self, tag: str, file_id: str, since: float = 0.0, earlier: frozenset[str] = frozenset()
    ) -> str | None:
        """The id of the batch with ``tag`` (or made from ``file_id`` and carrying no tag),
        looked for until ``find_window`` has passed (a listing lags the creates); None when
        the last pass read the listing to its end (the last page, a batch made before ``since``
        or one of ``earlier``, batches known to be older than the one looked for) and saw none.
        Where it could not (a cursor that does not move), a batch with ``tag`` an earlier
        listing showed is asked for by its id; else ``Undecided``: never a second batch."""
        deadline = time.monotonic() + self.find_window
        pause = min(5.0, max(0.02, self.find_window / 10))
        while True:
            listed = await self._listing(tag, file_id, since=since, earlier=earlier)
            if listed.found is not None:
                return listed.found
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        if listed.whole:
            return None
        for batch_id in [b for b, mark in self.tagged.items() if mark == tag]:
            with contextlib.suppress(BatchError):  # listed once: retrieved by its id
                unwrap(await self._call("GET", f"/batches/{batch_id}"), "GET /batches")
                return batch_id
        raise Undecided(
            f"GET /batches: whether the batch of file {file_id} (tag {tag}) was made cannot be "
            f"told: the provider's listing {listed.why}; it is not created again (it would be "
            "bought twice): the same command resumes and looks for it again"
        )

    async def scan(self, prefix: str, since: float) -> None:
        """Every batch tagged under ``prefix`` made since ``since`` (unix seconds) into
        ``tagged``: a resume adopts those its ledger does not know. Best effort: a provider
        without a listing answers nothing here."""
        with contextlib.suppress(BatchError):
            await self._listing(None, None, prefix=prefix, since=since)

    async def _listing(
        self,
        tag: str | None,
        file_id: str | None,
        prefix: str = "",
        since: float = 0.0,
        earlier: frozenset[str] = frozenset(),
    ) -> Listed:
        """One pass over the listing, newest first, paged by the last id seen (not the
        ``last_id`` a provider claims). It is read whole at the last page (or an empty one), a
        batch made before ``since``, or one of ``earlier`` (known older than the one looked
        for); it stops short on a page seen before while the provider says there are more (a
        cursor that does not move) or after 1,000 pages. Every tagged batch seen goes into
        ``tagged``; the one with ``tag`` (or the untagged one made from ``file_id``) is
        ``found``."""
        after: str | None = None
        seen: set[str] = set()
        for _ in range(1000):
            query = f"?limit={LIST_LIMIT}" + (f"&after={after}" if after else "")
            page = await self._call("GET", f"/batches{query}")
            self.pages += 1
            if not isinstance(page.get("data"), list):
                raise BatchError("GET /batches: the answer has no list of batches (field data)")
            batches = [unwrap_any(b) for b in page["data"] if isinstance(b, dict)]
            ids = [str(b.get("id")) for b in batches]
            fresh = [i for i in ids if i not in seen]
            found, older = None, False
            for batch in batches:
                metadata = batch.get("metadata")
                mark = metadata.get(TAG_FIELD) if isinstance(metadata, dict) else None
                if isinstance(mark, str) and mark.startswith(prefix):
                    self.tagged[str(batch.get("id"))] = mark
                if tag is not None and (
                    mark == tag or (mark is None and batch.get("input_file_id") == file_id)
                ):
                    found = found or str(batch.get("id"))
                created = batch.get("created_at")
                older = older or (isinstance(created, int | float) and created < since)
            self.seen.update(ids)
            if found is not None:
                return Listed(found, True)
            if not ids or not page.get("has_more") or older or earlier.intersection(ids):
                return Listed(None, True)  # the end, or past what could be the one looked for
            if not fresh:
                return Listed(None, False, "repeated a page while it said there were more")
            seen.update(ids)
            after = fresh[-1]
        return Listed(None, False, "had more than 1,000 pages")

    async def poll(self, batch_id: str, path: Path) -> BatchState:
        answer = await self._call("GET", f"/batches/{batch_id}")
        batch = unwrap(answer, f"GET /batches/{batch_id}", BatchUnreadable)
        status = str(batch.get("status", "")).lower()
        state = BatchState(
            status,
            counts=_counts(batch.get("request_counts")),
            expires_at=_seconds(batch.get("expires_at")),
        )
        if status not in TERMINAL:
            if status not in RUNNING:
                raise BatchUnreadable(
                    f"GET /batches/{batch_id}: status {words(batch.get('status'), 60)!r} is "
                    f"none of the Batch API's ({', '.join(sorted(RUNNING | TERMINAL))})"
                )
            return state
        state.said = batch_errors(batch.get("errors"))
        state.message = "; ".join(e["message"] for e in state.said)
        completed, failed = state.counts.get("completed"), state.counts.get("failed")
        state.output, note, lost = await self._fetch(
            batch.get("output_file_id"), path, "out", completed
        )
        state.errors, error_note, error_lost = await self._fetch(
            batch.get("error_file_id"), path, "errors", failed
        )
        state.note = "; ".join(filter(None, (note, error_note)))
        state.lost = lost or error_lost
        return state

    async def _fetch(
        self, file_id: Any, path: Path, kind: str, expected: int | None
    ) -> tuple[bytes, str, str]:
        """A batch's file, checked (``shortfall``) and downloaded again while short, cut,
        undecodable or not there yet, ``downloads`` times in all; then (its bytes, why it is
        incomplete, the cause of the lines it lacks) -- read as far as it goes."""
        if not isinstance(file_id, str) or not file_id:
            return b"", "", ""
        data, why, cause = b"", "", ""
        for attempt in range(self.downloads):
            if attempt:
                await asyncio.sleep(backoff(attempt - 1, self.download_pause, 30.0))
            try:
                data = await self._download(file_id, path, kind)
            except Gone as gone:
                data, why, cause = b"", f"file {file_id} is gone ({gone})", "vanished"
                continue
            why = shortfall(data, expected)
            if not why:
                return data, "", ""
            cause = "unreadable" if "UTF-8" in why or "not JSON" in why else "cut"
        return data, f"{kind} file {file_id}: {why} after {self.downloads} downloads", cause

    async def _download(self, file_id: str, path: Path, kind: str) -> bytes:
        to = path.with_name(f"{path.stem}.{kind}.download")
        await self._call("GET", f"/files/{file_id}/content", to_file=to)
        try:
            return to.read_bytes()
        finally:
            to.unlink(missing_ok=True)

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop a batch (what it finished is still in its output)."""
        with contextlib.suppress(BatchError):  # already ended, or no cancel here: polled on
            await self._call("POST", f"/batches/{batch_id}/cancel")

    def about(self, batch_id: str) -> dict[str, Any]:
        return {}

    def found_pending(self, event: dict[str, Any]) -> None:
        pass

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass(frozen=True)
class Listed:
    """One pass over a provider's listing: the batch looked for (None: not seen), whether the
    pass read the listing to its end (or to batches older than the one looked for), and why
    it did not."""

    found: str | None
    whole: bool
    why: str = ""


def said_in(body: str) -> tuple[str, str]:
    """An error answer's words and code: the JSON body's ``error.message`` (OpenAI's and
    Azure's shape; any shape ``error_text`` reads) where it has one, else the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return words(body), ""
    if not isinstance(data, dict | list):
        return words(body), ""
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return words(error_text(data)) or words(body), code if isinstance(code, str) else ""


def unwrap_any(data: dict[str, Any]) -> dict[str, Any]:
    """A batch or file object also when wrapped in one key (``{"job": {...}}``)."""
    if "id" not in data and len(data) == 1:
        (inner,) = data.values()
        if isinstance(inner, dict):
            return inner
    return data


def unwrap(data: dict[str, Any], what: str, error: type[BatchError] = BatchError) -> dict[str, Any]:
    """A batch or file object, also when a provider wraps it in one key (``{"job": {...}}``);
    one line naming the field when it has no id."""
    data = unwrap_any(data)
    if not isinstance(data.get("id"), str) or not data["id"]:
        fields = ", ".join(sorted(words(k, 40) for k in data))
        raise error(f"{what}: the answer has no field id (it has: {fields})")
    return data


def _counts(value: Any) -> dict[str, int]:
    """A batch's ``request_counts`` as far as they are whole numbers."""
    if not isinstance(value, dict):
        return {}
    return {
        k: v
        for k, v in value.items()
        if k in ("total", "completed", "failed") and isinstance(v, int) and not isinstance(v, bool)
    }


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _retry_after(value: str | None) -> float | None:
    from .transport import retry_after

    return retry_after(value)


# ---- reading an output file -----------------------------------------------------------------

BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: some writers put one before the first line
CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"((?:[^"\\]|\\.){1,512})"')


@dataclass(frozen=True)
class Problem:
    """Why a line has no answer: its HTTP status (None: none given), the provider's words and
    the cause (``CAUSES``, or ``stop``: the run cannot go on)."""

    status: int | None
    text: str
    cause: str = "retried"


@dataclass
class Reading:
    """An output (or error) file read line by line."""

    answers: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, Problem] = field(default_factory=dict)
    lines: int = 0  # complete lines that name a request
    cut: bool = False  # the last line ends mid-way
    unreadable: int = 0  # lines that are not UTF-8 or not JSON


def read_output(data: bytes) -> Reading:
    """Each line's answer, or its problem with the provider's words; a line that cannot be read
    (not UTF-8, not JSON, a ``response`` that is no object, an answer without choices) is a
    problem of the request it names (``unreadable``), never of the file."""
    reading = Reading()
    rows = data.removeprefix(BOM).split(b"\n")
    last = rows.pop() if rows else b""
    if last.strip():  # no newline after it: a whole line, or one cut mid-way
        try:
            json.loads(last)
            rows.append(last)
        except ValueError:
            reading.cut = True
    for raw in rows:
        if raw.strip():
            _read_line(raw, reading)
    return reading


def _read_line(raw: bytes, reading: Reading) -> None:
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        reading.unreadable += 1
        named = CUSTOM_ID.search(raw)
        if named is not None:  # its request is known: the line fails alone
            cid = named[1].decode("utf-8", "replace")
            what = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON"
            reading.problems.setdefault(
                cid, Problem(None, f"the provider's line is {what}", "unreadable")
            )
        return
    if not isinstance(row, dict) or not isinstance(row.get("custom_id"), str):
        reading.unreadable += 1
        return
    reading.lines += 1
    cid, response, error = row["custom_id"], row.get("response"), row.get("error")
    if response is not None and not isinstance(response, dict):
        said = words(error_text(error) or response, 200)
        why = f"odd line: response is a {type(response).__name__}: {said}"
        reading.problems.setdefault(cid, Problem(None, why, "unreadable"))
        return
    response = response or {}
    code, body = response.get("status_code"), response.get("body")
    if code == 200 and not error:
        if _is_answer(body):
            reading.answers[cid] = body
            reading.problems.pop(cid, None)
        elif cid not in reading.answers:
            shape = f"a {type(body).__name__}" if not isinstance(body, dict) else "no choices"
            why = f"odd line: an answer with {shape}"
            reading.problems[cid] = Problem(None, why, "unreadable")
        return
    if cid in reading.answers:
        return
    inner = body.get("error") if isinstance(body, dict) else body
    said = words(error_text(error) or error_text(inner)) or "failed"
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    if status is None and error:
        status = 500  # an error line without a status: the provider's
    text = f"{code if code is not None else 'error'}: {said}"
    reading.problems[cid] = Problem(status, text, line_cause(status, said))


def _is_answer(body: Any) -> bool:
    """A chat completion the client can read: an object with a list of choices."""
    if not isinstance(body, dict):
        return False
    choices = body.get("choices")
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)


def line_cause(status: int | None, said: str) -> str:
    """A failed line's cause by its status and words (``PROVIDER_MESSAGES``)."""
    meaning = meaning_of(said)
    if meaning == WAIT:
        return "retried"
    if status in STOP_STATUS or meaning == STOP:
        return "stop"
    if status in REJECT_STATUS or meaning == REJECT:
        return "rejected"
    return "retried"


def shortfall(data: bytes, expected: int | None) -> str:
    """Why a downloaded file is not yet to be believed ("" when it is): its last line cut, a
    line not UTF-8 or not JSON, fewer complete lines than the batch's ``request_counts``."""
    reading = read_output(data)
    if reading.cut:
        return "its last line is cut"
    if reading.unreadable:
        return f"{reading.unreadable} line(s) not UTF-8 or not JSON"
    if expected is not None and reading.lines < expected:
        return f"{reading.lines} complete lines of the {expected} its batch counts"
    return ""


def outcome(
    state: BatchState, batch_id: str, ids: list[str]
) -> tuple[dict[str, Any], dict[str, Problem]]:
    """Each id's answer body, or why it has none: its own line's problem, or (missing from the
    files) the cause the batch gives -- lost with a cut or vanished output, expired, cancelled
    when stuck, or simply absent."""
    answers: dict[str, Any] = {}
    problems: dict[str, Problem] = {}
    for data in (state.output, state.errors):
        reading = read_output(data)
        answers.update(reading.answers)
        for cid, problem in reading.problems.items():
            problems.setdefault(cid, problem)
    for cid in answers:
        problems.pop(cid, None)
    for cid in ids:
        if cid in answers or cid in problems:
            continue
        if state.lost:
            cause, why = state.lost, state.note
        elif state.status in ("expired", "cancelled"):
            cause, why = ("stuck" if state.note else "expired"), state.note or state.message
        else:
            cause, why = "missing", state.message or "its line is not in the output"
        text = f"batch {batch_id} {state.status}" + (f": {why}" if why else "")
        problems[cid] = Problem(None, words(text), cause)
    return answers, problems


@functools.lru_cache(maxsize=4)
def _answers_in(output: Path) -> dict[str, Any]:
    """The answer bodies of a kept output file, by custom id (the last few files read stay
    parsed: a resumed run asks for a batch's answers one after another)."""
    if not output.is_file():
        return {}
    return read_output(output.read_bytes()).answers


def _read_lines(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    lines = {}
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            lines[row["custom_id"]] = row["body"]
    return lines


# ---- the batcher ----------------------------------------------------------------------------


@dataclass
class BatchRecord:
    """One batch of the run, as its ledger and ``report`` show it."""

    batch: str
    round: int
    lines: int
    status: str = "submitted"
    failed: int = 0
    waited_s: float = 0.0


# what happened to a line that was not answered, by cause (``causes``)
CAUSES = {
    "rejected": "a line answered 400 / 413 / 422 or refused before it was sent: its item failed",
    "retried": "a line answered 5xx / 429: sent again in a later round",
    "expired": "a line of an expired or cancelled batch: sent again in a later round",
    "missing": "a line absent from a whole output: sent again in a later round",
    "split": "a batch failed for its size or a token limit of its own: split and sent again",
    "queued": "a batch failed for a limit of the account (enqueued tokens, rate): created again",
    "unreadable": "a line the provider sent in an odd shape or not UTF-8: sent again",
    "cut": "a line paid for but lost to an output cut short: bought again once",
    "vanished": "a line paid for whose output file was gone (404): bought again once",
    "stuck": "a line of a batch past its expires_at, cancelled: bought again once",
    "given_up": "a line that failed in every attempt: its item failed",
}


@dataclass
class BatchStats:
    rounds: int = 0
    submitted: int = 0  # lines sent in batches (this invocation)
    answered: int = 0  # requests answered by a batch, this invocation's or a kept one
    requeued: int = 0  # failed lines sent again in a later round
    failed: int = 0  # requests whose item failed (given up, or rejected)
    online: int = 0  # failed lines asked again online (retry_online)
    resumed: int = 0  # batches found pending in a ledger and waited for again
    recovered: int = 0  # uploads a killed run left without a batch: found or created
    adopted: int = 0  # batches the provider made that no ledger knew: collected
    waited_s: float = 0.0
    causes: Counter[str] = field(default_factory=Counter)
    batches: list[BatchRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "submitted": self.submitted,
            "answered": self.answered,
            "requeued": self.requeued,
            "failed": self.failed,
            "online": self.online,
            "resumed": self.resumed,
            "recovered": self.recovered,
            "adopted": self.adopted,
            "waited_s": round(self.waited_s, 3),
            "causes": dict(sorted(self.causes.items())),
            "batches": [vars(b) for b in self.batches],
        }


@dataclass
class Upload:
    """An uploaded batch file, recorded before its batch is created (found or made once)."""

    folder: Path
    file: str
    file_id: str
    tag: str
    round: int
    ids: list[str]
    since: float = 0.0  # unix seconds it was uploaded


@dataclass
class Pending:
    """A submitted batch not yet finished: its lines and where its ledger and file are."""

    batch: str
    ids: list[str]
    folder: Path
    file: str
    round: int
    file_id: str = ""
    tag: str = ""
    since: float = 0.0  # unix seconds it was submitted
    watched: bool = False
    forgotten: bool = False  # ``batch forget``: cancelled at the next open, not waited for


Orphan = Upload  # the earlier name of an upload a killed run left without a batch


class Batcher:
    """Requests collected into batch rounds (see the module's docstring). One per evaluator
    client; ``folder`` is the run's ``batches/`` folder for that model."""

    def __init__(
        self,
        executor: Executor,
        folder: Path,
        *,
        settle: float = 1.0,
        max_lines: int = 10_000,
        max_bytes: int = MAX_BYTES,
        poll: float = 10.0,
        max_attempts: int = 3,
        retry_online: bool = False,
        adopt: Sequence[Path] = (),
        siblings: Sequence[Path] = (),
        retry_base: float = 1.0,
        grace: float = 3600.0,
        within: Path | None = None,
        owner_wait: float = 300.0,
    ):
        """``adopt``: folders of batchers gone from this invocation (drivers of an earlier
        run with more of them) whose uploads left without a batch this one recovers;
        ``siblings``: the client's other folders. Every folder's finished outputs answer here
        and its pending batches are waited for by whoever asks one of their lines: nothing
        any of them bought is bought again. ``grace``: how long past its ``expires_at`` (or
        its completion window) a batch is polled before it is cancelled; ``within``: the
        folder the user named (the run directory): no link below it is written through."""
        self.executor = executor
        self.folder = folder
        if within is None:  # a folder named by the caller: its own writes stay inside it
            folder.mkdir(parents=True, exist_ok=True)
        self.within = within if within is not None else folder
        self.ledger = folder / LEDGER
        self.settle, self.max_lines, self.max_bytes, self.poll = settle, max_lines, max_bytes, poll
        self.max_attempts = max_attempts
        self.retry_online = retry_online  # a failed line is asked again online, at once
        self.retry_base = retry_base  # the first backoff before a failed line's next round
        self.grace = grace
        self.owner_wait = owner_wait  # a sibling's upload: how long its owner has to buy it
        self.window = window_seconds(getattr(executor, "window", "24h"))
        self.stats = BatchStats()
        # custom id -> the kept output that answers it (read when asked: a long run's answers
        # are not all held in memory; the response cache answers most of them anyway)
        self.kept: dict[str, Path] = {}
        self.batches: dict[str, Pending] = {}  # batch id -> a batch not yet finished
        self.queue: dict[str, dict[str, Any]] = {}  # custom id -> request body, next round
        self.waiting: dict[str, list[asyncio.Future]] = {}
        self.pending: dict[str, str] = {}  # custom id -> the batch (or upload tag) it is in
        self.bodies: dict[str, dict[str, Any]] = {}  # what each asked id sends (a requeue)
        self.attempts: dict[str, int] = {}
        self.lost: Counter[str] = Counter()  # custom id -> times paid for and lost (``ONCE``)
        self.orphans: list[Upload] = []
        self.uploads: dict[str, Upload] = {}  # tag -> upload, of the folders this one owns
        self.known: set[str] = set()  # every batch id a ledger read here records
        self.recovering: set[str] = set()  # tags of orphans being found or created
        self.foreign: dict[str, Upload] = {}  # tag -> a sibling's upload left without a batch
        self.done: set[str] = set()  # custom ids a batch answered (a duplicate need not)
        self.tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._opened = False
        self._queued_since: dict[str, float] = {}  # upload tag -> its first refusal (queue)
        self._scanned = 0  # lost creates already looked for among the provider's batches
        self.recorded_at: dict[str, float] = {}  # batch id -> when a ledger recorded it
        self.adopted_tags: Counter[str] = Counter()  # tag -> batches adopted carrying it
        self.forgotten: list[Pending] = []  # forgotten batches that may still run
        self.noted_unfound: Counter[str] = Counter()  # tag -> lost creates a ledger notes
        self._files = 0  # batch files written this invocation (their names)
        make_dirs(self.folder, within=self.within)
        self.nonce = folder_nonce(folder, self.within)
        rounds = [self._read_ledger(where, recover=False) for where in siblings]
        rounds += [self._read_ledger(where, recover=True) for where in adopt]
        self.stats.rounds = max([self._read_ledger(self.folder, recover=True), *rounds])

    # ---- the ledger: what was bought, and what came of it ----------------------------------

    def _read_ledger(self, folder: Path, recover: bool) -> int:
        """What ``folder``'s ledger bought: finished outputs answer, pending batches are
        waited for when asked; with ``recover``, uploads without a batch are this batcher's
        to find or create, and a batch the provider made from one of its uploads that no
        ledger knows is adopted. Its last round."""
        ledger = folder / LEDGER
        if not ledger.is_file():
            return 0
        uploaded: dict[str, dict[str, Any]] = {}  # tag -> event, not yet submitted
        submitted: dict[str, dict[str, Any]] = {}
        outputs: dict[str, str] = {}  # finished batch -> its kept output
        forgotten: dict[str, bool] = {}  # forgotten batch -> rebuy, while it may still run
        rounds = [0]
        for event in ledger_events(ledger):
            kind, batch = event.get("event"), str(event.get("batch"))
            rounds.append(event.get("round") or 0)
            if kind == "uploaded":
                uploaded[event["tag"]] = event
                if recover:
                    self.uploads[event["tag"]] = _upload_of(folder, event)
            elif kind == "submitted":
                submitted[batch] = event
                if event.get("adopted") and self.noted_unfound[event.get("tag", "")] > 0:
                    self.noted_unfound[event["tag"]] -= 1  # a create noted unfound, found
                self.known.add(batch)
                self.recorded_at[batch] = float(event.get("at") or 0.0)
                uploaded.pop(event.get("tag", ""), None)
            elif kind == "abandoned":
                uploaded.pop(event.get("tag", ""), None)
            elif kind == "finished":
                outputs[batch] = event["output"]
                forgotten.pop(batch, None)
                for cid in event.get("lost") or {}:
                    self.lost[cid] += 1
            elif kind == "forgotten" and batch in submitted:
                if batch not in outputs:  # it may still run at the provider: ended at open
                    forgotten[batch] = bool(event.get("rebuy"))
                outputs.setdefault(batch, "")
                if event.get("rebuy"):  # its answers set aside, its lines bought again
                    outputs[batch] = ""
                    for cid in submitted[batch]["custom_ids"]:
                        self.lost.pop(cid, None)
            elif kind == "forgotten_ended":  # cancelled once already
                forgotten.pop(batch, None)
            elif kind == "unfound" and recover:  # looked for again before this run ends
                self.noted_unfound[str(event.get("tag"))] += int(event.get("creates") or 1)
        for output in outputs.values():
            if output:
                self._keep(folder / output)
        for batch_id, event in submitted.items():
            if batch_id in outputs and not (recover and batch_id in forgotten):
                continue
            if recover:  # a live sibling's engine is its own: never ended from here
                self.executor.found_pending(event)
            ids = list(event["custom_ids"])
            pending = Pending(
                batch_id,
                ids,
                folder,
                event["file"],
                event["round"],
                str(event.get("file_id", "")),
                str(event.get("tag", "")),
                float(event.get("at") or time.time()),
            )
            self._bodies(folder / event["file"])
            if batch_id in forgotten:  # its lines wait for its cancel (unless --rebuy)
                pending.forgotten = True
                self.forgotten.append(pending)
                if forgotten[batch_id]:
                    continue
            self.batches[batch_id] = pending
            for cid in ids:
                self.pending.setdefault(cid, batch_id)
        for tag, event in uploaded.items():  # a sibling's: its owner finds or makes the batch
            orphan = _upload_of(folder, event)
            if recover:
                self.orphans.append(orphan)
            else:
                self.foreign.setdefault(tag, orphan)
            self._bodies(folder / orphan.file)
            for cid in orphan.ids:
                self.pending.setdefault(cid, tag)
        return max(rounds)

    def _bodies(self, path: Path) -> None:
        for cid, body in _read_lines(path).items():
            self.bodies.setdefault(cid, body)

    def _append(self, event: dict[str, Any], folder: Path | None = None) -> None:
        folder = folder or self.folder
        append_event(folder / LEDGER, event, self._within(folder))

    def _within(self, folder: Path) -> Path:
        """The folder no link below is written through: the run's, or (a folder outside it,
        given by the caller) that folder itself."""
        return self.within if folder.is_relative_to(self.within) else folder

    def _keep(self, output: Path) -> None:
        """Which ids a finished batch's kept output answers (error lines are not answers)."""
        for cid in _answers_in(output):
            self.kept[cid] = output

    # ---- asking ----------------------------------------------------------------------------

    async def ask(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``body`` (an OpenAI chat request), from a kept output, a pending batch
        or the next round."""
        self._open()
        if custom_id in self.kept:
            answer = _answers_in(self.kept.pop(custom_id)).get(custom_id)
            if answer is not None:
                self.stats.answered += 1
                return answer
        if self.lost[custom_id] > 1 and custom_id not in self.pending:
            raise LineFailed(
                f"paid for and lost {self.lost[custom_id]} times (see the ledger's notes); "
                "`groundcover batch forget RUN BATCH --rebuy` buys it again"
            )
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(custom_id, []).append(future)
        self.bodies.setdefault(custom_id, body)
        where = self.pending.get(custom_id)
        if where is None and custom_id not in self.queue:
            self._enqueue(custom_id)
        elif where in self.batches:
            self._watch(self.batches[where])
        elif where in self.foreign:
            self._spawn(self._await_owner(self.foreign.pop(where)))
        return await future

    async def _await_owner(self, orphan: Upload) -> None:
        """A sibling's upload a killed run left without its batch: its owner (or the adopter of
        its folder) finds or makes the batch and records it, so it is waited for here in that
        ledger. If nobody has within ``owner_wait`` (the owner asks nothing, say), it is found
        or made here from the same file and tag and recorded there: the owner's own search then
        finds this batch, never making a second. A local engine is never started for another's
        upload: its lines go into a round here instead."""
        deadline = time.monotonic() + self.owner_wait
        while (batch_id := _submitted(orphan)) is None and time.monotonic() < deadline:
            await asyncio.sleep(self.poll)
        local = self.executor.name == LocalRunBatch.name
        if batch_id is None and not local:
            path = orphan.folder / orphan.file
            batch_id = await self._find(orphan)
            if batch_id is None:
                batch_id = await self.executor.create(orphan.file_id, path, orphan.tag)
            batch_id = _submitted(orphan) or batch_id  # recorded meanwhile by its owner?
            if batch_id not in self.known:
                self._record(batch_id, orphan)
        if batch_id is None or batch_id == "":  # abandoned, or a local engine's: bought here
            for cid in orphan.ids:
                if self.pending.get(cid) == orphan.tag:
                    self.pending.pop(cid)
                    if self.waiting.get(cid):
                        self._enqueue(cid)
            return
        pending = self.batches.get(batch_id) or Pending(
            batch_id, orphan.ids, orphan.folder, orphan.file, orphan.round,
            orphan.file_id, orphan.tag, time.time(),
        )  # fmt: skip
        self.batches[batch_id] = pending
        self.known.add(batch_id)
        for cid in orphan.ids:
            if self.pending.get(cid) == orphan.tag:
                self.pending[cid] = batch_id
        self._watch(pending)

    def _open(self) -> None:
        """Once, in the running loop: the uploads a killed run left without a batch, and the
        provider's batches made from this folder's uploads that no ledger records."""
        if self._opened:
            return
        self._opened = True
        for pending in self.forgotten:
            pending.watched = True
            self._spawn(self._end_forgotten(pending))
        for orphan in self.orphans:
            self.recovering.add(orphan.tag)
            self._spawn(self._recover(orphan))
        if self.uploads:
            self._spawn(self._look_for_strays())
        for pending in list(self.batches.values()):  # a duplicate a run left pending
            mine = pending.folder == self.folder and not pending.watched
            if mine and all(c in self.kept for c in pending.ids):
                record = BatchRecord(pending.batch, pending.round, len(pending.ids), "resumed")
                pending.watched = True
                self._spawn(self._collect(pending, record, duplicate=True))

    async def _end_forgotten(self, pending: Pending) -> None:
        """A batch forgotten (``groundcover batch forget``) before it ended, perhaps still
        running at the provider: cancelled once (noted in the ledger, never again), waited for
        up to ``grace`` while its cancel ends; what it answered is kept (with ``--rebuy``, not
        waited for: its lines are bought again). A batch the provider no longer knows, or one
        whose cancel does not end in time, has its lines bought."""
        rebuy = pending.batch not in self.batches
        path = pending.folder / pending.file
        state: BatchState | None = None
        cancelled, why = False, ""
        began = time.monotonic()
        try:
            state = await self.executor.poll(pending.batch, path)
            if state.status not in TERMINAL:
                await self.executor.cancel(pending.batch)
                cancelled = True
            while not rebuy and state.status not in TERMINAL:
                if time.monotonic() - began > self.grace:
                    break
                await asyncio.sleep(self.poll)
                state = await self.executor.poll(pending.batch, path)
        except BatchError as exc:  # gone at the provider, unreadable: nothing to wait for
            why = words(exc)
        status = state.status if state is not None else None
        self._append(
            {"event": "forgotten_ended", "batch": pending.batch, "cancelled": cancelled}
            | {"status": status, "at": time.time()}
            | ({"why": why} if why else {}),
            pending.folder,
        )
        if rebuy:
            return
        if state is not None and state.status in ("completed", "cancelled", "expired"):
            record = BatchRecord(pending.batch, pending.round, len(pending.ids), "forgotten")
            record.waited_s = round(time.monotonic() - began, 3)
            self.stats.batches.append(record)
            with contextlib.suppress(BatchError):
                await self._finished(pending, record, state, forgotten=True)
                return
        self.batches.pop(pending.batch, None)
        for cid in pending.ids:  # nothing of it to keep: its lines are bought
            if self.pending.get(cid) == pending.batch:
                self.pending.pop(cid)
                if self.waiting.get(cid):
                    self._enqueue(cid)

    async def _look_for_strays(self) -> None:
        """Every batch the provider made from this folder's uploads since the first of them
        (an hour's slack for clocks), adopted where no ledger knows it."""
        self._scanned = getattr(self.executor, "lost_creates", 0)
        since = min(u.since for u in self.uploads.values()) - 3600
        await self.executor.scan("", since)
        self._adopt_seen()

    def _adopt_seen(self, collect: bool = True) -> list[tuple[Pending, BatchRecord, bool]]:
        """A tagged batch a listing showed that no ledger knows, made from one of this
        folder's uploads (a create that completed after its answer was lost, or after the
        search for it ended): recorded and collected, never left billed and unused. Where every
        line of it is bought elsewhere, it is a duplicate: cancelled if still running, and what
        it finished is kept all the same. Those adopted, each with whether it is a duplicate
        (``collect`` False: the caller collects them)."""
        adopted = []
        for batch_id, tag in list(self.executor.tagged.items()):
            upload = self.uploads.get(tag)
            if batch_id in self.known or upload is None or tag in self.recovering:
                continue  # known, not this folder's, or about to be found by its recovery
            self.stats.adopted += 1
            self.adopted_tags[tag] += 1
            pending = self._record(batch_id, upload, adopted=True)
            mine = [cid for cid in upload.ids if self.pending.get(cid) == batch_id]
            record = BatchRecord(batch_id, upload.round, len(upload.ids), status="adopted")
            self.stats.batches.append(record)
            pending.watched = True
            adopted.append((pending, record, not mine))
            if collect:
                self._spawn(self._collect(pending, record, duplicate=not mine))
        return adopted

    def _unfound(self) -> Counter[str]:
        """Tags of creates whose answer was lost and whose batch no listing has shown yet:
        this invocation's, and those an earlier one noted (``unfound``)."""
        lost = Counter(self.executor.lost) + self.noted_unfound
        lost.subtract(self.adopted_tags)
        return +lost

    async def _last_look(self) -> None:
        """Before the run ends, a create whose answer was lost and whose batch no listing has
        shown (a listing that lags past the search) is looked for once more, over the search
        window: a batch found is recorded, cancelled if a duplicate still running, and its
        output kept if it has ended (else the next run collects it); one still not found is
        noted in the ledger (``unfound``). One an earlier invocation noted is looked for with one
        pass, at every close until it is found."""
        if not self._unfound():
            return
        fresh = +(Counter(self.executor.lost) - self.adopted_tags)  # this invocation's
        window = float(getattr(self.executor, "find_window", 0.0)) if fresh else 0.0
        began = time.monotonic()
        since = min((u.since for u in self.uploads.values()), default=time.time()) - CLOCK_SLACK
        while True:
            await self.executor.scan("", since)
            for pending, record, duplicate in self._adopt_seen(collect=False):
                with contextlib.suppress(BatchError):
                    if duplicate:
                        await self.executor.cancel(pending.batch)
                    state = await self.executor.poll(pending.batch, pending.folder / pending.file)
                    if state.status in TERMINAL:
                        await self._finished(pending, record, state)
            if not self._unfound() or time.monotonic() - began >= window:
                break
            await asyncio.sleep(min(5.0, max(0.05, window / 10)))
        for tag, creates in self._unfound().items():
            creates -= self.noted_unfound[tag]  # already in the ledger
            upload = self.uploads.get(tag)
            if creates <= 0:
                continue
            self._append(
                {
                    "event": "unfound",
                    "tag": tag,
                    "creates": creates,
                    "searched_s": round(time.monotonic() - began, 3),
                    "at": time.time(),
                },
                upload.folder if upload is not None else None,
            )

    async def _collect(self, pending: Pending, record: BatchRecord, duplicate: bool) -> None:
        """An adopted batch waited for; a duplicate cancelled first (billed for what it
        finished, which is kept all the same)."""
        if duplicate:
            await self.executor.cancel(pending.batch)
        await self._wait(pending, record, time.monotonic())

    def _watch(self, pending: Pending) -> None:
        """Wait for a batch an earlier invocation left pending, once someone asks for it."""
        if pending.watched:
            return
        pending.watched = True
        self.stats.resumed += 1
        record = BatchRecord(pending.batch, pending.round, len(pending.ids), status="resumed")
        self.stats.batches.append(record)
        self._spawn(self._wait(pending, record, time.monotonic()))

    async def _find(self, upload: Upload) -> str | None:
        """The batch a killed run may have made from ``upload``: looked for in the listing,
        where the batches recorded before its upload are older than it."""
        earlier = frozenset(b for b, at in self.recorded_at.items() if at < upload.since)
        since = upload.since - CLOCK_SLACK
        return await self.executor.find(upload.tag, upload.file_id, since, earlier)

    async def _recover(self, orphan: Upload) -> None:
        path = orphan.folder / orphan.file
        batch_id = await self._find(orphan)
        if batch_id is None:  # never made: made now, from the file already uploaded
            batch_id = await self.executor.create(orphan.file_id, path, orphan.tag)
        self.stats.recovered += 1
        pending = self._record(batch_id, orphan)
        self.recovering.discard(orphan.tag)
        self._adopt_seen()
        self._watch(pending)

    def _record(self, batch_id: str, upload: Upload, adopted: bool = False) -> Pending:
        """The batch recorded as submitted (the ledger first), its lines pending on it (an
        adopted batch takes only the lines no other batch holds)."""
        now = time.time()
        self._append(
            {
                "event": "submitted",
                "batch": batch_id,
                "round": upload.round,
                "executor": self.executor.name,
                "file": upload.file,
                "file_id": upload.file_id,
                "tag": upload.tag,
                "custom_ids": upload.ids,
                "at": now,
            }
            | ({"adopted": True} if adopted else {})
            | self.executor.about(batch_id),
            upload.folder,
        )
        self.known.add(batch_id)
        pending = Pending(
            batch_id,
            upload.ids,
            upload.folder,
            upload.file,
            upload.round,
            upload.file_id,
            upload.tag,
            now,
        )
        self.batches[batch_id] = pending
        for cid in upload.ids:
            held = self.pending.get(cid)
            free = cid not in self.kept and cid not in self.done
            if not adopted or (free and held in (None, upload.tag, "backoff")):
                self.pending[cid] = batch_id
        return pending

    def _enqueue(self, custom_id: str) -> None:
        self.queue[custom_id] = self.bodies[custom_id]
        if self._timer is not None:
            self._timer.cancel()
        if len(self.queue) >= self.max_lines:
            self._flush()
        else:  # a round closes once the items in flight have all asked
            self._timer = asyncio.get_running_loop().call_later(self.settle, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self.queue:
            lines, self.queue = self.queue, {}
            self.stats.rounds += 1
            for cid in lines:  # from now until its batch is known, a line is pending on it
                self.pending[cid] = f"round-{self.stats.rounds}"
            self._spawn(self._round(self.stats.rounds, lines))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        for futures in self.waiting.values():  # the endpoint cannot run batches: stop the run
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        self.waiting.clear()

    # ---- a round ---------------------------------------------------------------------------

    async def _round(self, number: int, lines: dict[str, dict[str, Any]]) -> None:
        refused = {cid: why for cid, body in lines.items() if (why := line_problem(body))}
        for cid, why in refused.items():  # one bad line fails its own item, not its batch
            lines.pop(cid)
            self.pending.pop(cid, None)
            self._fail(cid, f"refused before it was sent: {why}", "rejected")
        parts = split_by_size(lines, self.max_lines, self.max_bytes)
        await asyncio.gather(*(self._submit(number, part) for part in parts))

    async def _submit(self, number: int, lines: dict[str, dict[str, Any]]) -> None:
        """One batch file: written, uploaded and recorded, then its batch created and
        recorded (a cancel waits for the record), then waited for. A file or batch the
        provider refuses for its size is split in two."""
        self._files += 1
        name = f"{number:05d}-{self._files:05d}-{secrets.token_hex(3)}.jsonl"
        path = self.folder / name
        text = "".join(batch_line(cid, body) for cid, body in lines.items())
        write_atomic(path, text, within=self.within)
        tag = f"{self.nonce}/{path.stem}"
        try:
            file_id = await self.executor.upload(path)
            upload = Upload(self.folder, name, file_id, tag, number, [*lines], time.time())
            await self._buy(upload)
        except TooBig as refused:
            self._append({"event": "abandoned", "tag": tag, "why": str(refused), "at": time.time()})
            await self._split(number, list(lines), str(refused))

    async def _buy(self, upload: Upload) -> None:
        """An uploaded file's batch: recorded as uploaded (write-ahead: a kill from here on
        finds the batch by its tag), created, recorded, waited for."""
        self._append(
            {
                "event": "uploaded",
                "file": upload.file,
                "file_id": upload.file_id,
                "tag": upload.tag,
                "round": upload.round,
                "custom_ids": upload.ids,
                "at": time.time(),
            },
            upload.folder,
        )
        self.uploads[upload.tag] = upload

        async def create_and_record() -> Pending:
            self.executor.seen.update(self.known)  # recorded, so made before this create
            batch_id = await self.executor.create(
                upload.file_id, upload.folder / upload.file, upload.tag
            )
            return self._record(batch_id, upload)

        made = asyncio.ensure_future(create_and_record())
        try:
            pending = await asyncio.shield(made)
        except asyncio.CancelledError:  # Ctrl-C: the batch, if made, is recorded first
            with contextlib.suppress(Exception):
                await made
            raise
        self._adopt_seen()
        self.stats.submitted += len(upload.ids)
        pending.watched = True
        record = BatchRecord(pending.batch, upload.round, len(upload.ids))
        self.stats.batches.append(record)
        await self._wait(pending, record, time.monotonic())

    async def _wait(self, pending: Pending, record: BatchRecord, began: float) -> None:
        """Polls until the batch ends (or is cancelled for running past its time), then hands
        its answers out. A batch that cannot be read fails its own lines and is released."""
        try:
            state = await self._until_ended(pending)
        except BatchUnreadable as exc:
            self._unreadable(pending, record, str(exc))
            return
        finally:
            pending.watched = False  # asked again, it is polled again: never left "watched"
        record.waited_s = round(time.monotonic() - began, 3)
        self.stats.waited_s += record.waited_s
        await self._finished(pending, record, state)
        if getattr(self.executor, "lost_creates", 0) > self._scanned:
            await self._look_for_strays()  # a lost create may have been made after all

    async def _until_ended(self, pending: Pending) -> BatchState:
        """The batch's terminal state. Past its ``expires_at`` (or its completion window) and
        ``grace`` it is cancelled; a cancel that does not end it in ``grace`` more is given
        up: every wait ends."""
        folder, batch_id = pending.folder, pending.batch
        cancelled: float | None = None
        while True:
            state = await self.executor.poll(batch_id, folder / pending.file)
            if state.status in TERMINAL:
                break
            now = time.time()
            if cancelled is None and now > self._deadline(state, pending):
                await self.executor.cancel(batch_id)
                cancelled = now
            elif cancelled is not None and now > cancelled + self.grace:
                await self.executor.cancel(batch_id)  # asked again: a local engine is killed
                state = BatchState("cancelled", note="still running after its cancel")
                break
            await asyncio.sleep(self.poll)
        if cancelled is not None:
            late = f"still {'running' if state.status == 'cancelled' else state.status} past "
            window = f"its expires_at (or completion window) and {self.grace:g} s"
            state.note = state.note or f"{late}{window}; cancelled"
            state.lost = state.lost or "stuck"
        return state

    def _deadline(self, state: BatchState, pending: Pending) -> float:
        """When a running batch is given up: its ``expires_at`` or the end of its completion
        window, whichever is first, plus ``grace`` (Azure documents that it never expires a
        batch that runs long)."""
        ends = pending.since + self.window
        if state.expires_at is not None:
            ends = min(ends, state.expires_at)
        return ends + self.grace

    def _unreadable(self, pending: Pending, record: BatchRecord, why: str) -> None:
        """A batch whose answer cannot be read: its waiting lines fail with the words (the
        run goes on); it stays pending in the ledger, polled again when asked again."""
        record.status = "unreadable"
        text = words(f"batch {pending.batch} could not be read: {why}")
        for cid in pending.ids:
            if self.waiting.get(cid):
                self._fail(cid, text, "unreadable")

    async def _finished(
        self, pending: Pending, record: BatchRecord, state: BatchState, forgotten: bool = False
    ) -> None:
        folder, batch_id = pending.folder, pending.batch
        answers, problems = outcome(state, batch_id, pending.ids)
        for cid in [c for c in problems if c in self.done or c in self.kept]:
            del problems[cid]  # a duplicate's line another batch answered: nothing lost
        output = folder / f"{_file_safe(batch_id)}.out.jsonl"
        write_atomic(output, state.output, within=self._within(folder))
        if state.errors:
            errors = output.with_name(f"{_file_safe(batch_id)}.errors.jsonl")
            write_atomic(errors, state.errors, within=self._within(folder))
        _answers_in.cache_clear()
        causes = Counter(problem.cause for problem in problems.values())
        if state.status == "failed" and problems and not answers:
            meaning = self._failure_meaning(state)
            causes = Counter({meaning: len(problems)})
        record.status, record.failed = state.status, len(problems)
        lost = {cid: p.cause for cid, p in problems.items() if p.cause in ONCE}
        self._append(
            {
                "event": "finished",
                "batch": batch_id,
                "status": state.status,
                "output": output.name,
                "failed": {cid: problems[cid].text for cid in sorted(problems)},
                "causes": dict(sorted(causes.items())),
                "counts": state.counts,
                "waited_s": record.waited_s,
                "at": time.time(),
            }
            | ({"note": state.note} if state.note else {})
            | ({"lost": lost} if lost else {})
            | ({"forgotten": True} if forgotten else {}),
            folder,
        )
        self.batches.pop(batch_id, None)
        stop = [p for p in problems.values() if p.cause == "stop"]
        if stop:  # a key, a model or the endpoint is wrong: no round can help
            raise BatchError(f"batch {batch_id}: {stop[0].text}")
        if state.status == "failed" and problems and not answers:
            await self._failed_batch(state, pending)
            return
        for cid in pending.ids:
            if self.pending.get(cid) == batch_id:
                self.pending.pop(cid)
            if cid in answers:
                self._answer(cid, answers[cid], output)
            elif cid in problems and self.pending.get(cid) is None:
                self._retry(cid, problems[cid], problems[cid].cause)

    def _failure_meaning(self, state: BatchState) -> str:
        """A batch failed as a whole: the cause its words give (``PROVIDER_MESSAGES``)."""
        said = state.said or [{"code": "", "message": state.message, "line": None}]
        meanings = {meaning_of(e["message"], e["code"]) for e in said}
        if WAIT in meanings:
            return "queued"
        if SPLIT in meanings or REJECT in meanings or any(e["line"] for e in said):
            return "split"
        return "stop"

    async def _failed_batch(self, state: BatchState, pending: Pending) -> None:
        """A batch the provider failed as a whole, by what its words mean: a limit of the
        account's queue (the same file's batch created again, later), a batch too big, or bad
        lines it names (their items fail, the rest is sent again), anything else (the run
        stops with the provider's words)."""
        why = state.message or "no reason given"
        meaning = self._failure_meaning(state)
        if meaning == "stop":
            raise BatchError(f"batch {pending.batch} failed: {why}")
        ids = [cid for cid in pending.ids if cid in self.bodies]
        for cid in ids:
            if self.pending.get(cid) == pending.batch:
                self.pending.pop(cid)
        if meaning == "queued":
            await self._again(pending, why)
            return
        named = {e["line"] for e in state.said if e["line"] is not None}
        bad = {pending.ids[n - 1] for n in named if 0 < n <= len(pending.ids)}
        for cid in bad:
            self._fail(cid, f"batch {pending.batch} failed at its line: {why}", "rejected")
        rest = [cid for cid in ids if cid not in bad]
        if bad:
            self.stats.causes["split"] += len(rest)
            if rest:
                await self._submit(pending.round, {cid: self.bodies[cid] for cid in rest})
            return
        await self._split(pending.round, ids, why)

    async def _split(self, number: int, ids: list[str], why: str) -> None:
        """Lines refused together for their size: two halves sent again (one line alone
        fails)."""
        ids = [cid for cid in ids if cid in self.bodies]
        if not ids:
            return
        if len(ids) == 1:
            self.pending.pop(ids[0], None)
            self._fail(ids[0], f"batch failed for its size with one line: {why}", "rejected")
            return
        self.stats.causes["split"] += len(ids)
        half = len(ids) // 2
        await asyncio.gather(
            *(
                self._submit(number, {cid: self.bodies[cid] for cid in part})
                for part in (ids[:half], ids[half:])
            )
        )

    async def _again(self, pending: Pending, why: str) -> None:
        """The same file's batch created again once the account's queue has room: after a
        backoff that grows, for at most the batch window since the first refusal (then its
        lines fail naming the batch)."""
        base, _, tries = pending.tag.partition("#")
        attempt = int(tries) + 1 if tries.isdigit() else 1
        first = self._queued_since.setdefault(base, time.monotonic())
        delay = backoff(attempt - 1, max(self.retry_base, 0.01), min(600.0, self.window / 4))
        self.stats.causes["queued"] += len(pending.ids)
        if time.monotonic() + delay - first > self.window:
            for cid in pending.ids:
                self._fail(
                    cid,
                    f"batch {pending.batch} failed: {why}; the provider's queue had no room "
                    f"for {self.window:.0f} s",
                    "given_up",
                )
            return
        for cid in pending.ids:
            self.pending[cid] = "backoff"
        await asyncio.sleep(delay)
        again = f"{base}#{attempt}"
        upload = Upload(
            pending.folder, pending.file, pending.file_id, again, pending.round, pending.ids
        )
        await self._buy(upload)

    def _answer(self, cid: str, body: dict[str, Any], output: Path) -> None:
        self.done.add(cid)
        futures = self.waiting.pop(cid, [])
        if not futures:  # a resumed batch's answer nobody asked for yet
            self.kept[cid] = output
            return
        self.stats.answered += 1
        for future in futures:
            if not future.done():
                future.set_result(body)

    def _retry(self, cid: str, problem: Problem, cause: str) -> None:
        if cause == "rejected":  # the line itself is wrong: its item fails now
            self._fail(cid, problem.text, "rejected")
            return
        if cause in ONCE:
            self.lost[cid] += 1
            if self.lost[cid] > 1:  # bought twice, lost twice: not a third time
                self._fail(cid, f"paid for and lost twice: {problem.text}", "given_up")
                return
        if self.retry_online:  # asked online by whoever waits (a line nobody asked yet
            # goes into a round when it is asked)
            futures = self.waiting.pop(cid, [])
            self.stats.online += bool(futures)
            for future in futures:
                if not future.done():
                    future.set_exception(AskOnline(problem.text))
            return
        self.attempts[cid] = self.attempts.get(cid, 0) + 1
        allowed = self.max_attempts if cause not in ONCE else self.max_attempts + 1
        if self.attempts[cid] < allowed and cid in self.bodies:
            self.stats.requeued += 1
            self.stats.causes[cause] += 1
            self.pending[cid] = "backoff"  # asked meanwhile: still this one line
            delay = backoff(self.attempts[cid] - 1, self.retry_base, 60.0)
            asyncio.get_running_loop().call_later(delay, self._requeue, cid)
            return
        self._fail(cid, f"batch line failed {self.attempts[cid]} times: {problem.text}", "given_up")

    def _requeue(self, cid: str) -> None:
        if self.pending.get(cid) == "backoff":
            self.pending.pop(cid)
            self._enqueue(cid)

    def _fail(self, cid: str, why: str, cause: str) -> None:
        self.stats.failed += 1
        self.stats.causes[cause] += 1
        for future in self.waiting.pop(cid, []):
            if not future.done():
                future.set_exception(LineFailed(why))

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        try:
            with contextlib.suppress(BatchError):  # a lost create's batch: looked for again
                await self._last_look()
        finally:
            for task in list(self.tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.executor.close()


def _submitted(upload: Upload) -> str | None:
    """The batch an upload's ledger records for it since (None: none yet; "": abandoned)."""
    found: str | None = None
    for event in ledger_events(upload.folder / LEDGER):
        if event.get("tag") == upload.tag and event.get("event") == "submitted":
            found = str(event.get("batch"))
        elif event.get("tag") == upload.tag and event.get("event") == "abandoned":
            return ""
    return found


def _upload_of(folder: Path, event: dict[str, Any]) -> Upload:
    return Upload(
        folder,
        event["file"],
        event["file_id"],
        event["tag"],
        event["round"],
        list(event["custom_ids"]),
        float(event.get("at") or time.time()),
    )


def folder_nonce(folder: Path, within: Path | None = None) -> str:
    """The folder's own random name for the tags of its batches (made once, kept): two runs,
    or two folders, never share a tag."""
    path = folder / FOLDER_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads(path.read_text())["nonce"])
    nonce = f"gc-{secrets.token_hex(8)}"
    mine = folder / f".{FOLDER_FILE}.{secrets.token_hex(6)}"
    write_atomic(mine, json.dumps({"nonce": nonce}), within=within or folder)
    with contextlib.suppress(FileExistsError):
        os.link(mine, path)  # the first writer wins: two drivers agree on one nonce
    mine.unlink(missing_ok=True)
    return str(json.loads(path.read_text())["nonce"])


def append_event(ledger: Path, event: dict[str, Any], within: Path | None = None) -> None:
    """One event appended to a ledger. A ledger is the one file here not replaced whole: the
    drivers of a run append to one another's (a pending batch is recorded by whoever waited
    for it), and a replace would drop a line another driver appended meanwhile. One write on an
    ``O_APPEND`` descriptor, never through a link, synced: two drivers never interleave a line,
    and a kill leaves at most a torn last line, never acted on (``ledger_events``)."""
    line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = open_unlinked(ledger, flags, within=within or ledger.parent)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def batch_line(cid: str, body: dict[str, Any]) -> str:
    line = {"custom_id": cid, "method": "POST", "url": CHAT_URL, "body": body}
    return json.dumps(line, ensure_ascii=False) + "\n"


def line_problem(body: Any) -> str | None:
    """Why a request cannot be a batch line (None: it can): checked before the file is
    written, so a bad one fails its own item, never the batch it would have been in."""
    if not isinstance(body, dict):
        return "the request is not a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "no model"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no messages"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "a message without a role"
    if body.get("stream"):
        return "a streamed request cannot be batched"
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"not JSON: {exc}"
    return None


def split_by_size(
    lines: dict[str, dict[str, Any]], max_lines: int, max_bytes: int
) -> list[dict[str, dict[str, Any]]]:
    """``lines`` in files of at most ``max_lines`` lines and ``max_bytes`` bytes each."""
    parts: list[dict[str, dict[str, Any]]] = [{}]
    size = 0
    for cid, body in lines.items():
        length = len(batch_line(cid, body).encode("utf-8"))
        if parts[-1] and (len(parts[-1]) >= max_lines or size + length > max_bytes):
            parts.append({})
            size = 0
        parts[-1][cid] = body
        size += length
    return [part for part in parts if part]


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


# ---- the ledgers, read back (report, page, `groundcover batch`) -----------------------------


def ledger_events(ledger: Path) -> list[dict[str, Any]]:
    """A ledger's events in order; a torn last line (a kill mid-append) is never acted on."""
    events = []
    for line in ledger.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def read_ledgers(run_dir: Path) -> dict[str, Any] | None:
    """Every batch a run bought, from its ledgers (all invocations; None: none): per client
    folder, each batch's round, lines, status, failed lines, wait and note, and the totals with
    the unanswered lines by cause (``report``, the HTML page and ``groundcover batch status``
    show them)."""
    folders = sorted((run_dir / "batches").glob(f"*/{LEDGER}"))
    if not folders:
        return None
    clients: dict[str, list[dict[str, Any]]] = {}
    causes: Counter[str] = Counter()
    unfound = 0  # creates whose answer was lost and whose batch the run's listings never showed
    for ledger in folders:
        batches: dict[str, dict[str, Any]] = {}
        for event in ledger_events(ledger):
            batch = str(event.get("batch"))
            if event.get("event") == "submitted":
                batches[batch] = {
                    "batch": batch,
                    "round": event["round"],
                    "executor": event.get("executor"),
                    "lines": len(event["custom_ids"]),
                    "status": "pending",
                    "failed": 0,
                    "waited_s": None,
                    "note": "adopted: made by the provider, found in its listing"
                    if event.get("adopted")
                    else "",
                }
            elif event.get("event") == "finished" and event.get("forgotten") and batch in batches:
                batches[batch] |= {  # forgotten, then ended at the provider: its answers kept
                    "failed": len(event.get("failed") or {}),
                    "note": f"forgotten; {event['status']} at the provider, its answers kept",
                }
            elif event.get("event") == "forgotten_ended" and batch in batches:
                if event.get("cancelled"):
                    batches[batch]["note"] += "; cancelled at the provider"
            elif event.get("event") == "unfound":
                unfound += int(event.get("creates") or 1)
            elif event.get("event") == "finished" and batch in batches:
                if batches[batch]["status"] == "pending":  # two drivers may record it
                    causes.update(event.get("causes") or {})
                batches[batch] |= {
                    "status": event["status"],
                    "failed": len(event.get("failed") or {}),
                    "waited_s": event.get("waited_s"),
                    "note": event.get("note") or batches[batch]["note"],
                }
            elif event.get("event") == "forgotten" and batch in batches:
                how = "forgotten, its lines bought again" if event.get("rebuy") else "forgotten"
                batches[batch] |= {"status": "forgotten", "note": how}
        clients[ledger.parent.name] = list(batches.values())
    every = [b for batches in clients.values() for b in batches]
    return {
        "batches": len(every),
        "rounds": sum(len({b["round"] for b in batches}) for batches in clients.values()),
        "lines": sum(b["lines"] for b in every),
        "failed_lines": sum(b["failed"] for b in every),
        "causes": dict(sorted(causes.items())),
        "pending": sum(b["status"] == "pending" for b in every),
        "unfound": unfound,
        "waited_s": round(sum(b["waited_s"] or 0 for b in every), 3),
        "clients": clients,
    }


def forget_batch(run_dir: Path, batch_id: str, rebuy: bool = False) -> Path:
    """The way out of a batch that cannot end (stuck, its output gone, a provider that lost
    it): the ledger no longer waits for it, and its unanswered lines are bought on the next run;
    with ``rebuy`` its answers are set aside too and every line of it is bought again (also a
    line lost twice). The ledger that recorded it; one line when no ledger of ``run_dir``
    knows it."""
    for ledger in sorted((run_dir / "batches").glob(f"*/{LEDGER}")):
        events = ledger_events(ledger)
        if any(e.get("event") == "submitted" and e.get("batch") == batch_id for e in events):
            event = {"event": "forgotten", "batch": batch_id, "rebuy": rebuy, "at": time.time()}
            append_event(ledger, event, run_dir)
            return ledger
    raise BatchError(f"{run_dir}: no batch {batch_id!r} in its ledgers (groundcover batch status)")
