"""Judge calls bought as batch jobs instead of one request at a time.

A framework asks item by item, stage after stage, so the calls of a run do not exist up front:
``Batcher`` collects the requests of every item in flight until none has arrived for
``settle`` seconds (every item then waits on the model) or ``max_lines`` are queued, writes them
as one file in the OpenAI Batch API's JSONL (``custom_id`` = the request's content-addressed cache
key), submits it, and hands each answer to the request that waits on it; the items go on to
their next stage, whose requests make the next round.

Two executors run a batch file: ``OpenAIBatches`` (an OpenAI-compatible ``/files`` +
``/batches`` endpoint: a hosted provider at its batch price) and ``LocalRunBatch`` (``vllm
run-batch`` for a model served here, at the engine's own pace, with no server).

Bought once, whatever happens:

- **Write-ahead.** A round's file is uploaded and its file id, its custom ids and a tag (sent
  as the batch's ``metadata``) recorded in the folder's ``ledger.jsonl`` *before* the batch is
  created; the batch id is recorded as soon as it is known. A create whose answer is lost (a
  timeout, a reset, a 5xx, a kill) is looked for by its tag among the provider's batches before
  it is ever asked again, and a resume that holds an upload without a batch does the same: the
  batch the provider made is adopted, the file reused.
- **Blips are waited out.** Every call (upload, create, poll, list, download) is retried on
  5xx, 429 (``Retry-After`` honoured), resets and timeouts with capped exponential backoff and
  jitter, for as long as ``patience`` (bounded by the batch window); downloads stream to the
  folder with a read timeout and no total one. A fault that outlasts the patience stops the run
  in one line; the same command resumes.
- **Failures by cause.** A line answered 400 / 413 / 422 (or refused before it is written)
  fails its item at once; 401 / 403 / 404 stop the run; a 5xx or 429 line and the lines of an
  ``expired`` or ``cancelled`` batch go into a later round after a backoff (``max_attempts``
  in all); a batch ``failed`` for its size or a token limit is split in two and sent again;
  any other failed batch stops the run with the provider's words. Each cause is counted
  (``causes``), in the ledger, ``summary.json``, ``report`` and the page.
- **Any drivers.** A pending batch of any folder of the client (an earlier invocation's
  drivers, more or fewer) is waited for by whoever asks one of its lines, so exactly the
  driver whose shard holds the item waits; an upload left without a batch is recovered by the
  folder's owner, or by one adopter of a gone driver's folder. Batch ids are unique per folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import random
import re
import secrets
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from .redact import redact, remember

CHAT_URL = "/v1/chat/completions"  # the one endpoint a batch line names (the Batch API's)
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling", "queued", "pending"})
RETRY_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx: the provider, not the request
STOP_STATUS = frozenset({401, 403, 404})  # a key, a model or an endpoint is wrong
REJECT_STATUS = frozenset({400, 413, 422})  # the line itself is wrong: asking again cannot help
MAX_BYTES = 200_000_000  # OpenAI's limit per batch file
TAG_FIELD = "groundcover"  # the metadata key a batch's tag goes in
# a batch failed for what it holds, not for what it asks: split it and send the halves
TOO_BIG = re.compile(
    r"(?i)token.?limit|too (large|big|many)|exceed|max(imum)?.?(size|lines|requests|tokens)"
)
FOLDER_FILE = "folder.json"  # a folder's own nonce: the tags of its batches


class BatchError(RuntimeError):
    """The batch endpoint (or ``vllm run-batch``) cannot take or run batches: the run stops."""


class AskOnline(RuntimeError):
    """A failed batch line to be asked again online (``retry_online``), not in a round."""


class LineFailed(RuntimeError):
    """A request whose line failed in ``max_attempts`` batches, or was refused: its item
    fails."""


@dataclass
class BatchState:
    """Where a submitted batch stands; at a terminal status, its output and error lines."""

    status: str
    output: str = ""  # JSONL: {"custom_id", "response": {"status_code", "body"}, "error"}
    errors: str = ""  # JSONL of the lines the provider failed
    message: str = ""  # why a batch failed as a whole


class Executor(Protocol):
    """Runs batch files: uploads one (a file id back), creates its batch (the batch id back),
    finds a batch it made by its tag or file, says where a batch stands."""

    name: str

    async def upload(self, path: Path) -> str: ...

    async def create(self, file_id: str, path: Path, tag: str) -> str: ...

    async def find(self, tag: str, file_id: str) -> str | None: ...

    async def poll(self, batch_id: str, path: Path) -> BatchState: ...

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
    """A call that failed for a reason that passes (5xx, 429, a reset, a timeout)."""

    def __init__(self, why: str, wait: float | None = None):
        super().__init__(why)
        self.wait = wait


# ---- executors ------------------------------------------------------------------------------


class OpenAIBatches:
    """An OpenAI-compatible Batch API: upload the file (``purpose=batch``), create the batch
    (with its tag in ``metadata``), poll it, download its output and error files, list the
    batches to find one whose create answer was lost.

    Answers in another shape are read where they are unambiguous (a batch wrapped in one key,
    ``{"job": {...}}`` or ``{"batch": {...}}``; statuses in capitals); anything else stops the
    run in one line naming what is missing, never an endless poll."""

    name = "openai-batch"

    def __init__(
        self,
        base_url: str,
        api_key: str,
        window: str = "24h",
        timeout: float = 300.0,
        patience: float | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        remember(api_key)
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.window = window
        # a connection or a read that stalls for ``timeout`` is a blip; a long download is not
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self.patience = min(patience or 3600.0, window_seconds(window))
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
        """One call: its JSON object (or, ``to_file``, the body streamed there); a blip or a
        ``BatchError`` saying why not."""
        url = f"{self.base_url}{path}"
        try:
            async with self.session.request(method, url, **kw) as response:
                if response.status >= 400:
                    text = redact((await response.text(errors="replace"))[:300])
                    why = f"{method} {url}: {response.status} {' '.join(text.split())}"
                    if response.status in RETRY_STATUS or response.status >= 500:
                        raise Blip(why, _retry_after(response.headers.get("Retry-After")))
                    raise BatchError(why)
                if to_file is not None:
                    part = to_file.with_name(f"{to_file.name}.{os.getpid()}.part")
                    with part.open("wb") as handle:
                        async for chunk in response.content.iter_chunked(1 << 20):
                            handle.write(chunk)
                    part.replace(to_file)  # whole or not at all
                    return {}
                text = await response.text()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Blip(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        except asyncio.TimeoutError as exc:
            raise Blip(f"{method} {url}: no answer in time") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise Blip(f"{method} {url}: the answer is not JSON ({len(text)} bytes)") from None
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

    async def create(self, file_id: str, path: Path, tag: str) -> str:
        """The batch of ``file_id``, made once: a create whose answer was lost is looked for by
        its tag before it is asked again."""
        body = {
            "input_file_id": file_id,
            "endpoint": CHAT_URL,
            "completion_window": self.window,
            "metadata": {TAG_FIELD: tag},
        }

        async def attempt() -> dict[str, Any]:
            try:
                return await self._once("POST", "/batches", json=body)
            except Blip:
                found = await self.find(tag, file_id)  # made, its answer lost?
                if found is not None:
                    return {"id": found}
                raise

        created = await self._patiently("POST /batches", attempt)
        return str(unwrap(created, "POST /batches")["id"])

    async def find(self, tag: str, file_id: str) -> str | None:
        """The id of the batch with ``tag`` (or made from ``file_id``), newest first; None
        when the provider has none (pages of 100, at most 100 pages)."""
        after: str | None = None
        for _ in range(100):
            query = "?limit=100" + (f"&after={after}" if after else "")
            page = await self._call("GET", f"/batches{query}")
            batches = page.get("data")
            if not isinstance(batches, list):
                raise BatchError("GET /batches: the answer has no list of batches (field data)")
            for batch in batches:
                if not isinstance(batch, dict):
                    continue
                metadata = batch.get("metadata") or {}
                mine = isinstance(metadata, dict) and metadata.get(TAG_FIELD) == tag
                if mine or batch.get("input_file_id") == file_id:
                    return str(batch.get("id"))
            if not page.get("has_more") or not batches:
                return None
            after = str(page.get("last_id") or batches[-1].get("id"))
        return None

    async def poll(self, batch_id: str, path: Path) -> BatchState:
        batch = unwrap(await self._call("GET", f"/batches/{batch_id}"), f"GET /batches/{batch_id}")
        status = str(batch.get("status", "")).lower()
        if status not in TERMINAL:
            if status not in RUNNING:
                raise BatchError(
                    f"GET /batches/{batch_id}: status {batch.get('status')!r} is none of the "
                    f"Batch API's ({', '.join(sorted(RUNNING | TERMINAL))})"
                )
            return BatchState(status)
        errors = (batch.get("errors") or {}).get("data") or []
        return BatchState(
            status,
            output=await self._download(batch.get("output_file_id"), path, "out"),
            errors=await self._download(batch.get("error_file_id"), path, "errors"),
            message="; ".join(
                str(e.get("message", e)) if isinstance(e, dict) else str(e) for e in errors
            ),
        )

    async def _download(self, file_id: Any, path: Path, kind: str) -> str:
        if not file_id:
            return ""
        to = path.with_name(f"{path.stem}.{kind}.download")
        await self._call("GET", f"/files/{file_id}/content", to_file=to)
        text = to.read_text(encoding="utf-8")
        to.unlink(missing_ok=True)
        return text

    def about(self, batch_id: str) -> dict[str, Any]:
        return {}

    def found_pending(self, event: dict[str, Any]) -> None:
        pass

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def unwrap(data: dict[str, Any], what: str) -> dict[str, Any]:
    """A batch or file object, also when a provider wraps it in one key (``{"job": {...}}``);
    one line naming the field when it has no id."""
    if "id" not in data and len(data) == 1:
        (inner,) = data.values()
        if isinstance(inner, dict):
            data = inner
    if not isinstance(data.get("id"), str) or not data["id"]:
        raise BatchError(f"{what}: the answer has no field id (it has: {', '.join(sorted(data))})")
    return data


def _retry_after(value: str | None) -> float | None:
    from .transport import retry_after

    return retry_after(value)


# ---- the local engine -----------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
# one local engine at a time per device in a process: (device, event loop) -> its lock
_ENGINES: dict[tuple[str, int], asyncio.Lock] = {}


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGKILL when the run that started it dies
    (a kill -9 of the run leaves no engine running under PID 1)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def process_start(pid: int) -> str | None:
    """A process's start time (``/proc/PID/stat`` field 22): a pid with another start is
    another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class LocalRunBatch:
    """``vllm run-batch`` on a model served here: one process per batch, the model loaded by
    it (no server), the output file written beside the input. The process dies with the run
    (a parent-death signal); one still running from a killed run (its pid and start time are in
    the ledger) is ended by the resume, whose batch then runs again: nothing was bought. One
    engine runs at a time per device."""

    name = "vllm-run-batch"

    def __init__(
        self, command: Callable[[Path, Path], list[str]], env: dict[str, str], device: str = ""
    ):
        self.command = command  # (input, output) -> argv
        self.env = env
        self.device = device
        self.running: dict[str, subprocess.Popen] = {}

    @property
    def engine(self) -> asyncio.Lock:
        return _ENGINES.setdefault((self.device, id(asyncio.get_running_loop())), asyncio.Lock())

    async def upload(self, path: Path) -> str:
        return path.name  # the file is read where it lies

    async def find(self, tag: str, file_id: str) -> str | None:
        return None  # an engine is never left running a batch nobody records: run it again

    async def create(self, file_id: str, path: Path, tag: str) -> str:
        await self.engine.acquire()  # released when the process ends (``poll``)
        out = _output_of(path)
        out.unlink(missing_ok=True)
        try:
            with path.with_suffix(".log").open("wb") as log:
                process = subprocess.Popen(
                    self.command(path, out),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,  # its own group: ended whole
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, before exec
                )
        except BaseException:
            self.engine.release()
            raise
        batch_id = f"local-{path.parent.name}-{path.stem}"  # unique across driver folders
        self.running[batch_id] = process
        return batch_id

    def about(self, batch_id: str) -> dict[str, Any]:
        process = self.running.get(batch_id)
        if process is None:
            return {}
        return {"pid": process.pid, "pid_start": process_start(process.pid)}

    def found_pending(self, event: dict[str, Any]) -> None:
        """A batch a killed run left pending: its engine, if it outlived the run, is ended."""
        pid, start = event.get("pid"), event.get("pid_start")
        if isinstance(pid, int) and start is not None and process_start(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    async def poll(self, batch_id: str, path: Path) -> BatchState:
        process = self.running.get(batch_id)
        if process is not None and process.poll() is None:
            return BatchState("in_progress")
        out = _output_of(path)
        if process is None:  # from before a kill: the process went with the run
            if out.is_file():
                return BatchState("completed", output=out.read_text(encoding="utf-8"))
            return BatchState("expired", message="vllm run-batch ended with the run before it")
        self.running.pop(batch_id)
        self.engine.release()
        if process.returncode == 0 and out.is_file():
            return BatchState("completed", output=out.read_text(encoding="utf-8"))
        tail = path.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-3:]
        return BatchState(
            "failed", message=f"vllm run-batch exited {process.returncode}: {' | '.join(tail)}"
        )

    async def close(self) -> None:
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.engine.release()
        self.running.clear()


def _output_of(path: Path) -> Path:
    return path.with_name(f"{path.stem}.out.jsonl")


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
    "split": "a batch failed for its size or a token limit: split and sent again",
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
            "waited_s": round(self.waited_s, 3),
            "causes": dict(sorted(self.causes.items())),
            "batches": [vars(b) for b in self.batches],
        }


@dataclass
class Pending:
    """A submitted batch not yet finished: its lines and where its ledger and file are."""

    batch: str
    ids: list[str]
    folder: Path
    file: str
    round: int
    watched: bool = False


@dataclass
class Orphan:
    """An upload recorded without its batch (a kill between the two): found or made once."""

    folder: Path
    file: str
    file_id: str
    tag: str
    round: int
    ids: list[str]


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
    ):
        """``adopt``: folders of batchers gone from this invocation (drivers of an earlier
        run with more of them) whose uploads left without a batch this one recovers;
        ``siblings``: the client's other folders. Every folder's finished outputs answer here
        and its pending batches are waited for by whoever asks one of their lines: nothing
        any of them bought is bought again."""
        self.executor = executor
        self.folder = folder
        self.ledger = folder / "ledger.jsonl"
        self.settle, self.max_lines, self.max_bytes, self.poll = settle, max_lines, max_bytes, poll
        self.max_attempts = max_attempts
        self.retry_online = retry_online  # a failed line is asked again online, at once
        self.retry_base = retry_base  # the first backoff before a failed line's next round
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
        self.orphans: list[Orphan] = []
        self.tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._opened = False
        self._files = 0  # batch files written this invocation (their names)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.nonce = folder_nonce(folder)
        rounds = [self._read_ledger(where, recover=False) for where in siblings]
        rounds += [self._read_ledger(where, recover=True) for where in adopt]
        self.stats.rounds = max([self._read_ledger(self.folder, recover=True), *rounds])

    # ---- the ledger: what was bought, and what came of it ----------------------------------

    def _read_ledger(self, folder: Path, recover: bool) -> int:
        """What ``folder``'s ledger bought: finished outputs answer, pending batches are
        waited for when asked; with ``recover``, uploads without a batch are this batcher's
        to find or create. Its last round."""
        ledger = folder / "ledger.jsonl"
        if not ledger.is_file():
            return 0
        uploaded: dict[str, dict[str, Any]] = {}  # tag -> event
        submitted: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for event in ledger_events(ledger):
            kind = event.get("event")
            if kind == "uploaded":
                uploaded[event["tag"]] = event
            elif kind == "submitted":
                submitted[event["batch"]] = event
                uploaded.pop(event.get("tag", ""), None)
            elif kind == "finished":
                finished.add(event["batch"])
                self._keep(folder / event["output"])
        for batch_id, event in submitted.items():
            if batch_id in finished:
                continue
            if recover:  # a live sibling's engine is its own: never ended from here
                self.executor.found_pending(event)
            ids = list(event["custom_ids"])
            self.batches[batch_id] = Pending(batch_id, ids, folder, event["file"], event["round"])
            self._bodies(folder / event["file"])
            for cid in ids:
                self.pending.setdefault(cid, batch_id)
        if recover:
            for tag, event in uploaded.items():
                ids = list(event["custom_ids"])
                orphan = Orphan(folder, event["file"], event["file_id"], tag, event["round"], ids)
                self.orphans.append(orphan)
                self._bodies(folder / event["file"])
                for cid in ids:
                    self.pending.setdefault(cid, tag)
        rounds = [e["round"] for e in (*submitted.values(), *uploaded.values())]
        return max(rounds, default=0)

    def _bodies(self, path: Path) -> None:
        for cid, body in _read_lines(path).items():
            self.bodies.setdefault(cid, body)

    def _append(self, event: dict[str, Any], folder: Path | None = None) -> None:
        ledger = (folder or self.folder) / "ledger.jsonl"
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:  # one write on an O_APPEND descriptor: two drivers never interleave a line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

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
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(custom_id, []).append(future)
        self.bodies.setdefault(custom_id, body)
        where = self.pending.get(custom_id)
        if where is None and custom_id not in self.queue:
            self._enqueue(custom_id)
        elif where in self.batches:
            self._watch(self.batches[where])
        return await future

    def _open(self) -> None:
        """Once, in the running loop: the uploads a killed run left without a batch."""
        if self._opened:
            return
        self._opened = True
        for orphan in self.orphans:
            self._spawn(self._recover(orphan))

    def _watch(self, pending: Pending) -> None:
        """Wait for a batch an earlier invocation left pending, once someone asks for it."""
        if pending.watched:
            return
        pending.watched = True
        self.stats.resumed += 1
        record = BatchRecord(pending.batch, pending.round, len(pending.ids), status="resumed")
        self.stats.batches.append(record)
        self._spawn(self._wait(pending, record, time.monotonic()))

    async def _recover(self, orphan: Orphan) -> None:
        path = orphan.folder / orphan.file
        batch_id = await self.executor.find(orphan.tag, orphan.file_id)
        if batch_id is None:  # never made: made now, from the file already uploaded
            batch_id = await self.executor.create(orphan.file_id, path, orphan.tag)
        self.stats.recovered += 1
        pending = self._record(batch_id, orphan.folder, orphan.file, orphan.file_id, orphan)
        self._watch(pending)

    def _record(
        self, batch_id: str, folder: Path, file: str, file_id: str, upload: Orphan
    ) -> Pending:
        """The batch recorded as submitted (the ledger first), its lines pending on it."""
        self._append(
            {
                "event": "submitted",
                "batch": batch_id,
                "round": upload.round,
                "executor": self.executor.name,
                "file": file,
                "file_id": file_id,
                "tag": upload.tag,
                "custom_ids": upload.ids,
                "at": time.time(),
            }
            | self.executor.about(batch_id),
            folder,
        )
        pending = Pending(batch_id, upload.ids, folder, file, upload.round)
        self.batches[batch_id] = pending
        for cid in upload.ids:
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
        recorded (a cancel waits for the record), then waited for."""
        self._files += 1
        name = f"{number:05d}-{self._files:05d}-{secrets.token_hex(3)}.jsonl"
        path = self.folder / name
        path.write_text("".join(batch_line(cid, body) for cid, body in lines.items()), "utf-8")
        file_id = await self.executor.upload(path)
        upload = Orphan(self.folder, name, file_id, f"{self.nonce}/{path.stem}", number, [*lines])
        self._append(  # write-ahead: a kill from here on finds the batch by its tag
            {
                "event": "uploaded",
                "file": name,
                "file_id": file_id,
                "tag": upload.tag,
                "round": number,
                "custom_ids": upload.ids,
                "at": time.time(),
            }
        )

        async def create_and_record() -> Pending:
            batch_id = await self.executor.create(file_id, path, upload.tag)
            return self._record(batch_id, self.folder, name, file_id, upload)

        made = asyncio.ensure_future(create_and_record())
        try:
            pending = await asyncio.shield(made)
        except asyncio.CancelledError:  # Ctrl-C: the batch, if made, is recorded first
            with contextlib.suppress(Exception):
                await made
            raise
        self.stats.submitted += len(lines)
        pending.watched = True
        record = BatchRecord(pending.batch, number, len(lines))
        self.stats.batches.append(record)
        await self._wait(pending, record, time.monotonic())

    async def _wait(self, pending: Pending, record: BatchRecord, began: float) -> None:
        folder, batch_id = pending.folder, pending.batch
        while True:
            state = await self.executor.poll(batch_id, folder / pending.file)
            if state.status in TERMINAL:
                break
            await asyncio.sleep(self.poll)
        record.waited_s = round(time.monotonic() - began, 3)
        self.stats.waited_s += record.waited_s
        answers, problems = _outcome(state, pending.ids)
        output = folder / f"{_file_safe(batch_id)}.out.jsonl"
        _write_whole(output, state.output)
        if state.errors:
            _write_whole(output.with_name(f"{_file_safe(batch_id)}.errors.jsonl"), state.errors)
        causes = Counter(cause_of(state, problem) for problem in problems.values())
        record.status, record.failed = state.status, len(problems)
        self._append(
            {
                "event": "finished",
                "batch": batch_id,
                "status": state.status,
                "output": output.name,
                "failed": {cid: problems[cid].text for cid in sorted(problems)},
                "causes": dict(sorted(causes.items())),
                "waited_s": record.waited_s,
                "at": time.time(),
            },
            folder,
        )
        self.batches.pop(batch_id, None)
        stop = [p for p in problems.values() if cause_of(state, p) == "stop"]
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
            elif cid in problems:
                self._retry(cid, problems[cid], cause_of(state, problems[cid]))

    async def _failed_batch(self, state: BatchState, pending: Pending) -> None:
        """A batch the provider failed as a whole: too big (split in two and sent again) or
        refused for another reason (the run stops with the provider's words)."""
        why = state.message or "no reason given"
        if not TOO_BIG.search(why):
            raise BatchError(f"batch {pending.batch} failed: {why}")
        ids = [cid for cid in pending.ids if cid in self.bodies]
        for cid in ids:
            self.pending.pop(cid, None)
        if len(ids) == 1:
            self._fail(ids[0], f"batch failed for its size with one line: {why}", "rejected")
            return
        self.stats.causes["split"] += len(ids)
        half = len(ids) // 2
        await asyncio.gather(
            *(
                self._submit(pending.round, {cid: self.bodies[cid] for cid in part})
                for part in (ids[:half], ids[half:])
            )
        )

    def _answer(self, cid: str, body: dict[str, Any], output: Path) -> None:
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
        if self.retry_online:  # asked online by whoever waits (a line nobody asked yet
            # goes into a round when it is asked)
            futures = self.waiting.pop(cid, [])
            self.stats.online += bool(futures)
            for future in futures:
                if not future.done():
                    future.set_exception(AskOnline(problem.text))
            return
        self.attempts[cid] = self.attempts.get(cid, 0) + 1
        if self.attempts[cid] < self.max_attempts and cid in self.bodies:
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
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.executor.close()


def folder_nonce(folder: Path) -> str:
    """The folder's own random name for the tags of its batches (made once, kept): two runs,
    or two folders, never share a tag."""
    path = folder / FOLDER_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads(path.read_text())["nonce"])
    nonce = f"gc-{secrets.token_hex(8)}"
    tmp = path.with_name(f"{FOLDER_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"nonce": nonce}))
    with contextlib.suppress(FileExistsError):
        os.link(tmp, path)  # the first writer wins: two drivers agree on one nonce
    tmp.unlink(missing_ok=True)
    return str(json.loads(path.read_text())["nonce"])


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


@dataclass(frozen=True)
class Problem:
    """Why a line has no answer: its HTTP status (None: missing from its batch), the words."""

    status: int | None
    text: str


def cause_of(state: BatchState, problem: Problem) -> str:
    """A line's cause (``CAUSES``, or ``stop``: the run cannot go on)."""
    if problem.status is None:
        return "expired" if state.status in ("expired", "cancelled") else "retried"
    if problem.status in STOP_STATUS:
        return "stop"
    if problem.status in REJECT_STATUS:
        return "rejected"
    return "retried"


def error_text(error: Any) -> str:
    """A line's error as words: OpenAI's ``{"message"}``, vLLM's ``{"error": {"message"}}``
    or a string (never a dict's repr)."""
    if isinstance(error, dict):
        inner = error.get("error")
        if isinstance(inner, dict | str):
            return error_text(inner)
        if error.get("message"):
            return str(error["message"])
        return json.dumps(error, ensure_ascii=False, default=str)
    return "" if error is None else str(error)


def _outcome(state: BatchState, ids: list[str]) -> tuple[dict[str, Any], dict[str, Problem]]:
    """Each id's answer body, or why it has none (an error line, a line missing from an
    expired or failed batch)."""
    answers: dict[str, Any] = {}
    problems: dict[str, Problem] = {}
    for text in (state.output, state.errors):
        for line in text.splitlines():
            try:
                row = json.loads(line)
                cid = row["custom_id"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            response = row.get("response") or {}
            code = response.get("status_code")
            if code == 200 and not row.get("error") and isinstance(response.get("body"), dict):
                answers[cid] = response["body"]
                problems.pop(cid, None)
            elif cid not in answers:
                body = response.get("body") if isinstance(response.get("body"), dict) else {}
                words = error_text(row.get("error") or (body or {}).get("error")) or "failed"
                status = code if isinstance(code, int) else None
                if status is None and row.get("error"):
                    status = 500  # an error line without a status: the provider's
                problems[cid] = Problem(status, redact(f"{code or 'error'}: {words}"))
    for cid in ids:
        if cid not in answers and cid not in problems:
            why = f"batch {state.status}" + (f": {state.message}" if state.message else "")
            problems[cid] = Problem(None, redact(why))
    return answers, problems


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


@functools.lru_cache(maxsize=4)
def _answers_in(output: Path) -> dict[str, Any]:
    """The answer bodies of a kept output file, by custom id (the last few files read stay
    parsed: a resumed run asks for a batch's answers one after another)."""
    if not output.is_file():
        return {}
    answers, _ = _outcome(BatchState("completed", output=output.read_text(encoding="utf-8")), [])
    return answers


def _read_lines(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    lines = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError):
            row = json.loads(line)
            lines[row["custom_id"]] = row["body"]
    return lines


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]


def ledger_events(ledger: Path) -> list[dict[str, Any]]:
    """A ledger's events in order; a torn last line (a kill mid-append) is never acted on."""
    events = []
    for line in ledger.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)
    return events


def read_ledgers(run_dir: Path) -> dict[str, Any] | None:
    """Every batch a run bought, from its ledgers (all invocations; None: none): per client
    folder, each batch's round, lines, status, failed lines and wait, and the totals with the
    unanswered lines by cause (``report`` and the HTML page show them)."""
    folders = sorted((run_dir / "batches").glob("*/ledger.jsonl"))
    if not folders:
        return None
    clients: dict[str, list[dict[str, Any]]] = {}
    causes: Counter[str] = Counter()
    for ledger in folders:
        batches: dict[str, dict[str, Any]] = {}
        for event in ledger_events(ledger):
            if event.get("event") == "submitted":
                batches[event["batch"]] = {
                    "batch": event["batch"],
                    "round": event["round"],
                    "executor": event.get("executor"),
                    "lines": len(event["custom_ids"]),
                    "status": "pending",
                    "failed": 0,
                    "waited_s": None,
                }
            elif event.get("event") == "finished" and event["batch"] in batches:
                if batches[event["batch"]]["status"] == "pending":  # two drivers may record it
                    causes.update(event.get("causes") or {})
                batches[event["batch"]] |= {
                    "status": event["status"],
                    "failed": len(event.get("failed") or {}),
                    "waited_s": event.get("waited_s"),
                }
        clients[ledger.parent.name] = list(batches.values())
    every = [b for batches in clients.values() for b in batches]
    return {
        "batches": len(every),
        "rounds": sum(len({b["round"] for b in batches}) for batches in clients.values()),
        "lines": sum(b["lines"] for b in every),
        "failed_lines": sum(b["failed"] for b in every),
        "causes": dict(sorted(causes.items())),
        "pending": sum(b["status"] == "pending" for b in every),
        "waited_s": round(sum(b["waited_s"] or 0 for b in every), 3),
        "clients": clients,
    }
