"""What a file, a directory or a model is, by content: SHA-256 digests a rerun gets for a stat.

A digest is the file's SHA-256 (what ``sha256sum`` prints), or for a directory the SHA-256 of its
sorted ``relative path NUL file digest`` lines. Names starting with a dot are left out at every
level (``.git``, a hub download's ``.cache`` of timestamps): they are not what a model or an
index is. Symbolic links are followed (a hub snapshot is links into its blob store).

Hashing is streamed in 1 MiB blocks and remembered under ``$GROUNDCOVER_HOME/digests``, one JSON
file per path, keyed per file by (size, mtime, inode): a multi-GB model directory is read once,
and a rerun costs one ``stat`` per file. A file written in the last two seconds is not
remembered (its mtime could still change within the same tick after we read it).

A hub id's revision is the commit its local snapshot resolved to (``refs/<branch>`` in the Hugging
Face cache), asked of the Hub only when the cache does not know it and the machine is online.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import UnsafePath, make_dirs, write_atomic
from .launch.embedded import cache_root

BLOCK = 1 << 20
RACY_SECONDS = 2.0  # a file this young may change again within its mtime's tick
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Digest:
    sha256: str
    size: int  # bytes, over every file counted
    files: int  # 1 for a file

    def short(self) -> str:
        return self.sha256[:12]


def file_digest(path: Path) -> str:
    """A file's SHA-256, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def digest_path(path: Path | str, memo: Path | None = None) -> Digest:
    """The content digest of a file or directory, remembered by stat under ``memo`` (default
    ``$GROUNDCOVER_HOME/digests``). ``FileNotFoundError`` for a path that is not there."""
    real = Path(os.path.realpath(path))
    if not real.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    memo_file = (memo or cache_root() / "digests") / (
        hashlib.sha256(str(real).encode()).hexdigest()[:32] + ".json"
    )
    known = _read_memo(memo_file, real)
    entries: dict[str, list[Any]] = {}
    now, changed, size = time.time(), False, 0
    for rel, full in _files(real):
        st = os.stat(full)
        size += st.st_size
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        old = known.get(rel)
        if old is not None and old[:3] == stamp:
            entries[rel] = old
            continue
        sha = file_digest(full)
        changed = True
        if now - st.st_mtime_ns / 1e9 > RACY_SECONDS:
            entries[rel] = [*stamp, sha]
        else:  # hashed, used, but not remembered
            entries[rel] = [-1, -1, -1, sha]
    if real.is_file():
        total = entries[""][3]
    else:
        lines = hashlib.sha256()
        for rel in sorted(entries):
            lines.update(f"{rel}\0{entries[rel][3]}\n".encode())
        total = lines.hexdigest()
    if changed or set(known) != set(entries):
        _write_memo(memo_file, real, entries)
    return Digest(total, size, len(entries))


def _files(root: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every file under ``root`` (``""`` for a file), dot-names left
    out, in sorted order."""
    if root.is_file():
        return [("", root)]
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        base = Path(folder)
        for name in sorted(names):
            if name.startswith("."):
                continue
            full = base / name
            if full.is_file():  # a dangling link is not content
                found.append((full.relative_to(root).as_posix(), full))
    return sorted(found)


def _read_memo(memo_file: Path, real: Path) -> dict[str, list[Any]]:
    try:
        raw = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("path") != str(real):
        return {}
    entries = raw.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_memo(memo_file: Path, real: Path, entries: dict[str, list[Any]]) -> None:
    """Best effort: a memo that cannot be written costs a re-hash next time, nothing else."""
    with contextlib.suppress(OSError, UnsafePath):
        make_dirs(memo_file.parent)
        text = json.dumps({"path": str(real), "entries": entries})
        write_atomic(memo_file, text, within=memo_file.parent)


# ---- models ------------------------------------------------------------------------------------


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(hf_home) / "hub"


def hub_revision(repo_id: str, revision: str | None = None, online: bool = True) -> str | None:
    """The commit ``repo_id`` at ``revision`` (default ``main``) resolves to: from the local
    Hugging Face cache, else from the Hub when online (a 10 s limit, asked once per process),
    else None."""
    if revision and _COMMIT.match(revision):
        return revision
    return _cached_commit(repo_id, revision) or (_hub_commit(repo_id, revision) if online else None)


def _cached_commit(repo_id: str, revision: str | None) -> str | None:
    folder = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    with contextlib.suppress(OSError):
        found = (folder / "refs" / (revision or "main")).read_text().strip()
        if _COMMIT.match(found):
            return found
    return None


@functools.lru_cache(maxsize=256)
def _hub_commit(repo_id: str, revision: str | None) -> str | None:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if offline:
        return None
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(repo_id, revision=revision, timeout=10).sha
    except Exception:  # no network, no such repo, no access: unresolved, said as such
        return None


def local_path(name: str) -> Path | None:
    """``name`` as a local file or directory, if it is one."""
    path = Path(name).expanduser()
    return path if path.exists() else None


def model_content(name: str, revision: str | None = None) -> dict[str, Any]:
    """What a model named by a path or a hub id is: ``{"revision": ..., "source": ...}``, where
    source says how it was found (``directory`` digest, ``hub`` commit, or ``unresolved``)."""
    path = local_path(name)
    if path is not None:
        found = digest_path(path)
        record = {"revision": f"sha256:{found.sha256}", "source": "directory", "path": str(path)}
        return record | {"size": found.size, "files": found.files}
    if "/" in name:
        commit = hub_revision(name, revision)
        if commit is not None:
            return {"revision": commit, "source": "hub", "hub_id": name}
        return {"revision": revision, "source": "unresolved", "hub_id": name}
    return {"revision": revision, "source": "unresolved"}


# ---- file systems ------------------------------------------------------------------------------

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "fuse.gcsfuse",
        "fuse.s3fs",
        "fuse.juicefs",
        "wekafs",
        "panfs",
    }
)


def filesystem_of(path: Path | str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system ``path`` lives on (its longest mount point), or None."""
    target = os.path.realpath(path)  # links resolved where they exist; the rest as given
    best, kind = "", None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def on_network_filesystem(path: Path | str) -> bool:
    """Whether ``path`` lives on a file system shared over the network (NFS, Lustre, GPFS...),
    where SQLite's WAL mode does not work. ``GROUNDCOVER_SHARED_FS=1``/``0`` says so outright."""
    told = os.environ.get("GROUNDCOVER_SHARED_FS")
    if told in ("0", "1"):
        return told == "1"
    return filesystem_of(path) in NETWORK_FILESYSTEMS


# ---- content a run says it read ----------------------------------------------------------------

# kernel and device file systems: their files are views of the machine (a process's memory map,
# a device), not content; a "file" there may never end, or read differently on every read
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "debugfs",
        "tracefs",
        "securityfs",
        "cgroup",
        "cgroup2",
        "pstore",
        "bpf",
        "configfs",
        "fusectl",
        "efivarfs",
        "mqueue",
        "hugetlbfs",
        "binfmt_misc",
        "autofs",
        "rpc_pipefs",
        "nsfs",
        "selinuxfs",
        "nfsd",
    }
)
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")  # where no mount table can be read
FOLDERS_BEYOND_FILES = 1000  # folders a walk may enter beyond one per file recorded


class NotAsRecorded(ValueError):
    """A path is not what a run recorded for it, or cannot be checked without reading what it
    must not: the message says why, or is empty where the content simply changed (other
    sizes, another SHA-256)."""


def pseudo_devices(mountinfo: str = "/proc/self/mountinfo") -> frozenset[int] | None:
    """The device numbers (``st_dev``) of every mounted kernel or device file system, from the
    mount table (``major:minor`` is the third field); None where it cannot be read."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    found: set[int] = set()
    for line in lines:
        fields = line.split()
        if "-" not in fields[3:]:
            continue
        kind = fields[fields.index("-", 3) + 1] if len(fields) > fields.index("-", 3) + 1 else ""
        if kind in PSEUDO_FILESYSTEMS:
            major, _, minor = fields[2].partition(":")
            with contextlib.suppress(ValueError):
                found.add(os.makedev(int(major), int(minor)))
    return frozenset(found)


@dataclass
class _Walk:
    """A walk of what a run recorded as ``files`` files of ``size`` bytes, that reads nothing:
    it stops at the first file or byte beyond those, or at anything that is not content."""

    root: str
    size: int
    files: int
    pseudo: frozenset[int] | None
    found: list[tuple[str, str, os.stat_result]]
    seen_size: int = 0
    folders: int = 0

    def check_device(self, path: str, st: os.stat_result) -> None:
        pseudo = (
            self.pseudo is not None
            and st.st_dev in self.pseudo
            or self.pseudo is None
            and any(path == r or path.startswith(r + "/") for r in _PSEUDO_ROOTS)
        )
        if pseudo:
            raise NotAsRecorded(f"{path} is on a kernel or device file system, not content")

    def add_file(self, rel: str, path: str, st: os.stat_result) -> None:
        self.check_device(path, st)
        self.seen_size += st.st_size
        self.found.append((rel, path, st))
        if len(self.found) > self.files:
            raise NotAsRecorded("")  # changed: more than recorded
        if self.seen_size > self.size:
            raise NotAsRecorded("")  # changed: more than recorded

    def folder(self, rel: str, path: str, st: os.stat_result, above: frozenset[Any]) -> None:
        self.check_device(path, st)
        self.folders += 1
        if self.folders > self.files + FOLDERS_BEYOND_FILES:
            raise NotAsRecorded(f"more folders than {self.files} files could be in")
        here = (st.st_dev, st.st_ino)
        if here in above:
            raise NotAsRecorded(f"{path} is a link loop")
        try:
            with os.scandir(path) as listing:
                names = sorted(e.name for e in listing if not e.name.startswith("."))
        except OSError as exc:
            raise NotAsRecorded(f"{path}: unreadable ({exc.strerror or exc})") from None
        for name in names:
            full, inner = os.path.join(path, name), f"{rel}/{name}" if rel else name
            try:
                entry = os.stat(full)  # links followed, as the digest follows them
            except OSError:
                continue  # a dangling link is not content (nor to the digest)
            if stat.S_ISDIR(entry.st_mode):
                self.folder(inner, full, entry, above | {here})
            elif stat.S_ISREG(entry.st_mode):
                self.add_file(inner, full, entry)
            else:
                self.check_device(full, entry)  # a FIFO or device: not content, never opened


def digest_as_recorded(
    path: Path | str,
    size: int,
    files: int,
    matches: Callable[[str], bool],
    memo: Path | None = None,
) -> Digest:
    """The digest of ``path`` as ``digest_path`` makes it, when it is what a run recorded:
    ``files`` regular files of ``size`` bytes in all, whose SHA-256 ``matches`` what the run
    recorded. Checked first by a walk that reads nothing (no kernel or device file system, no
    link loop, no file or byte beyond those recorded); then at most ``size`` bytes are read.
    ``NotAsRecorded`` says why not. The memo of digests is used, and written only for a path
    that matched (a path a sent run names leaves no trace of its own)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise NotAsRecorded(f"{path}: {exc.strerror or exc}") from None
    walk = _Walk(real, size, files, pseudo_devices(), [])
    if stat.S_ISREG(st.st_mode):
        walk.add_file("", real, st)
    elif stat.S_ISDIR(st.st_mode):
        walk.folder("", real, st, frozenset())
    else:
        walk.check_device(real, st)
        raise NotAsRecorded(f"{path} is neither a file nor a folder")
    if (len(walk.found), walk.seen_size) != (files, size):
        raise NotAsRecorded("")  # changed: fewer files or bytes than recorded
    memo_file = (memo or cache_root() / "digests") / (
        hashlib.sha256(real.encode()).hexdigest()[:32] + ".json"
    )
    known, entries, now = _read_memo(memo_file, Path(real)), {}, time.time()
    for rel, full, seen in walk.found:
        stamp = [seen.st_size, seen.st_mtime_ns, seen.st_ino]
        old = known.get(rel)
        if old is not None and old[:3] == stamp:
            entries[rel] = old
            continue
        sha = _bounded_file_digest(full, seen)
        fresh = now - seen.st_mtime_ns / 1e9 > RACY_SECONDS
        entries[rel] = [*stamp, sha] if fresh else [-1, -1, -1, sha]
    if walk.found and walk.found[0][0] == "":
        total = entries[""][3]
    else:
        lines = hashlib.sha256()
        for rel in sorted(entries):
            lines.update(f"{rel}\0{entries[rel][3]}\n".encode())
        total = lines.hexdigest()
    if not matches(total):
        raise NotAsRecorded("")  # no more to say: its content is not what was recorded
    if known != entries:
        _write_memo(memo_file, Path(real), entries)
    return Digest(total, size, files)


def _bounded_file_digest(path: str, seen: os.stat_result) -> str:
    """The SHA-256 of the file the walk saw at ``path``, reading at most its size then: opened
    without waiting (a FIFO put there since is not waited on) and checked to be that file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        handle = os.open(path, flags)
    except OSError as exc:
        raise NotAsRecorded(f"{path}: {exc.strerror or exc}") from None
    with os.fdopen(handle, "rb") as opened:
        now = os.fstat(opened.fileno())
        if (now.st_dev, now.st_ino, now.st_size) != (seen.st_dev, seen.st_ino, seen.st_size):
            raise NotAsRecorded(f"{path} changed while it was checked")
        digest, left = hashlib.sha256(), seen.st_size
        while left > 0 and (block := opened.read(min(BLOCK, left))):
            digest.update(block)
            left -= len(block)
        if left:
            raise NotAsRecorded(f"{path} changed while it was read")
    return digest.hexdigest()
