"""Getting a catalogued dataset: download (Hugging Face Hub, or ir_datasets), pin, verify, convert,
cache.

Layout under ``$GROUNDCOVER_HOME/data``: ``hub/`` is huggingface_hub's cache (resumable downloads,
``HF_ENDPOINT`` / ``HF_TOKEN`` honoured), ``<name>/<revision>/`` the converted files, and
``lock.json`` what each ``NAME@REQUESTED`` resolved to: the commit and the sha256 of every
published and converted file. The first get writes the lock; every later use verifies against
it, and a get whose lock and converted files are present makes no request. ``HF_HUB_OFFLINE=1``
uses only the cache.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import functools
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...serving.content import file_digest
from ...serving.files import make_dirs, write_atomic
from ...serving.launch.embedded import cache_root
from ..runtime.contract.errors import UserError
from ..runtime.store.lines import stamp
from ..runtime.terminal import terminal
from .catalog import Dataset, lookup, parse_spec
from .convert import offline

console = terminal(stderr=True)
LOCK = "lock.json"


@dataclass(frozen=True)
class Resolved:
    """A dataset ready on disk: its main file and where it came from."""

    name: str
    requested: str
    revision: str
    path: Path
    sha256: str


def data_root() -> Path:
    return cache_root() / "data"


# ---- the lock file ---------------------------------------------------------------------------


def read_lock() -> dict[str, Any]:
    path = data_root() / LOCK
    if not path.exists():
        return {}
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); remove it to fetch again") from None
    if not isinstance(found, dict):
        raise UserError(f"{path}: expected an object NAME@REVISION -> entry")
    return found


def write_lock_entry(key: str, entry: dict[str, Any]) -> None:
    """Atomic: a reader sees the old lock or the new one."""
    lock = read_lock() | {key: entry}
    root = data_root()
    make_dirs(root)
    write_atomic(root / LOCK, json.dumps(lock, indent=1, sort_keys=True), within=root)


def lock_key(name: str, requested: str) -> str:
    return f"{name}@{requested}"


def locked(name: str, requested: str | None = None) -> dict[str, Any] | None:
    """The lock entry of ``name`` (at ``requested``; else the catalogue's revision or a local
    copy registered with ``data add``)."""
    lock = read_lock()
    if requested is not None:
        return lock.get(lock_key(name, requested))
    return lock.get(lock_key(name, lookup(name).revision)) or lock.get(lock_key(name, "local"))


# ---- get -------------------------------------------------------------------------------------


def get(spec: str, *, quiet: bool = False) -> Resolved:
    """The dataset ``NAME[@REVISION]`` on disk: from the cache when the lock and files agree,
    else downloaded, verified against the lock, converted and locked."""
    name, pinned = parse_spec(spec)
    entry = lookup(name)
    if entry.kind == "package":
        return _from_package(entry)
    if entry.kind == "licensed":
        return _licensed(entry)
    if entry.kind == "irds":
        return _from_ir_datasets(entry, quiet)
    requested = pinned or entry.revision
    key = lock_key(name, requested)
    known = read_lock().get(key)
    ready = _ready(entry, requested, known)
    if ready is not None:
        return ready
    if offline() and known is None:
        raise UserError(
            f"dataset {name}@{requested} is not cached and HF_HUB_OFFLINE is set: run "
            f"`groundcover data get {spec}` with network access first"
        )
    if not quiet:
        _announce(entry, f"{entry.home} @ {requested}")
    revision, raw = _hub_files(entry, requested, known, quiet)
    digests = {rel: file_digest(path) for rel, path in raw.items()}
    if pinned is None or pinned == entry.revision:  # another revision may differ by design
        _check_fingerprints(entry, requested, digests, raw)
    if known is not None:
        _verify(name, requested, known.get("files", {}), digests, raw)
    return _convert_and_lock(entry, key, revision, raw, digests)


def _convert_and_lock(
    entry: Dataset, key: str, revision: str, raw: dict[str, Path], digests: dict[str, str]
) -> Resolved:
    """Convert the published files, check the main file came out, lock every digest."""
    out = _convert(entry, revision, list(raw.values()))
    return _lock_converted(entry, key, revision, out, digests)


def _lock_converted(
    entry: Dataset, key: str, revision: str, out: Path, digests: dict[str, str]
) -> Resolved:
    main = out / (entry.main or next(iter(digests)).rsplit("/", 1)[-1])
    outputs = {p.name: file_digest(p) for p in sorted(out.iterdir()) if p.is_file()}
    if main.name not in outputs:
        shutil.rmtree(out)
        raise UserError(
            f"dataset {key}: the published files gave no {main.name} "
            f"(made: {', '.join(outputs) or 'nothing'})"
        )
    fetched = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    stamps = {name: list(stamp(out / name)) for name in outputs}
    write_lock_entry(
        key,
        {
            "home": entry.home,
            "revision": revision,
            "files": digests,
            "outputs": outputs,
            "stamps": stamps,
            "main": main.name,
            "fetched": fetched,
        },
    )
    return Resolved(entry.name, key.rsplit("@", 1)[1], revision, main, outputs[main.name])


def _ready(entry: Dataset, requested: str, known: dict[str, Any] | None) -> Resolved | None:
    """The converted files, if the lock lists them and they are there with their digests. A file
    whose size and mtime are those it was locked with is not hashed again (a command that names
    a 1.3 GB dataset pays no rehash); any other is."""
    if known is None:
        return None
    out = data_root() / entry.name / known["revision"]
    outputs = known.get("outputs") or {}
    if not outputs or not all((out / f).is_file() for f in outputs):
        return None
    stamps = known.get("stamps") or {}
    for file, digest in outputs.items():
        if stamps.get(file) == list(stamp(out / file)):
            continue
        if file_digest(out / file) != digest:
            raise UserError(
                f"{out / file}: sha256 differs from {data_root() / LOCK} ({entry.name}); the "
                f"cached copy was changed: remove {out} and get it again"
            )
    main = known["main"]
    return Resolved(entry.name, requested, known["revision"], out / main, outputs[main])


def _forget(raw: dict[str, Path], rel: str) -> None:
    for path in {raw[rel], raw[rel].resolve()}:  # the snapshot link and its blob
        path.unlink(missing_ok=True)


def _check_fingerprints(
    entry: Dataset, requested: str, digests: dict[str, str], raw: dict[str, Path]
) -> None:
    """The published size and sha256 of each fingerprinted file; a file that differs is removed
    and the get stops with one line naming both digests."""
    for rel, (size, digest) in entry.fingerprints.items():
        if rel not in raw:
            continue
        got = raw[rel].stat().st_size
        if (got, digests[rel]) != (size, digest):
            _forget(raw, rel)
            raise UserError(
                f"{entry.name}@{requested}: {rel}: sha256 {digests[rel]} ({got:,} bytes) differs "
                f"from the published sha256 {digest} ({size:,} bytes); nothing was cached"
            )


def _verify(
    name: str, requested: str, expected: dict[str, str], got: dict[str, str], raw: dict[str, Path]
) -> None:
    for rel, digest in got.items():
        if rel in expected and expected[rel] != digest:
            _forget(raw, rel)
            raise UserError(
                f"{name}@{requested}: {rel}: sha256 {digest[:12]}… differs from the locked "
                f"{expected[rel][:12]}… in {data_root() / LOCK}; nothing was cached (pin "
                f"another revision with {name}@REVISION)"
            )


def _convert(entry: Dataset, revision: str, raw: list[Any]) -> Path:
    """Into ``<name>/<revision>/`` through a temporary directory renamed at the end."""
    final = data_root() / entry.name / revision
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
    try:
        if entry.convert is not None:
            entry.convert(raw, tmp)
        else:
            for path in raw:  # as published: hard-linked (no second copy on disk) or copied
                try:
                    os.link(path.resolve(), tmp / path.name)
                except OSError:
                    shutil.copyfile(path, tmp / path.name)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---- homes -----------------------------------------------------------------------------------


def _hub_files(
    entry: Dataset, requested: str, known: dict[str, Any] | None, quiet: bool
) -> tuple[str, dict[str, Path]]:
    """(commit, repo path -> local file) from the Hub. A locked entry names its commit and
    files, so nothing is listed; otherwise the revision is resolved and the files matched."""
    import huggingface_hub as hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None
    cache = data_root() / "hub"
    try:
        if known is not None:
            commit, wanted = known["revision"], sorted(known["files"])
        else:
            info = hub.HfApi(endpoint=endpoint).dataset_info(
                entry.repo, revision=requested, files_metadata=True
            )
            commit = info.sha or requested
            sizes = {s.rfilename: s.size for s in info.siblings or []}
            wanted = _matching(entry, list(sizes))
            if not quiet:
                _announce_files(entry, info, {f: sizes[f] for f in wanted})
        files = {
            rel: Path(
                hub.hf_hub_download(
                    entry.repo,
                    rel,
                    repo_type="dataset",
                    revision=commit,
                    cache_dir=cache,
                    endpoint=endpoint,
                    local_files_only=offline(),
                )
            )
            for rel in wanted
        }
    except LocalEntryNotFoundError:
        raise UserError(
            f"dataset {entry.name}@{requested}: not in the cache and offline; get it online first"
        ) from None
    except (HfHubHTTPError, OSError) + http_errors() as exc:
        raise UserError(
            f"dataset {entry.name}@{requested} ({entry.home}): {first_line(exc)}; "
            "check the network, HF_ENDPOINT and HF_TOKEN"
        ) from None
    return commit, files


@functools.cache
def http_errors() -> tuple[type[Exception], ...]:
    """The HTTP client's base error (huggingface_hub uses httpx, packaged as httpx2 in some
    releases): an unreachable host is one line, not a traceback. Looked up when a download
    fails, not at import (httpx costs ``groundcover --help`` a tenth of a second)."""
    found: list[type[Exception]] = []
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(module).HTTPError)
    return tuple(found)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _matching(entry: Dataset, listed: list[str]) -> list[str]:
    wanted = [f for f in listed if any(fnmatch.fnmatch(f, p) for p in entry.files)]
    if not wanted:
        raise UserError(
            f"dataset {entry.name}: {entry.home} has no file matching {', '.join(entry.files)}"
        )
    return sorted(wanted)


def _announce(entry: Dataset, home: str) -> None:
    """What is about to be fetched, before any byte is: summary, home, licence, size, terms."""
    console.print(
        f"{entry.name}: {entry.summary}\n  home: {home}; license: {entry.license}; "
        f"size: {entry.size}",
        highlight=False,
    )
    if entry.notice:
        console.print(f"  terms: {entry.notice}", highlight=False)


def _announce_files(entry: Dataset, info: Any, sizes: dict[str, int | None]) -> None:
    card = getattr(info, "card_data", None)
    license_ = card.get("license") if card is not None else None
    total = sum(s or 0 for s in sizes.values())
    console.print(
        f"  dataset card license: {license_ or 'not stated'}; {len(sizes)} file(s), "
        f"{total / 1e6:.1f} MB to download",
        highlight=False,
    )
    for rel, size in list(sizes.items())[:12]:
        shown = "size not listed" if size is None else f"{size / 1e6:,.1f} MB"
        console.print(f"    {rel}: {shown}", highlight=False)
    if len(sizes) > 12:
        console.print(f"    ... and {len(sizes) - 12} more", highlight=False)


def _from_package(entry: Dataset) -> Resolved:
    """Files an installed package ships: no download; the package version is the revision. A
    converter (the FanOutQA Wikipedia pages) runs once per version, like a download's."""
    package = entry.repo
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise UserError(
            f"dataset {entry.name}: the {package} package is not installed (pip install {package})"
        )
    paths = {rel: Path(spec.origin).parent / rel for rel in entry.files}
    for path in paths.values():
        if not path.is_file():
            raise UserError(f"dataset {entry.name}: {path} is missing from the {package} package")
    from importlib.metadata import version

    revision = version(package)
    key = lock_key(entry.name, entry.revision)
    known = read_lock().get(key)
    if entry.convert is not None:
        current = known is not None and known["revision"] == revision
        if current and (ready := _ready(entry, entry.revision, known)) is not None:
            return ready
        digests = {rel: file_digest(path) for rel, path in paths.items()}
        return _convert_and_lock(entry, key, revision, paths, digests)
    [path] = paths.values()
    digest = file_digest(path)
    if known is not None and known["revision"] == revision and known["sha256"] != digest:
        raise UserError(f"{path}: sha256 differs from {data_root() / LOCK} ({entry.name})")
    if known is None or known["revision"] != revision:
        write_lock_entry(
            key, {"home": entry.home, "revision": revision, "sha256": digest, "path": str(path)}
        )
    return Resolved(entry.name, entry.revision, revision, path, digest)


def _from_ir_datasets(entry: Dataset, quiet: bool) -> Resolved:
    """Datasets of the ``ir_datasets`` library: it fetches the published files into its own
    cache (``IR_DATASETS_HOME``), checks their md5 and size, and parses them; the library's
    version is the revision, and the files it read are hashed into the lock like a download."""
    from importlib.metadata import version

    revision = f"ir_datasets-{version('ir_datasets')}"
    key = lock_key(entry.name, entry.revision)
    known = read_lock().get(key)
    current = known is not None and known["revision"] == revision
    if current and (ready := _ready(entry, entry.revision, known)) is not None:
        return ready
    if offline():
        raise UserError(
            f"dataset {entry.name} is not converted and HF_HUB_OFFLINE is set: "
            f"run `groundcover data get {entry.name}` with network access first"
        )
    if not quiet:
        _announce(entry, entry.home)
    import ir_datasets

    datasets, files = [], {}
    for name in entry.files:
        ident = f"{entry.repo}/{name}"
        try:
            dataset = ir_datasets.load(ident)
            files[f"{name}/queries"] = Path(dataset.queries_handler().queries_path())
            files[f"{name}/qrels"] = Path(dataset.qrels_handler().qrels_path())
        except Exception as exc:  # the library's download and lookup errors: one line
            raise UserError(
                f"dataset {entry.name}: ir_datasets could not provide {ident}: {first_line(exc)}"
            ) from None
        datasets.append(dataset)
    digests = {rel: file_digest(path) for rel, path in files.items()}
    out = _convert(entry, revision, datasets)
    return _lock_converted(entry, key, revision, out, digests)


def _licensed(entry: Dataset) -> Resolved:
    known = locked(entry.name, "local")
    if known is None:
        raise UserError(f"dataset {entry.name} is licensed and not registered: {entry.obtain}")
    path = Path(known["path"])
    if not path.exists():
        raise UserError(f"dataset {entry.name}: registered copy {path} is gone; `data add` again")
    return Resolved(entry.name, "local", known["revision"], path, known["sha256"])


def add(name: str, path: Path) -> Resolved:
    """Register a local copy (licensed corpora, or any dataset obtained another way) after
    checking its shape."""
    entry = lookup(name)
    path = path.resolve()
    if entry.check is not None:
        entry.check(path)
    elif not path.exists():
        raise UserError(f"{path}: not found")
    digest = file_digest(path) if path.is_file() else ""
    revision = f"local-{digest[:12]}" if digest else "local"
    write_lock_entry(
        lock_key(name, "local"),
        {"home": "local", "revision": revision, "sha256": digest, "path": str(path)},
    )
    return Resolved(name, "local", revision, path, digest)


def cached(name: str) -> Resolved | None:
    """The dataset if it is on disk already (no request, nothing written)."""
    entry = lookup(name)
    known = locked(name)
    if known is None:
        return None
    if "path" in known:  # a file used where it is (a package's, a registered copy)
        return Resolved(
            name, entry.revision, known["revision"], Path(known["path"]), known["sha256"]
        )
    return _ready(entry, entry.revision, known)


def provenance(paths: list[Path]) -> list[dict[str, str]]:
    """Which catalogued dataset each of ``paths`` is (for manifests): name, revision, sha256."""
    found = []
    lock = read_lock()
    for path in paths:
        resolved = path.resolve()
        for key, entry in sorted(lock.items()):
            name = key.rsplit("@", 1)[0]
            if "path" in entry:
                hit = Path(entry["path"]) == resolved
                digest = entry.get("sha256", "")
            else:
                folder = data_root() / name / entry["revision"]
                hit = resolved.parent == folder and resolved.name in entry.get("outputs", {})
                digest = entry.get("outputs", {}).get(resolved.name, "")
            if hit:
                found.append(
                    {
                        "path": str(path),
                        "dataset": name,
                        "requested": key.rsplit("@", 1)[1],
                        "revision": entry["revision"],
                        "sha256": digest,
                    }
                )
                break
    return found
