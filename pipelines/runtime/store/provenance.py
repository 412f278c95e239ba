"""What a run's numbers rest on, by content: the inputs its options name and what changed since.

Options declare in their type which fields are content (``InputFile``, ``InputDir``,
``IndexDir``, ``ModelName``: ``Annotated`` with ``Content``) and which path-like fields are not,
with the reason (``NotContent``). ``input_records`` digests every content field of a run's
options (``serving.content``: streamed once, then a stat per file); the records enter the run's
identity and its manifest. ``unmarked_fields`` is the contract every options model passes: a path
field, or a field naming a model, that is neither content nor exempt is a defect.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from ....serving.content import NotAsRecorded, digest_as_recorded, digest_path, model_content
from ..contract.errors import UserError


@dataclass(frozen=True)
class Content:
    """An options field whose content a score rests on. ``kind``: a ``file``, a ``dir``, an
    ``index`` directory (with the encoder its manifest names), or a ``model`` (a checkpoint
    directory or a hub id; ``resolve`` maps a name such as ``default`` to its path first)."""

    kind: Literal["file", "dir", "index", "model"] = "file"
    resolve: Callable[[str], str | None] | None = None


@dataclass(frozen=True)
class NotContent:
    """A path-like options field a score does not rest on, and why."""

    reason: str


InputFile = Annotated[Path, Content("file")]
InputDir = Annotated[Path, Content("dir")]
IndexDir = Annotated[Path, Content("index")]
ModelName = Annotated[str, Content("model")]

# names of fields that point at something outside the options (a model, a file): such a field
# must say whether it is content, whatever its type
_POINTING = ("model", "tokenizer", "reranker", "encoder", "checkpoint", "extractor", "bleurt")


def markers(annotation: Any) -> list[Content | NotContent]:
    """The ``Content``/``NotContent`` markers in a field's type, through ``X | None``."""
    found: list[Content | NotContent] = []
    if typing.get_origin(annotation) is Annotated:
        found += [m for m in annotation.__metadata__ if isinstance(m, Content | NotContent)]
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found += markers(arg)
    return found


def field_markers(model: type[BaseModel], name: str) -> list[Content | NotContent]:
    field = model.model_fields[name]
    direct = [m for m in field.metadata if isinstance(m, Content | NotContent)]
    return direct + markers(field.annotation)


def _mentions_path(annotation: Any) -> bool:
    if annotation is Path:
        return True
    return any(_mentions_path(arg) for arg in typing.get_args(annotation))


def _nested(annotation: Any) -> list[type[BaseModel]]:
    """The options models a field holds (a reproduce command's framework options)."""
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def unmarked_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Fields of ``model`` (nested options included) that name a path or a model and are neither
    ``Content`` nor ``NotContent``: each one could change a score unseen."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        nested = _nested(field.annotation)
        if nested:
            for inner in nested:
                out += unmarked_fields(inner, f"{prefix}{name}.")
            continue
        pointing = _mentions_path(field.annotation) or name.rstrip("s").endswith(_POINTING)
        if pointing and not field_markers(model, name):
            out.append(f"{model.__name__}.{prefix}{name}")
    return out


def _content_fields(options: BaseModel, prefix: str = "") -> Iterator[tuple[str, Content, Any]]:
    for name in type(options).model_fields:
        value = getattr(options, name)
        if isinstance(value, BaseModel):
            yield from _content_fields(value, f"{prefix}{name}.")
            continue
        for marker in field_markers(type(options), name):
            if isinstance(marker, Content) and value is not None:
                yield f"{prefix}{name}", marker, value
                break


def content_fields(options: BaseModel) -> list[tuple[str, Content, Any]]:
    """Every content field of ``options`` that is set, nested options included: (dotted name,
    its marker, its value) -- what a run reads beyond its items (``groundcover cluster``)."""
    return list(_content_fields(options))


def without_input_paths(dump: dict[str, Any], options: BaseModel) -> dict[str, Any]:
    """``dump`` (the options as JSON) without the paths of the files and directories whose
    digests the identity holds: where an input lives is not what a score rests on. Models
    stay named (a name is what an unresolved hub id has)."""
    out = dict(dump)
    for name, marker, _ in _content_fields(options):
        if marker.kind == "model":
            continue
        *parents, leaf = name.split(".")
        target: Any = out
        for part in parents:
            if not isinstance(target.get(part), dict):
                break
            target[part] = dict(target[part])
            target = target[part]
        else:
            target.pop(leaf, None)
    return out


def input_records(options: Any, models: bool = True) -> dict[str, dict[str, Any]]:
    """Every content input of ``options`` by field name: ``{"path", "sha256", "size", "files",
    "kind"}`` (a model that is no local path: its hub commit, or ``unresolved``). ``models``:
    False leaves the models out (a run's item text rests on its files alone, and a model a
    received run names would be looked up on the Hub, or a folder of the reader's hashed)."""
    if not isinstance(options, BaseModel):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, marker, value in _content_fields(options):
        if models or marker.kind != "model":
            out[name] = _record(name, marker, value)
    return out


def _record(name: str, marker: Content, value: Any) -> dict[str, Any]:
    if marker.kind == "model":
        given = str(value)
        source = (marker.resolve(given) if marker.resolve else None) or given
        found = model_content(source)
        described = {"kind": "model", "name": given, "sha256": found.get("revision")}
        return described | {k: v for k, v in found.items() if k != "revision"}
    path = Path(value)
    try:
        digest = digest_path(path)
    except FileNotFoundError:
        raise UserError(f"--{name.replace('_', '-')}: {path}: no such file or directory") from None
    except OSError as exc:
        raise UserError(f"--{name.replace('_', '-')}: {path}: unreadable ({exc})") from None
    sha = digest.sha256
    record: dict[str, Any] = {"kind": marker.kind, "path": str(path)}
    if marker.kind == "index":
        encoder = _index_encoder(path)
        if encoder is not None:  # outside the index: its weights are part of what it returns
            sha = hashlib.sha256(f"{sha}\0{encoder['sha256']}".encode()).hexdigest()
            record["encoder"] = encoder
    return record | {"sha256": sha, "size": digest.size, "files": digest.files}


def _index_encoder(index: Path) -> dict[str, Any] | None:
    """The dense encoder an index's manifest names, when it lives outside the index."""
    try:
        manifest = json.loads((index / "manifest.json").read_text())
        model_path = Path(manifest["dense"]["model_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not model_path.exists() or model_path.resolve().is_relative_to(index.resolve()):
        return None
    return {"path": str(model_path), "sha256": digest_path(model_path).sha256}


def unlike_recorded(options: Any, recorded: dict[str, dict[str, Any]]) -> list[str]:
    """The file and folder inputs of ``options`` that are not what the run recorded of them
    (``recorded``: its manifest's inputs), each by name, with why where it is more than another
    SHA-256. What a received run recorded is the sender's word: each path is first walked
    without reading (``digest_as_recorded``), and read no further than the size recorded."""
    fields = {
        name: value for name, marker, value in _content_fields(options) if marker.kind != "model"
    }
    files = {k: v for k, v in recorded.items() if v.get("kind") != "model"}
    out: list[str] = []
    for name in sorted(set(fields) | set(files)):
        if name not in fields or name not in files:
            out.append(f"{name} (recorded {'without' if name in fields else 'with'} a path)")
            continue
        why = _unlike(Path(fields[name]), files[name])
        if why is not None:
            out.append(f"{name} ({why})" if why else name)
    return out


def _unlike(path: Path, record: dict[str, Any]) -> str | None:
    """Why ``path`` is not what ``record`` says (``""``: another SHA-256), or None."""
    size, files, sha = record.get("size"), record.get("files"), record.get("sha256")
    counts = [n for n in (size, files) if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    if len(counts) != 2 or not isinstance(sha, str):
        return "no size, file count and SHA-256 recorded"
    encoder = record.get("encoder")
    outside = encoder.get("sha256") if isinstance(encoder, dict) else None

    def matches(digest: str) -> bool:
        if isinstance(outside, str):  # an index whose encoder lives outside it (``_record``)
            digest = hashlib.sha256(f"{digest}\0{outside}".encode()).hexdigest()
        return digest == sha

    try:
        digest_as_recorded(path, counts[0], counts[1], matches)
    except NotAsRecorded as exc:
        return str(exc)
    return None


def input_digests(records: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """What of the input records is identity: the digest of each."""
    return {name: record.get("sha256") for name, record in sorted(records.items())}


def short(digest: Any) -> str:
    text = str(digest) if digest is not None else "none"
    return text.removeprefix("sha256:")[:12]


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two run identities, each as ``what old → new`` (inputs and models
    by digest first, then any other option), for the one line that refuses a changed run."""
    changes: list[str] = []
    old_content, new_content = old.get("content") or {}, new.get("content") or {}
    for part, label in (("inputs", "input"), ("models", "model")):
        before, after = old_content.get(part) or {}, new_content.get(part) or {}
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                changes.append(
                    f"{label} {name} {_digests(before.get(name))} → {_digests(after.get(name))}"
                )
    for key in sorted(set(old) | set(new)):
        if key in ("content", "items") or old.get(key) == new.get(key):
            continue
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
            inner = [
                k
                for k in sorted(set(old[key]) | set(new[key]))
                if old[key].get(k) != new[key].get(k)
            ]
            changes += [f"{key}.{k} {old[key].get(k)!r} → {new[key].get(k)!r}" for k in inner]
        else:
            changes.append(f"{key} {old.get(key)!r} → {new.get(key)!r}")
    return changes


def _digests(value: Any) -> str:
    if isinstance(value, dict):  # a role's model: base and adapter
        return "/".join(f"{k}:{short(v)}" for k, v in sorted(value.items()))
    return short(value) if value is not None else "absent"


# ---- shown: report, the HTML page, compare -----------------------------------------------------


def manifest_provenance(manifest: Any) -> dict[str, Any]:
    """What a recorded run rests on, from its manifest: whether its inputs were fingerprinted
    (and since when, for a run made before), every input by digest, every role's model and
    adapter by revision and where it was served."""
    content = (manifest.config or {}).get("content")
    fingerprinted = content is not None and manifest.inputs_fingerprinted is not False
    inputs = [
        {
            "name": name,
            "path": record.get("path") or record.get("name"),
            "sha256": record.get("sha256"),
            "size": record.get("size"),
            "kind": record.get("kind"),
        }
        for name, record in sorted((manifest.inputs or {}).items())
    ]
    models = []
    for role, record in sorted((manifest.roles or {}).items()):
        found = record.get("content") or {}
        base = found.get("base") or {}
        row = {
            "role": role,
            "model": record.get("model"),
            "revision": base.get("revision"),
            "source": base.get("source"),
            "served": record.get("endpoint"),
        }
        adapter = record.get("adapter")
        if adapter:
            row["adapter"] = adapter
            row["adapter_revision"] = ((found.get("adapters") or {}).get(adapter) or {}).get(
                "revision"
            )
        models.append(row)
    out: dict[str, Any] = {"fingerprinted": fingerprinted, "inputs": inputs, "models": models}
    if content is None:
        out["note"] = "made before inputs and models were fingerprinted: they are known by name"
    elif manifest.inputs_fingerprinted is False:
        out["note"] = (
            "made before inputs and models were fingerprinted; known by content since it was "
            "resumed"
        )
        out["since"] = manifest.fingerprinted_since
    return out


def provenance_differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between two runs' provenance (``manifest_provenance``): each as ``{"what",
    "a", "b"}`` -- an input by digest, a role's model or adapter by name or revision
    (``absent`` where one run has none)."""
    out: list[dict[str, Any]] = []

    def differ(what: str, x: Any, y: Any) -> None:
        out.append({"what": what, "a": _or_absent(x), "b": _or_absent(y)})

    inputs_a = {i["name"]: i["sha256"] for i in a["inputs"]}
    inputs_b = {i["name"]: i["sha256"] for i in b["inputs"]}
    for name in sorted(set(inputs_a) | set(inputs_b)):
        if inputs_a.get(name) != inputs_b.get(name):
            differ(
                f"input {name}",
                short_or_none(inputs_a.get(name)),
                short_or_none(inputs_b.get(name)),
            )
    models_a = {m["role"]: m for m in a["models"]}
    models_b = {m["role"]: m for m in b["models"]}
    for role in sorted(set(models_a) | set(models_b)):
        x, y = models_a.get(role) or {}, models_b.get(role) or {}
        for name, key in (("model", "revision"), ("adapter", "adapter_revision")):
            if x.get(name) != y.get(name):
                differ(f"{role} {name}", x.get(name), y.get(name))
            elif x.get(key) != y.get(key):  # the same name: a retrained adapter, a new model
                differ(
                    f"{role} {name} {x.get(name)}",
                    short_or_none(x.get(key)),
                    short_or_none(y.get(key)),
                )
    if not a["fingerprinted"] or not b["fingerprinted"]:
        differ("inputs fingerprinted", a["fingerprinted"], b["fingerprinted"])
    return out


def short_or_none(digest: Any) -> str | None:
    return None if digest is None else short(digest)


def _or_absent(value: Any) -> Any:
    return "absent" if value is None else value
