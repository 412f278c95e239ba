"""Run directories: a manifest, per-item results appended atomically as JSONL, and a summary.

Restarting the same command on the same directory resumes: items with a recorded result are
skipped. A process killed mid-write leaves at most a torn last line, which is cut off on the next
open (that item simply runs again), so every item ends with exactly one result. An item recorded
as ``error`` (a rejected request, a crashed solver) is tried again on resume; its new record
supersedes the old one.

results.jsonl is read once per invocation: ``open`` validates every record but keeps only its
byte offset and status, and ``results`` reads records back when they are used, so a 100,000-item
run does not hold its records in memory. The torn-tail repair seeks from the end.

A run solved by several drivers (``--drivers N``) has one more file per driver, ``results.dK.jsonl``
(``shard_file``): each driver appends to its own, and every reader sees the union of the files
(``result_files``): one run, whatever number of drivers wrote it, and a resume with another N
finds every item recorded so far.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from ....serving.files import make_dirs, open_unlinked, write_atomic
from ....serving.redact import redact
from ..contract.errors import UserError
from ..contract.results import FAILED_STATUSES, STATUSES, ItemResult
from .lines import JsonlView
from .manifest import (
    FORMAT_VERSION,
    RunManifest,
    RunSummary,
    StudyRecord,
)

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
STUDY_FILE = "study.json"  # a study's root: its runs and combined tables
RETRIED = FAILED_STATUSES  # statuses a resume asks again
SHARD_FILES = "results.*.jsonl"  # one per driver of a run solved by several (results.d0.jsonl ...)
INVOCATIONS = "invocations.jsonl"  # one line per invocation that solved items: wall time
LOCK = "run.lock"  # the process writing the run now (``RunLock``)
SUPERSEDED = "superseded"  # a re-solved run's earlier files, one folder per time (--supersede)
# FORMAT_VERSION (store.manifest) 2: typed item records (status, score, explanation,
# details, usage, failure) and the framework name in the manifest.


R = TypeVar("R", bound=BaseModel)


class RunStoreError(RuntimeError):
    pass


def atomic_write_json(path: Path, value: Any, *, within: Path | None = None) -> None:
    """``value`` as JSON, whole or not at all (``atomic_write_text``)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n"
    atomic_write_text(path, text, within=within)


def atomic_write_text(path: Path, text: str, *, within: Path | None = None) -> None:
    """``text`` as ``path`` through ``serving.files`` (a temporary file renamed over it; inside
    ``within``, a folder the user did not name, a link on the way refused): readers see the old
    or the new file, never half of one; when the disk is full the old file stays."""
    try:
        write_atomic(path, text, within=within)  # a link refused: UnsafePath, one line as it is
    except OSError as exc:
        raise RunStoreError(f"{path}: cannot write ({exc.strerror or exc}); {KEPT}") from exc


KEPT = "what was recorded is intact: free space, then run the same command to resume"


def fingerprint(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("groundcover")
    except PackageNotFoundError:
        return "unknown"


def read_manifest(path: Path) -> RunManifest:
    """A run's manifest, refused with one line when missing, unreadable or of another format."""
    if not path.is_file():
        raise RunStoreError(f"{path.parent}: not a run directory (no {MANIFEST})")
    from .contained import refuse_links_out  # its files read only from inside it

    refuse_links_out(path.parent)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunStoreError(f"{path}: unreadable manifest: {exc}") from exc
    except RecursionError:  # a manifest from elsewhere: one line, not a traceback
        raise RunStoreError(f"{path}: unreadable manifest: JSON nested too deeply") from None
    version = raw.get("format_version", 1) if isinstance(raw, dict) else None
    if version != FORMAT_VERSION:
        raise RunStoreError(
            f"{path}: run directory of format version {version}; this groundcover reads version "
            f"{FORMAT_VERSION} (rerun into a new --run-dir)"
        )
    try:
        return RunManifest.model_validate(raw)
    except ValidationError as exc:
        raise RunStoreError(f"{path}: corrupt manifest: {_first_error(exc)}") from exc


def changed_run(path: Path, manifest: RunManifest, task: str, config: dict[str, Any]) -> str:
    """The one line refusing a run directory whose identity changed: what changed, and the
    ways on."""
    if manifest.task != task:
        return (
            f"{path}: this run directory holds a different task or config (the task "
            f"{manifest.task}, not {task}); use a new --run-dir"
        )
    from .provenance import identity_changes

    changes = identity_changes(manifest.config, config) or ["its configuration"]
    shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
    return (
        f"{path}: this run directory holds a different task or config, recorded before these "
        f"changed: {shown}. Its numbers rest on the old ones: give a new --run-dir, or "
        f"--supersede to solve it again here (the old records are kept in {SUPERSEDED}/)"
    )


def run_directories(paths: Sequence[Path]) -> list[Path]:
    """Run directories in the order given, a study root standing for its recorded runs;
    anything else is refused in one line."""
    out = []
    for path in paths:
        if (path / MANIFEST).is_file():
            out.append(path)
        elif (path / STUDY_FILE).is_file():
            from .contained import study_runs  # its runs inside it, links resolved

            out += study_runs(path, read_study(path).runs).values()
        else:
            raise UserError(f"{path}: not a run directory (no manifest.json) or a study root")
    return out


def read_study(root: Path) -> StudyRecord:
    """A study root's ``study.json``."""
    return _read_record(root / STUDY_FILE, StudyRecord, "study record")


def read_summary(run_dir: Path) -> RunSummary:
    """A run's ``summary.json`` as its last invocation wrote it."""
    return _read_record(run_dir / SUMMARY, RunSummary, "summary")


def _read_record(path: Path, model: type[R], what: str) -> R:
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise RunStoreError(f"{path}: unreadable: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise RunStoreError(f"{path}: corrupt {what}: {_first_error(exc)}") from exc


def shard_file(run_dir: Path, shard: str) -> Path:
    """The results file the driver ``shard`` (``d0``, ``d1``...) of a run appends to."""
    return run_dir / f"results.{shard}.jsonl"


def result_files(run_dir: Path) -> list[Path]:
    """A run's results files: results.jsonl, then each driver's shard file in driver order."""

    def driver(path: Path) -> tuple[int, str]:
        tag = path.name[len("results.") : -len(".jsonl")]
        return (int(tag[1:]) if tag[1:].isdigit() else 1 << 30, tag)

    return [run_dir / RESULTS, *sorted(run_dir.glob(SHARD_FILES), key=driver)]


Entry = tuple[int, int, str]  # (file number in result_files, byte offset, status)


def index_results(path: Path) -> dict[str, Entry]:
    """Where each id's surviving record is, over the run's results files (``path`` is its
    results.jsonl; its drivers' shard files beside it are read too), every record validated but
    none kept. A torn last line is not a record. In one file a later record of an id (the
    retry of an ``error``) supersedes the earlier one; across files a final record supersedes a
    retried one (a resume with another number of drivers retries an item in another file)."""
    return index_files(result_files(path.parent))


def index_files(
    files: list[Path], scan: Callable[[Path], Iterator[tuple[str, int, str]]] | None = None
) -> dict[str, Entry]:
    """``index_results`` over ``files``, numbered in that order (later files supersede).
    ``scan``: how one file is read (default: every record validated)."""
    index: dict[str, Entry] = {}
    for number, file in enumerate(files):
        for record_id, offset, status in (scan or _scan)(file):
            known = index.get(record_id)
            if known is None or known[0] == number or status not in RETRIED:
                index.pop(record_id, None)  # keep file order of the surviving record
                index[record_id] = (number, offset, status)
            elif known[2] in RETRIED:  # two retried records: the later file's
                index[record_id] = (number, offset, status)
    return index


def _scan(path: Path) -> Iterator[tuple[str, int, str]]:
    """(id, byte offset, status) of each whole record of one results file."""
    if not path.exists():
        return
    offset = 0
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):
                break  # torn tail: not a finished record
            try:
                record = ItemResult.model_validate_json(line)
            except ValidationError as exc:
                raise RunStoreError(
                    f"{path}:{lineno}: corrupt record: {_first_error(exc)}"
                ) from exc
            yield record.id, offset, record.status
            offset += len(line)


def results_by_id(path: Path) -> Sequence[ItemResult]:
    """A run's surviving records in id order (how tables are computed, whatever order items
    finished in, and whichever driver recorded them), read when used. ``path``: its
    results.jsonl."""
    index = index_results(path)
    return records_view(result_files(path.parent), [index[i] for i in sorted(index)])


def records_view(files: list[Path], entries: list[Entry]) -> Sequence[ItemResult]:
    """The records at ``entries``, read on access: a plain view of one file when they all live
    in one (the usual run), else one over the run's files."""
    numbers = {number for number, _, _ in entries}
    if len(numbers) <= 1:
        path = files[numbers.pop()] if numbers else files[0]
        return JsonlView(path, array("q", (offset for _, offset, _ in entries)), _parse_record)
    return ShardedRecords(files, entries)


class ShardedRecords(Sequence[ItemResult]):
    """Records spread over a run's results files (a run several drivers solved), read on use."""

    def __init__(self, files: list[Path], entries: list[Entry]):
        self.files = files
        self.numbers = array("i", (number for number, _, _ in entries))
        self.offsets = array("q", (offset for _, offset, _ in entries))

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, index: int) -> ItemResult: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ItemResult]: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[k] for k in range(len(self))[index]]
        with open(self.files[self.numbers[index]], "rb") as handle:
            handle.seek(self.offsets[index])
            return _parse_record(index, handle.readline())

    def __iter__(self) -> Iterator[ItemResult]:
        with contextlib.ExitStack() as stack:
            handles: dict[int, Any] = {}
            for number, offset in zip(self.numbers, self.offsets, strict=True):
                if number not in handles:
                    handles[number] = stack.enter_context(open(self.files[number], "rb"))
                handles[number].seek(offset)
                yield _parse_record(0, handles[number].readline())


def _parse_record(_: int, line: bytes) -> ItemResult:
    return ItemResult.model_validate_json(line)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "record"
    return f"{where}: {error['msg']}"


class RunStore:
    """One run directory. ``shard``: this process is the driver ``shard`` of a run several
    drivers solve, and appends to its own shard file; it reads every driver's records."""

    def __init__(self, run_dir: Path | str, shard: str | None = None):
        self.dir = Path(run_dir)
        self.manifest_path = self.dir / MANIFEST
        self.results_path = self.dir / RESULTS
        self.summary_path = self.dir / SUMMARY
        self.own_path = self.results_path if shard is None else shard_file(self.dir, shard)
        self.files: list[Path] = [self.results_path]  # the run's results files, numbered
        self.index: dict[str, Entry] = {}  # id -> (file, offset, status) of its record
        self._fd: int | None = None
        self.lock: RunLock | None = None  # held from ``open`` to ``release``

    # ---- manifest ----------------------------------------------------------------------------

    def open(
        self,
        *,
        framework: str,
        task: str,
        config: dict[str, Any],
        supersede: bool = False,
        legacy: dict[str, Any] | None = None,
        earlier: dict[str, Any] | None = None,
        **provenance: Any,
    ):
        """Create the run, or resume it if the directory holds the same task and config; read
        the recorded results once. ``provenance``: options, models, prompts, inputs... (not
        identity); ``legacy``: the run's identity as directories made before content identities
        kept it (such a directory resumes, and says its inputs were not fingerprinted);
        ``earlier``: the identity before endpoints were known by their URL (such a directory
        resumes, and keeps the identity of now from then on).

        A directory whose identity changed (an input, a model, an option) is refused in one
        line naming what changed, unless ``supersede``: its files are then moved to
        ``superseded/<time>/`` and the run starts again in place."""
        make_dirs(self.dir)  # the run directory is the user's (typed, or runs/ by default)
        if self.lock is None:  # before anything is written: a second writer changes nothing
            lock = RunLock(self.dir)
            lock.acquire()
            self.lock = lock
        try:
            return self._open(framework, task, config, provenance, supersede, legacy, earlier)
        except BaseException:
            self.release()
            raise

    def _open(
        self,
        framework: str,
        task: str,
        config: dict[str, Any],
        provenance: dict[str, Any],
        supersede: bool,
        legacy: dict[str, Any] | None,
        earlier: dict[str, Any] | None = None,
    ):
        config_fp = fingerprint({"task": task, "config": config})
        manifest = read_manifest(self.manifest_path) if self.manifest_path.exists() else None
        if manifest is not None and self.changed(
            manifest, task, config, config_fp, legacy, earlier
        ):
            if not supersede or manifest.task != task:
                raise RunStoreError(changed_run(self.manifest_path, manifest, task, config))
            self.set_aside()
            manifest = None
        if manifest is not None:
            fingerprinted = "content" in manifest.config
            manifest.resumed_at = [*manifest.resumed_at, time.time()]
            if not fingerprinted and "content" in config:  # from now on, by content
                manifest.inputs_fingerprinted = False
                manifest.fingerprinted_since = time.time()
                manifest.config, manifest.config_fingerprint = config, config_fp
            elif manifest.config_fingerprint != config_fp:  # made before URLs counted
                manifest.config, manifest.config_fingerprint = config, config_fp
            if "inputs" in provenance:  # where the same content lives now
                manifest.inputs = provenance["inputs"]
        else:
            manifest = RunManifest(
                framework=framework,
                task=task,
                command=[redact(arg) for arg in sys.argv],  # a URL's password, say
                config=config,
                config_fingerprint=config_fp,
                **provenance,
                inputs_fingerprinted="content" in config,
                package_version=package_version(),
                git_revision=git_revision(),
                python=sys.version.split()[0],
                host=platform.node(),
                created_at=time.time(),
            )
        atomic_write_json(self.manifest_path, manifest.to_json(), within=self.dir)
        self.attach()
        return manifest

    @classmethod
    def changed(
        cls,
        manifest: RunManifest,
        task: str,
        config: dict,
        config_fp: str,
        legacy: dict | None = None,
        earlier: dict | None = None,
    ) -> bool:
        """Whether the run directory holds another run than ``task`` with ``config``
        (``legacy``: the same run's identity as directories made before content identities
        kept it; ``earlier``: as made before endpoints were known by their URL)."""
        if manifest.config_fingerprint == config_fp:
            return False
        if earlier is not None and manifest.config_fingerprint == fingerprint(
            {"task": task, "config": earlier}
        ):
            return False
        return not cls.from_before_fingerprints(manifest, task, legacy)

    @staticmethod
    def from_before_fingerprints(manifest: RunManifest, task: str, legacy: dict | None) -> bool:
        """A run directory made before inputs and models were known by content: the same run
        when its identity is the one such a run kept (it resumes, and says its inputs were not
        fingerprinted)."""
        if "content" in manifest.config or legacy is None:
            return False
        return manifest.config_fingerprint == fingerprint({"task": task, "config": legacy})

    def set_aside(self) -> Path:
        """Move the run's files (not its lock, not other runs' sub-directories) to
        ``superseded/<time>/``: kept, no longer read."""
        target = self.dir / SUPERSEDED / time.strftime("%Y%m%d-%H%M%S")
        while target.exists():
            target = target.with_name(target.name + "-1")
        make_dirs(target, within=self.dir)  # a linked superseded/ would carry the files off
        for path in sorted(self.dir.iterdir()):
            if path.is_file() and path.name != LOCK and not path.name.startswith("."):
                os.replace(path, target / path.name)
        return target

    def attach(self) -> None:
        """Read the recorded results of an existing run (a driver joins the run its command
        opened), after cutting a torn tail off the file this store appends to: only its own,
        since another driver may be writing its file now."""
        self._repair_tail()
        self.reindex()

    def reindex(self) -> None:
        """Read every results file's records again (after other drivers wrote theirs)."""
        self.files = result_files(self.dir)
        if self.own_path not in self.files:  # a driver's file before its first record
            self.files.append(self.own_path)
        self.index = index_files(self.files)

    def manifest(self) -> RunManifest:
        return read_manifest(self.manifest_path)

    @classmethod
    def reading(cls, run_dir: Path | str) -> RunStore:
        """A run's store as it is on disk, to read only: nothing is repaired or written."""
        store = cls(run_dir)
        store.reindex()
        return store

    # ---- results -----------------------------------------------------------------------------

    def _repair_tail(self, block: int = 1 << 16) -> None:
        """Cut a torn last line left by a process killed mid-append, reading only the tail."""
        try:  # never through a link: a sent run's results.jsonl -> a file of the reader's
            fd = open_unlinked(self.own_path, os.O_RDWR, within=self.dir)
        except FileNotFoundError:
            return
        with open(fd, "r+b") as handle:
            end = handle.seek(0, os.SEEK_END)
            if end == 0:
                return
            handle.seek(end - 1)
            if handle.read(1) == b"\n":
                return
            position = end
            while position > 0:
                start = max(0, position - block)
                handle.seek(start)
                chunk = handle.read(position - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    handle.truncate(start + newline + 1)
                    return
                position = start
            handle.truncate(0)

    def pending(self, ids: list[str]) -> set[str]:
        """Ids without a final record: never recorded, or recorded as ``error`` or
        ``cut_in_reasoning`` (retried: a rerun with a larger --reasoning-tokens resumes them)."""
        return {i for i in ids if i not in self.index or self.index[i][2] in RETRIED}

    def results(self, ids: list[str] | None = None) -> Sequence[ItemResult]:
        """Recorded results, in the order of ``ids`` when given (else file order), each read
        from the file when used."""
        keys = self.index if ids is None else [i for i in ids if i in self.index]
        return records_view(self.files, [self.index[i] for i in keys])

    def append(self, result: ItemResult) -> None:
        """One write() of one whole line on an O_APPEND descriptor: no interleaving, no torn
        records from concurrent writers; a kill can only tear the line being written."""
        if not isinstance(result, ItemResult):
            raise TypeError(f"record {result!r}: the run store takes ItemResult records")
        if self.lock is not None and self.lock.lost:
            raise RunStoreError(f"{self.lock.lost}; {result.id!r} was not recorded")
        data = (result.model_dump_json() + "\n").encode()
        if self._fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            self._fd = open_unlinked(self.own_path, flags, within=self.dir)
        end = os.fstat(self._fd).st_size
        try:
            if os.write(self._fd, data) != len(data):  # a full disk can take part of the line
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            os.ftruncate(self._fd, end)  # the file ends with a whole record again
            raise RunStoreError(
                f"{self.own_path}: cannot record {result.id!r} ({exc.strerror or exc}); {KEPT}"
            ) from exc
        self.index.pop(result.id, None)
        self.index[result.id] = (self.files.index(self.own_path), end, result.status)

    def release(self) -> None:
        """Give up the run's lock (the run has ended, or stopped)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def write_summary(self, summary: RunSummary) -> None:
        atomic_write_json(self.summary_path, summary.to_json(), within=self.dir)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


# ---- one writer per run directory ---------------------------------------------------------------

RENEW_SECONDS = 10.0  # a holder rewrites its lock this often
STALE_SECONDS = 60.0  # a lock not renewed for this long is taken over (a holder on another host)


class RunLock:
    """The one process writing a run directory: ``run.lock`` holds its pid, host, start time and
    when it last renewed the lock. It is made whole before it appears (a uniquely named file,
    linked to ``run.lock``: the link fails if one is there, atomic on local file systems and
    NFS), renewed every ``RENEW_SECONDS`` by a thread, and removed when the run ends. A second
    process is refused in one line naming the holder. A stale lock -- its process gone on this
    host, or not renewed for ``STALE_SECONDS`` (a host that died) -- is taken over.

    Every step that reads the lock and then changes it (a take-over, a renewal, a release) runs
    under an ``flock`` of ``.run.lock.guard``: of several processes finding one stale lock,
    exactly one replaces it, and the others then find the new holder alive; a holder never
    rewrites a lock taken from it. Where the file system has no such locks, the stale lock
    is renamed to a name of the taker's own and kept only if it is the one judged stale (a
    fresh one is linked back). A holder that finds its lock taken stops recording (``lost``).
    The drivers of a run write under their command's lock."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
        self.token = f"{platform.node()}:{os.getpid()}:{time.time_ns()}"
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        for _ in range(50):
            with self._guard():
                if self._create(started=time.time()):
                    self._thread = threading.Thread(
                        target=self._renew, name="run-lock", daemon=True
                    )
                    self._thread.start()
                    return
                holder = self._read()
                if holder is None and time.time() - self._mtime() < STALE_SECONDS:
                    pass  # unreadable (an older groundcover writing it): looked at again
                elif stale(holder or {}) is None:
                    raise RunStoreError(busy(self.path.parent, holder or {})) from None
                else:
                    self._take_over(holder)
                    continue
            time.sleep(0.1)
        raise RunStoreError(f"{self.path}: could not take the run's lock (contended)")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        with self._guard():
            holder = self._read()
            if holder is not None and holder.get("token") == self.token:
                self.path.unlink(missing_ok=True)

    def _content(self, started: float) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": platform.node(),
            "started": started,
            "renewed": time.time(),
            "token": self.token,
        }

    def _create(self, started: float) -> bool:
        """``run.lock`` made ours, whole, if there is none (False: there is one)."""
        if os.path.lexists(self.path):  # under the guard nobody removes it meanwhile
            return False
        mine = self.path.with_name(f".{LOCK}.{self.token.replace(':', '-')}")
        write_atomic(mine, json.dumps(self._content(started)), within=self.path.parent)
        try:
            os.link(mine, self.path)
        except FileExistsError:
            return False
        finally:
            mine.unlink(missing_ok=True)
        return True

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            with self._guard():
                holder = self._read()
                if holder is None or holder.get("token") != self.token:
                    who = busy(self.path.parent, holder or {}) if holder else "its lock is gone"
                    self.lost = f"{self.path.parent}: another process took over this run ({who})"
                    return
                with contextlib.suppress(OSError, RunStoreError):  # a full disk: next time
                    atomic_write_json(
                        self.path,
                        self._content(started=holder["started"]),
                        within=self.path.parent,
                    )

    def _take_over(self, judged: dict[str, Any] | None) -> None:
        """The stale lock ``judged`` removed. Under the guard nobody else changes it between
        the reading and the removing; without one (no ``fcntl`` locks), it is renamed to this
        taker's own name and, if it is not the lock judged stale (another taker's, made
        meanwhile), linked back."""
        aside = self.path.with_name(f".{LOCK}.stale.{self.token.replace(':', '-')}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            found = json.loads(aside.read_text())
        except (OSError, ValueError):
            found = None
        if (
            judged is not None
            and isinstance(found, dict)
            and found.get("token") != judged.get("token")
        ):
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)  # not the stale one: put back
        aside.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """This run directory's lock steps one at a time (``flock``: per open file, so two
        threads of one process are kept apart too; where the file system has no locks,
        unguarded: ``_take_over`` checks what it removed)."""
        import fcntl

        try:
            fd = open_unlinked(
                self.path.with_name(f".{LOCK}.guard"),
                os.O_RDWR | os.O_CREAT,
                within=self.path.parent,
            )
        except OSError:
            yield
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # ENOLCK and the like: no locks on this file system
                yield
                return
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _read(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0


def stale(holder: dict[str, Any], now: float | None = None) -> str | None:
    """Why a lock's holder is gone, or is this very process (None: another live process). This
    process opening the run again (a notebook's cell rerun after an interrupt, a test) takes its
    own lock back."""
    now = time.time() if now is None else now
    if holder.get("host") == platform.node() and holder.get("pid") == os.getpid():
        return "held by this process"
    renewed = holder.get("renewed")
    if not isinstance(renewed, (int, float)) or now - renewed > STALE_SECONDS:
        return f"not renewed for {STALE_SECONDS:.0f} s"
    if holder.get("host") == platform.node() and not alive(holder.get("pid")):
        return "its process is gone"
    return None


def alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:  # a killed process its parent has not reaped yet is a zombie: gone all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): it answered the signal
        return True


def busy(run_dir: Path, holder: dict[str, Any]) -> str:
    started = holder.get("started")
    since = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        if isinstance(started, (int, float))
        else "?"
    )
    return (
        f"{run_dir}: another process is writing this run: pid {holder.get('pid')} on host "
        f"{holder.get('host')} since {since}; wait for it, or stop it (a lock not renewed for "
        f"{STALE_SECONDS:.0f} s, or whose process is gone, is taken over)"
    )


def record_invocation(run_dir: Path, started: float, seconds: float, solved: int) -> None:
    """One line per invocation that had models open (GPU-hour prices charge its wall time).
    Best effort: on a full disk the line is lost (never a record), and the error that stopped
    the run is the one reported."""
    line = json.dumps({"started": started, "seconds": round(seconds, 3), "solved": solved})
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    with contextlib.suppress(OSError):
        fd = open_unlinked(run_dir / INVOCATIONS, flags, within=run_dir)
        with open(fd, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def invocations(run_dir: Path) -> tuple[float, int]:
    """Wall time and items solved over every recorded invocation (a torn line is skipped)."""
    path = run_dir / INVOCATIONS
    seconds, solved = 0.0, 0
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                seconds, solved = seconds + float(entry["seconds"]), solved + int(entry["solved"])
            except (ValueError, KeyError, TypeError):
                continue
    return seconds, solved


def invocation_seconds(run_dir: Path) -> float:
    return invocations(run_dir)[0]


def status_counts(records: list[ItemResult]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for record in records:
        counts[record.status] += 1
    return counts
