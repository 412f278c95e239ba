"""The models a cluster job reads, fetched on a login node and checked on an offline compute
node (``groundcover cluster prefetch`` / ``check-offline``; the datasets are the CLI's).

Fetched into ``HF_HOME`` (the Hugging Face cache every node reads): each hub repository
(without the checkpoint copies vLLM never reads: Meta's ``original/``, gpt-oss's ``metal/``;
a gated one with the user's token: ``hf auth login`` or ``HF_TOKEN``) and gpt-oss's tiktoken
files, checked against their published sha256, into ``tiktoken_folder()`` -- the one folder the
job hands vLLM as ``TIKTOKEN_ENCODINGS_BASE``. A directory given by path is checked, never
copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..files import make_dirs, write_atomic

# a preset's repository holds copies the engine never reads: Meta's original checkpoints
# (doubling a Llama's size) and gpt-oss's Metal build
SKIPPED = ["original/*", "metal/*"]
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/"
# the files gpt-oss's tokenizer (openai_harmony) reads from TIKTOKEN_ENCODINGS_BASE, by sha256
TIKTOKEN_FILES = {
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base.tiktoken": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}


@dataclass(frozen=True)
class Needed:
    """One thing a job reads: ``kind`` hub | directory | tiktoken | dataset | file; ``label``
    what it is for (``judge``, ``role judge``, ``NLI checkpoint``, ``adapter claims``)."""

    kind: str
    label: str
    what: str
    revision: str | None = None

    def as_json(self) -> dict[str, str]:
        found = {"kind": self.kind, "for": self.label, "name": self.what}
        return found | ({"revision": self.revision} if self.revision else {})


def tiktoken_folder() -> Path:
    """Where gpt-oss's tiktoken files live for a job: ``$HF_HOME/tiktoken-encodings`` (the
    Hugging Face cache's default home without ``HF_HOME``). The one place prefetch writes, the
    check reads, and the Slurm job and the RayJob hand to vLLM."""
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "tiktoken-encodings"


def model_needs(label: str, model: str, revision: str | None = None) -> list[Needed]:
    """What a model string needs on a node: its hub repository or its directory, and gpt-oss's
    tiktoken files for a gpt-oss model; nothing for the embedded model (a package's file)."""
    from ..launch.registry import UnknownModelError, resolve

    if Path(model).expanduser().is_dir() or model.startswith(("/", "./", "../", "~")):
        found = [Needed("directory", label, str(Path(model).expanduser()))]
        name = Path(model).name
    else:
        try:
            preset = resolve(model)
        except UnknownModelError:
            return []  # a name an endpoint serves: nothing to fetch here
        if preset.name == "embedded":
            return []
        found = [Needed("hub", label, preset.hub_id, revision)]
        name = preset.hub_id
    if "gpt-oss" in name.lower() or gpt_oss_config(found[0]):
        found += [Needed("tiktoken", f"gpt-oss tokenizer file {f}", f) for f in TIKTOKEN_FILES]
    return found


def gpt_oss_config(need: Needed) -> bool:
    """Whether the model's config says gpt-oss (``model_type`` ``gpt_oss``: what vLLM reads to
    speak harmony, whose tokenizer files an offline node must have), whatever its folder or
    repository is called: a folder's config.json, or a hub model's in the cache (never fetched
    here)."""
    if need.kind == "directory":
        path: Path | None = Path(need.what) / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        from .sizing import hub_cache

        cached = try_to_load_from_cache(need.what, "config.json", cache_dir=hub_cache())
        path = Path(cached) if isinstance(cached, str) else None
    try:
        config = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "gpt_oss"


def fetch(need: Needed) -> tuple[bool, str]:
    """(fetched, what was done or why not) for a hub repository, directory or tiktoken file."""
    if need.kind in ("directory", "file"):
        why = check(need)
        return why is None, why or f"{need.label}: {need.what} (on its path)"
    if need.kind == "hub":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            path = snapshot_download(need.what, revision=need.revision, ignore_patterns=SKIPPED)
        except GatedRepoError:
            return False, (
                f"{need.label}: {need.what} is gated: accept its licence at "
                f"https://huggingface.co/{need.what} and log in (`hf auth login`, or HF_TOKEN) "
                "before fetching"
            )
        except RepositoryNotFoundError:
            return False, f"{need.label}: {need.what}: no such repository (or private: log in)"
        return True, f"{need.label}: {need.what} in {path}"
    if need.kind == "tiktoken":
        folder = tiktoken_folder()
        make_dirs(folder)
        base = os.environ.get("GC_TIKTOKEN_URL") or TIKTOKEN_URL
        with urllib.request.urlopen(base + need.what, timeout=120) as answer:
            body = answer.read()
        published = TIKTOKEN_FILES[need.what]
        if base == TIKTOKEN_URL and hashlib.sha256(body).hexdigest() != published:
            return False, f"{need.label}: the download's sha256 is not the published one; not kept"
        write_atomic(folder / need.what, body)
        return True, f"{need.label}: {folder / need.what}"
    raise ValueError(f"not a model's need: {need.kind}")


def check(need: Needed) -> str | None:
    """Why this node cannot use it offline (None: it can)."""
    if need.kind == "file":
        return (
            None if Path(need.what).exists() else f"{need.label}: {need.what} is not on this node"
        )
    if need.kind == "directory":
        path = Path(need.what)
        if not path.is_dir():
            return f"{need.label}: the directory {path} is not on this node"
        if not any(path.glob("*.json")):
            return f"{need.label}: {path} holds no config (adapter_config.json / config.json)"
        return None
    if need.kind == "hub":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        home = os.environ.get("HF_HOME", "~/.cache/huggingface")
        try:
            folder = snapshot_download(
                need.what,
                revision=need.revision,
                local_files_only=True,
                ignore_patterns=SKIPPED,
            )
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            return f"{need.label}: {need.what} is not in the Hugging Face cache ({home})"
        lacking = missing_weights(Path(folder))
        if lacking:
            return f"{need.label}: {need.what} in the Hugging Face cache ({home}) {lacking}"
        return None
    if need.kind == "tiktoken":
        if not (tiktoken_folder() / need.what).is_file():
            return f"{need.label}: not in {tiktoken_folder()}"
        return None
    raise ValueError(f"not a model's need: {need.kind}")


WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def missing_weights(folder: Path) -> str | None:
    """What a cached snapshot lacks of its weights, or None. A snapshot can hold a config alone
    (``cluster plan`` reads a hub model's config.json to size it, and Hugging Face's cache then
    has the repository without its weights), and without a cached listing of the repository's
    files the hub's own offline lookup takes that for the whole model."""
    index = sorted(folder.glob("*.index.json"))
    for path in index:
        try:
            shards = set(json.loads(path.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return f"has an unreadable {path.name}"
        absent = sorted(s for s in shards if not (folder / s).is_file())
        if absent:
            more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
            return f"lacks {absent[0]}{more} of the weights {path.name} names"
    if not any(p.is_file() for pattern in WEIGHTS for p in folder.glob(pattern)):
        return "holds no weights (a config alone): groundcover cluster prefetch"
    return None
