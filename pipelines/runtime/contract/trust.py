"""Framework files this machine's user trusts: ``$GROUNDCOVER_HOME/trusted-frameworks.json``.

A run made from a framework file records the file's path and SHA-256, but a run can be sent by
anyone, and whoever sends it writes those too: nothing a run holds grants trust. What does is
an act of the user's on this machine: ``groundcover eval FILE.py`` (they ran the file) and
``groundcover trust FILE`` each add the file's path, SHA-256 and the time to this list; ``trust
--revoke`` takes entries off, and the next lookup no longer finds them (the list is read again
at every lookup, never remembered).

Reading a run's framework again (``plugins.study``), the run's recorded SHA-256 only picks the
entries to try; the file is read from the path *the entry* records, and loaded only if the
bytes there hash to the entry's SHA-256 in full. The list itself is read without following a
link and only when it is a regular file of the user's that nobody else may write; it is written
whole (``serving.files.write_atomic``, mode 600) and never through a link, under a lock so that
two commands adding at once both keep their entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from ....serving.files import make_dirs, write_atomic
from ....serving.launch.embedded import cache_root
from .errors import UserError

TRUST_FILE = "trusted-frameworks.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


@dataclass(frozen=True)
class Trusted:
    """One trusted file: where the user trusted it, its SHA-256 then, and when (UTC)."""

    path: str
    sha256: str
    when: str


def trust_list() -> Path:
    return cache_root() / TRUST_FILE


def is_sha256(text: object) -> bool:
    """A full SHA-256 in lowercase hex (what ``sha256sum`` prints): nothing shorter matches."""
    return isinstance(text, str) and SHA256.fullmatch(text) is not None


def trusted() -> list[Trusted]:
    """Every entry of the trust list, read now (none when there is no list)."""
    path = trust_list()
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return []
    except OSError as exc:  # ELOOP: the list is a link, which could point anywhere
        raise UserError(
            f"{path}: not read ({exc.strerror}): the trust list must be a file of yours, not a link"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(handle.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise UserError(f"{path}: not a regular file: the trust list is not read")
        if found.st_uid != os.getuid() or found.st_mode & 0o022:
            raise UserError(
                f"{path}: another user may write it: the trust list is not read "
                f"(chmod 600 {path} if it is yours)"
            )
        data = handle.read()
    return _parse(path, data)


def _parse(path: Path, data: bytes) -> list[Trusted]:
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not JSON ({exc}); remove it or fix it") from None
    entries = document.get("trusted") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{path}: record: field 'trusted': a list of entries is expected")
    out = []
    for number, entry in enumerate(entries, 1):
        where = f"{path}: entry {number}"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: an object is expected")
        file, sha256, when = entry.get("path"), entry.get("sha256"), entry.get("when")
        if not isinstance(file, str) or not Path(file).is_absolute():
            raise UserError(f"{where}: field 'path': an absolute path is expected")
        if not is_sha256(sha256):
            raise UserError(f"{where}: field 'sha256': 64 lowercase hex digits are expected")
        out.append(Trusted(file, str(sha256), str(when or "")))
    return out


def trusted_as(sha256: object) -> list[Trusted]:
    """The entries whose SHA-256 is ``sha256`` in full (none for anything not a SHA-256)."""
    if not is_sha256(sha256):
        return []
    return [entry for entry in trusted() if entry.sha256 == sha256]


def add_trusted(path: Path, sha256: str) -> Trusted:
    """``path`` (absolute; its bytes hashed by the caller, from the one read it loads from)
    trusted with ``sha256``: it replaces an entry of the same path."""
    if not is_sha256(sha256):
        raise ValueError(f"not a SHA-256: {sha256!r}")
    entry = Trusted(str(path), sha256, datetime.now(UTC).isoformat(timespec="seconds"))
    with _locked():
        kept = [old for old in trusted() if old.path != entry.path]
        _write([*kept, entry])
    return entry


def revoke(what: str) -> list[Trusted]:
    """Take off the entries of a SHA-256 (in full) or of a file's path (as trusted: the file
    may be gone or changed since); the entries taken off. None found is an error."""
    wanted = what.strip().lower()
    with _locked():
        entries = trusted()
        if is_sha256(wanted):
            gone = [entry for entry in entries if entry.sha256 == wanted]
        else:
            named = {str(Path(what).absolute()), str(Path(what).resolve())}
            gone = [entry for entry in entries if entry.path in named]
        if not gone:
            raise UserError(f"{what}: not in the trust list ({trust_list()})")
        _write([entry for entry in entries if entry not in gone])
    return gone


def _write(entries: list[Trusted]) -> None:
    home = cache_root()
    make_dirs(home)
    document = {"trusted": [asdict(entry) for entry in entries]}
    text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
    write_atomic(home / TRUST_FILE, text, within=home, permissions=0o600)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer of the list at a time (read, changed, written whole under the lock)."""
    home = cache_root()
    make_dirs(home)
    lock = home / f".{TRUST_FILE}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _CLOEXEC, 0o600)
    except OSError as exc:  # a link there, or another user's file
        raise UserError(f"{lock}: the trust list cannot be locked ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
