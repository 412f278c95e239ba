"""Input readers every framework uses, each problem one line naming the file, the record and the
field: a whole text file (``read_text``), JSON Lines record by record (``iter_jsonl``) or
validated up front and read again on use (``read_jsonl``), and the content hash of loaded items
(``items_digest``: a run resumes only on the same inputs)."""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..store.lines import JsonlView, stamp
from .errors import UserError

M = TypeVar("M", bound=BaseModel)


def describe_validation(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(record)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {field}: {first['msg']}{more}"


def read_text(path: Path) -> str:
    """A whole text file; one clear line when it is missing or not UTF-8 (a BOM is fine)."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def iter_jsonl(path: Path, limit: int | None = None):
    """(line number, object) for each non-empty line; a bad line stops with one clear error."""
    for lineno, _, raw in _jsonl_lines(path, limit):
        yield lineno, raw


def _jsonl_lines(path: Path, limit: int | None = None):
    """(line number, byte offset, object) for each non-empty line."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    offset = 0
    with open(path, "rb") as handle:
        for lineno, raw_line in enumerate(handle, 1):
            if limit is not None and lineno > limit:
                return
            start, offset = offset, offset + len(raw_line)
            try:  # a leading BOM is tolerated; bytes that are not UTF-8 are one clear error
                line = raw_line.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"{path}:{lineno}: not UTF-8 text (byte {exc.start}): is this a JSONL file?"
                ) from exc
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            except RecursionError:  # deeper than the parser's stack: bad input, not a crash
                raise UserError(f"{path}:{lineno}: JSON nested too deeply") from None
            if not isinstance(raw, dict):
                raise UserError(f"{path}:{lineno}: record must be a JSON object")
            yield lineno, start, raw


def items_digest(items: Iterable[Any]) -> str:
    """Content hash of the items themselves (not the file): resumes only on the same inputs."""
    known = getattr(items, "digest", None)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for item in items:
        _hash_item(digest, item)
    return digest.hexdigest()[:16]


def _hash_item(digest: Any, item: BaseModel) -> None:
    digest.update(json.dumps(item.model_dump(), sort_keys=True, default=str).encode())


def read_jsonl(
    path: Path, record: type[M], id_field: str = "id", limit: int | None = None
) -> JsonlView[M]:
    """Validate every record up front; the first bad one stops everything with one clear line.

    The first ``limit`` records are kept as byte offsets and parsed again when used, so a
    100,000-item file costs a few bytes per item while it runs, not its text; the view's
    ``digest`` (see ``items_digest``) is computed in the same pass."""
    offsets, lines, ids = array("q"), array("q"), []
    seen: set[str] = set()
    digest = hashlib.sha256()
    validated = stamp(path) if path.is_file() else None  # before reading: a change while we do
    for lineno, offset, raw in _jsonl_lines(path):
        raw.setdefault(id_field, str(lineno))
        try:
            item = record.model_validate(raw)
        except ValidationError as exc:
            raise UserError(
                f"{path}:{lineno}: record {raw.get(id_field)!r}: {describe_validation(exc)}"
            ) from exc
        key = str(getattr(item, id_field))
        if key in seen:
            raise UserError(f"{path}:{lineno}: record {key!r}: duplicate {id_field}")
        seen.add(key)
        if limit is None or len(offsets) < limit:
            offsets.append(offset)
            lines.append(lineno)
            ids.append(key)
            _hash_item(digest, item)
    if not seen:
        raise UserError(f"{path}: no records")

    def parse(lineno: int, line: bytes) -> M:
        raw = json.loads(line.decode("utf-8-sig"))
        raw.setdefault(id_field, str(lineno))
        return record.model_validate(raw)

    view = JsonlView(path, offsets, parse, positions=lines, stamp=validated, ids=ids)
    view.digest = digest.hexdigest()[:16]
    return view
