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

Nothing is bought twice. Each batch is written in the run's ``batches/`` folder and recorded in
its ``ledger.jsonl`` (id and custom ids) before anything waits on it; its output is kept there
when it ends. A killed run reads the ledger back: answers of finished batches come from their
kept outputs, pending batches are polled again, and only requests in neither are submitted.
Lines that fail (an error line, an expired or failed batch) go into the next round, counted,
and after ``max_attempts`` fail their item."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from .redact import remember

CHAT_URL = "/v1/chat/completions"  # the one endpoint a batch line names (the Batch API's)
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchError(RuntimeError):
    """The batch endpoint (or ``vllm run-batch``) cannot take or run batches: the run stops."""


class AskOnline(RuntimeError):
    """A failed batch line to be asked again online (``retry_online``), not in a round."""


class LineFailed(RuntimeError):
    """A request whose line failed in ``max_attempts`` batches: its item fails."""


@dataclass
class BatchState:
    """Where a submitted batch stands; at a terminal status, its output and error lines."""

    status: str
    output: str = ""  # JSONL: {"custom_id", "response": {"status_code", "body"}, "error"}
    errors: str = ""  # JSONL of the lines the provider failed
    message: str = ""  # why a batch failed as a whole


class Executor(Protocol):
    """Runs batch files: submits one (its id back), says where it stands."""

    name: str

    async def submit(self, path: Path) -> str: ...

    async def poll(self, batch_id: str, path: Path) -> BatchState: ...

    async def close(self) -> None: ...


# ---- executors ------------------------------------------------------------------------------


class OpenAIBatches:
    """An OpenAI-compatible Batch API: upload the file (``purpose=batch``), create the batch,
    poll it, download its output and error files."""

    name = "openai-batch"

    def __init__(self, base_url: str, api_key: str, window: str = "24h", timeout: float = 300.0):
        self.base_url = base_url.rstrip("/")
        remember(api_key)
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.window = window
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        return self._session

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        try:
            async with self.session.request(method, url, **kw) as response:
                text = await response.text()
                if response.status >= 400:
                    raise BatchError(f"{method} {url}: {response.status} {text[:200]}")
                return dict(json.loads(text))
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
            raise BatchError(f"{method} {url}: {exc or type(exc).__name__}") from exc

    async def _text(self, file_id: str | None) -> str:
        if not file_id:
            return ""
        url = f"{self.base_url}/files/{file_id}/content"
        try:
            async with self.session.get(url) as response:
                if response.status >= 400:
                    raise BatchError(f"GET {url}: {response.status}")
                return await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise BatchError(f"GET {url}: {exc or type(exc).__name__}") from exc

    async def submit(self, path: Path) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field(
            "file", path.read_bytes(), filename=path.name, content_type="application/jsonl"
        )
        uploaded = await self._json("POST", "/files", data=form)
        created = await self._json(
            "POST",
            "/batches",
            json={
                "input_file_id": uploaded["id"],
                "endpoint": CHAT_URL,
                "completion_window": self.window,
            },
        )
        return str(created["id"])

    async def poll(self, batch_id: str, path: Path) -> BatchState:
        batch = await self._json("GET", f"/batches/{batch_id}")
        status = str(batch.get("status"))
        if status not in TERMINAL:
            return BatchState(status)
        errors = (batch.get("errors") or {}).get("data") or []
        return BatchState(
            status,
            output=await self._text(batch.get("output_file_id")),
            errors=await self._text(batch.get("error_file_id")),
            message="; ".join(str(e.get("message", e)) for e in errors),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class LocalRunBatch:
    """``vllm run-batch`` on a model served here: one process per batch, the model loaded by
    it (no server), the output file written beside the input. A process lost with the run that
    started it has no output: its batch is run again (nothing was bought)."""

    name = "vllm-run-batch"

    def __init__(self, command: Callable[[Path, Path], list[str]], env: dict[str, str]):
        self.command = command  # (input, output) -> argv
        self.env = env
        self.running: dict[str, subprocess.Popen] = {}

    async def submit(self, path: Path) -> str:
        out = _output_of(path)
        out.unlink(missing_ok=True)
        log = path.with_suffix(".log").open("wb")
        process = subprocess.Popen(
            self.command(path, out),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        batch_id = f"local-{path.stem}"
        self.running[batch_id] = process
        return batch_id

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


@dataclass
class BatchStats:
    rounds: int = 0
    submitted: int = 0  # lines sent in batches (this invocation)
    answered: int = 0  # requests answered by a batch, this invocation's or a kept one
    requeued: int = 0  # failed lines sent again in a later round
    failed: int = 0  # requests given up after max_attempts
    online: int = 0  # failed lines asked again online (retry_online)
    resumed: int = 0  # batches found pending in the ledger and waited for again
    waited_s: float = 0.0
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
            "waited_s": round(self.waited_s, 3),
            "batches": [vars(b) for b in self.batches],
        }


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
        poll: float = 10.0,
        max_attempts: int = 3,
        retry_online: bool = False,
        adopt: Sequence[Path] = (),
        siblings: Sequence[Path] = (),
    ):
        """``adopt``: folders of batchers gone from this invocation (drivers of an earlier
        run with more of them) whose pending batches this one waits for; ``siblings``: other
        batchers' folders of the same client, whose finished outputs answer here too (an item
        that moved to another driver). Nothing any of them bought is bought again."""
        self.executor = executor
        self.folder = folder
        self.ledger = folder / "ledger.jsonl"
        self.settle, self.max_lines, self.poll = settle, max_lines, poll
        self.max_attempts = max_attempts
        self.retry_online = retry_online  # a failed line is asked again online, at once
        self.stats = BatchStats()
        # custom id -> the kept output that answers it (read when asked: a long run's answers
        # are not all held in memory; the response cache answers most of them anyway)
        self.kept: dict[str, Path] = {}
        self.files: dict[str, str] = {}  # batch id -> its input file
        self.where: dict[str, Path] = {}  # batch id -> the folder of its ledger and files
        self.queue: dict[str, dict[str, Any]] = {}  # custom id -> request body, next round
        self.waiting: dict[str, list[asyncio.Future]] = {}
        self.pending: dict[str, str] = {}  # custom id -> the submitted batch it is in
        self.bodies: dict[str, dict[str, Any]] = {}  # what each asked id sends (a requeue)
        self.attempts: dict[str, int] = {}
        self.tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._resumed: list[tuple[str, list[str]]] = []
        self._opened = False
        self.folder.mkdir(parents=True, exist_ok=True)
        for where in siblings:
            self._read_ledger(where, resume=False)
        for where in adopt:
            self._read_ledger(where, resume=True)
        self.stats.rounds = self._read_ledger(self.folder, resume=True)

    # ---- the ledger: what was bought, and what came of it ----------------------------------

    def _read_ledger(self, folder: Path, resume: bool) -> int:
        """What ``folder``'s ledger bought: finished outputs answer; with ``resume`` its
        pending batches are waited for again. Its last round."""
        ledger = folder / "ledger.jsonl"
        if not ledger.is_file():
            return 0
        submitted: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for event in ledger_events(ledger):
            if event.get("event") == "submitted":
                submitted[event["batch"]] = event
            elif event.get("event") == "finished":
                finished.add(event["batch"])
                self._keep(folder / event["output"])
        for batch_id, event in submitted.items():
            if batch_id in finished or not resume:
                continue
            self.files[batch_id], self.where[batch_id] = event["file"], folder
            ids = list(event["custom_ids"])
            for cid, body in _read_lines(folder / event["file"]).items():
                self.bodies[cid] = body
            for cid in ids:
                self.pending[cid] = batch_id
            self._resumed.append((batch_id, ids))
        return max((e["round"] for e in submitted.values()), default=0)

    def _append(self, event: dict[str, Any], folder: Path | None = None) -> None:
        ledger = (folder or self.folder) / "ledger.jsonl"
        with ledger.open("a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

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
        if custom_id not in self.pending and custom_id not in self.queue:
            self._enqueue(custom_id)
        return await future

    def _open(self) -> None:
        """Once, in the running loop: wait again for the batches a killed run left pending."""
        if self._opened:
            return
        self._opened = True
        for batch_id, ids in self._resumed:
            self.stats.resumed += 1
            record = BatchRecord(batch_id, self.stats.rounds, len(ids), status="resumed")
            self.stats.batches.append(record)
            self._spawn(self._wait(batch_id, ids, record, time.monotonic()))

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
            self._spawn(self._round(lines))

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

    async def _round(self, lines: dict[str, dict[str, Any]]) -> None:
        self.stats.rounds += 1
        number = self.stats.rounds
        path = self.folder / f"{number:05d}-{len(self.stats.batches):05d}.jsonl"
        text = "".join(
            json.dumps(
                {"custom_id": cid, "method": "POST", "url": CHAT_URL, "body": body},
                ensure_ascii=False,
            )
            + "\n"
            for cid, body in lines.items()
        )
        path.write_text(text, encoding="utf-8")
        batch_id = await self.executor.submit(path)
        self.files[batch_id], self.where[batch_id] = path.name, self.folder
        ids = list(lines)
        # recorded before anything waits on it: a kill from here on finds it again
        self._append(
            {
                "event": "submitted",
                "batch": batch_id,
                "round": number,
                "executor": self.executor.name,
                "file": path.name,
                "custom_ids": ids,
                "at": time.time(),
            }
        )
        for cid in ids:
            self.pending[cid] = batch_id
        self.stats.submitted += len(ids)
        record = BatchRecord(batch_id, number, len(ids))
        self.stats.batches.append(record)
        await self._wait(batch_id, ids, record, time.monotonic())

    async def _wait(self, batch_id: str, ids: list[str], record: BatchRecord, began: float) -> None:
        folder = self.where[batch_id]
        while True:
            state = await self.executor.poll(batch_id, folder / self.files[batch_id])
            if state.status in TERMINAL:
                break
            await asyncio.sleep(self.poll)
        record.waited_s = round(time.monotonic() - began, 3)
        self.stats.waited_s += record.waited_s
        answers, problems = _outcome(state, ids)
        output = folder / f"{_file_safe(batch_id)}.out.jsonl"
        output.write_text(state.output, encoding="utf-8")
        if state.errors:
            output.with_name(f"{_file_safe(batch_id)}.errors.jsonl").write_text(
                state.errors, encoding="utf-8"
            )
        record.status, record.failed = state.status, len(problems)
        self._append(
            {
                "event": "finished",
                "batch": batch_id,
                "status": state.status,
                "output": output.name,
                "failed": {cid: problems[cid] for cid in sorted(problems)},
                "waited_s": record.waited_s,
                "at": time.time(),
            },
            folder,
        )
        for cid in ids:
            self.pending.pop(cid, None)
            if cid in answers:
                self._answer(cid, answers[cid], output)
            else:
                self._retry(cid, problems[cid])

    def _answer(self, cid: str, body: dict[str, Any], output: Path) -> None:
        futures = self.waiting.pop(cid, [])
        if not futures:  # a resumed batch's answer nobody asked for yet
            self.kept[cid] = output
            return
        self.stats.answered += 1
        for future in futures:
            if not future.done():
                future.set_result(body)

    def _retry(self, cid: str, problem: str) -> None:
        if self.retry_online:  # asked online by whoever waits (a line nobody asked yet
            # goes into a round when it is asked)
            futures = self.waiting.pop(cid, [])
            self.stats.online += bool(futures)
            for future in futures:
                if not future.done():
                    future.set_exception(AskOnline(problem))
            return
        self.attempts[cid] = self.attempts.get(cid, 0) + 1
        if self.attempts[cid] < self.max_attempts and cid in self.bodies:
            self.stats.requeued += 1
            self._enqueue(cid)
            return
        self.stats.failed += 1
        for future in self.waiting.pop(cid, []):
            if not future.done():
                future.set_exception(
                    LineFailed(f"batch line failed {self.attempts[cid]} times: {problem}")
                )

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.executor.close()


def _outcome(state: BatchState, ids: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each id's answer body, or why it has none (an error line, a line missing from an
    expired or failed batch)."""
    answers: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for text in (state.output, state.errors):
        for line in text.splitlines():
            try:
                row = json.loads(line)
                cid = row["custom_id"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            response = row.get("response") or {}
            if response.get("status_code") == 200 and not row.get("error"):
                answers[cid] = response["body"]
            else:
                error = row.get("error") or (response.get("body") or {}).get("error") or {}
                message = error.get("message") if isinstance(error, dict) else str(error)
                problems[cid] = f"{response.get('status_code', 'error')}: {message or error}"
    for cid in ids:
        if cid not in answers and cid not in problems:
            problems[cid] = f"batch {state.status}" + (
                f": {state.message}" if state.message else ""
            )
    return answers, problems


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
            events.append(json.loads(line))
    return events


def read_ledgers(run_dir: Path) -> dict[str, Any] | None:
    """Every batch a run bought, from its ledgers (all invocations; None: none): per client
    folder, each batch's round, lines, status, failed lines and wait, and the totals
    (``report`` and the HTML page show them)."""
    folders = sorted((run_dir / "batches").glob("*/ledger.jsonl"))
    if not folders:
        return None
    clients: dict[str, list[dict[str, Any]]] = {}
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
        "pending": sum(b["status"] == "pending" for b in every),
        "waited_s": round(sum(b["waited_s"] or 0 for b in every), 3),
        "clients": clients,
    }
