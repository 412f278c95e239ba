"""Trained LoRA adapters: registered by name under ``$GROUNDCOVER_HOME/adapters/<name>`` and
checked against the model that serves them (base model, rank) before a server starts."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..files import write_atomic

MAX_SERVED_RANK = 512  # the largest --max-lora-rank vLLM accepts
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class AdapterError(ValueError):
    pass


def home() -> Path:
    root = os.environ.get("GROUNDCOVER_HOME") or Path.home() / ".cache" / "groundcover"
    return Path(root) / "adapters"


def adapter_config(path: Path | str) -> dict[str, Any]:
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        raise AdapterError(f"{path}: not a LoRA adapter directory (no adapter_config.json)")
    try:
        return json.loads(config.read_text())
    except json.JSONDecodeError as exc:
        raise AdapterError(f"{config}: not valid JSON: {exc.msg}") from exc


def rank_of(path: Path | str) -> int | None:
    rank = adapter_config(path).get("r")
    return int(rank) if isinstance(rank, int) else None


def registered(name: str) -> Path | None:
    path = home() / name
    return path if (path / "adapter_config.json").is_file() else None


def register(name: str, source: Path | str, *, replace: bool = False) -> Path:
    """Copy a trained adapter directory (adapter files and card) under the registry."""
    if not name or set(name) - _NAME_OK or name.startswith("."):
        raise AdapterError(f"adapter name {name!r}: use letters, digits, '-', '_' and '.'")
    config = adapter_config(source)
    target = home() / name
    if target.exists() and not replace:
        raise AdapterError(f"adapter {name!r} is already registered at {target} (use --replace)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    keep = {"adapter_config.json", "adapter_model.safetensors", "card.json", "README.md"}
    for item in Path(source).iterdir():
        if item.is_file() and (item.name in keep or item.name.startswith("tokenizer")):
            shutil.copy2(item, staging / item.name)
    registered = {
        "name": name,
        "source": str(Path(source).resolve()),
        "base": config.get("base_model_name_or_path"),
        "rank": config.get("r"),
    }
    write_atomic(staging / "registered.json", json.dumps(registered, indent=1), within=staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)  # the registry never holds a half-copied adapter
    return target


def listing() -> list[dict[str, Any]]:
    out = []
    for path in sorted(home().glob("*/registered.json")):
        out.append(json.loads(path.read_text()) | {"path": str(path.parent)})
    return out


def check_base(name: str, path: Path | str, served: set[str]) -> None:
    """Refuse an adapter trained on another base model than the one served. ``served`` holds
    the names the served model goes by (preset name, hub id, directory)."""
    base = adapter_config(path).get("base_model_name_or_path")
    if not base:
        return  # the adapter does not say: nothing to check
    names = {s for s in served if s}
    aliases = (
        names
        | {Path(s).name for s in names}
        | {str(Path(s).resolve()) for s in names if Path(s).exists()}
    )
    if base in aliases or Path(base).name in aliases:
        return
    raise AdapterError(
        f"adapter {name!r} was trained on {base!r}, not on the served model {sorted(names)[0]!r}"
    )


def check_rank(name: str, rank: int) -> None:
    if rank > MAX_SERVED_RANK:
        raise AdapterError(
            f"adapter {name!r} has rank {rank}, above the server's limit ({MAX_SERVED_RANK})"
        )
