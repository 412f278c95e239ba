"""How many GPUs one replica of a model needs, from the model's own ``config.json``.

A replica holds the weights (parameters × bytes per parameter for the checkpoint's dtype or
quantisation: MXFP4 experts at 4.25 bits, FP8 at one byte, a GPTQ/AWQ checkpoint at its bits)
and the KV cache of at least one sequence at its context length (a sliding-window layer keeps
only its window). Split over ``t`` GPUs by tensor parallelism, each GPU holds a ``t``-th of both,
and vLLM may use ``utilisation`` of a GPU's memory (its ``--gpu-memory-utilization``, 0.9): the
smallest ``t`` that divides the attention heads and fits is the parallelism. vLLM's budget is
``utilisation`` of the GPU for everything the engine holds -- weights, KV cache, and its own
runtime (the CUDA context, NCCL's and cuBLAS's buffers, the activations of its profiling pass)
-- so each GPU keeps ``runtime_reserve`` of it for the runtime: what vLLM's own profile
reported for Llama-3-8B on an H100 (vllm-project/vllm#10511: 1.79 GiB outside PyTorch and
1.26 GiB of activations on one GPU, 3.58 and 1.26 a GPU at tensor parallelism 2), rounded up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
UTILISATION = 0.9  # vLLM's default --gpu-memory-utilization
DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float8_e4m3fn": 1.0,
    "fp8": 1.0,
    "int8": 1.0,
}
MXFP4_BITS = 4.25  # 4-bit values and one 8-bit scale per block of 32
RUNTIME_RESERVE_GIB = 3.5  # a GPU's share of vLLM's runtime, one GPU per replica
RUNTIME_RESERVE_PARALLEL_GIB = 5.0  # the same with tensor parallelism (NCCL's buffers)


def runtime_reserve(parallel: int) -> float:
    """Bytes of each GPU's vLLM budget that its runtime takes, beside weights and KV cache."""
    return (RUNTIME_RESERVE_GIB if parallel == 1 else RUNTIME_RESERVE_PARALLEL_GIB) * GIB


class SizingError(ValueError):
    """A model whose config cannot be read or understood: one line naming it."""


@dataclass(frozen=True)
class ModelSize:
    """What one replica of a model holds, in bytes, and how its heads may be split."""

    name: str
    parameters: int
    weight_bytes: int
    kv_bytes: int  # one sequence at max_model_len
    max_model_len: int
    heads: int
    kv_heads: int
    quantisation: str  # the dtype, or the quantisation method

    @property
    def needed(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def splits(self, parallel: int) -> bool:
        """Whether tensor parallelism ``parallel`` divides the heads as vLLM requires."""
        kv_ok = self.kv_heads % parallel == 0 or parallel % self.kv_heads == 0
        return self.heads % parallel == 0 and kv_ok

    def fits(self, parallel: int, gpu_bytes: float, utilisation: float) -> bool:
        budget = gpu_bytes * utilisation - runtime_reserve(parallel)
        return self.splits(parallel) and self.needed / parallel <= budget

    def smallest_parallelism(self, gpu_bytes: float, utilisation: float, most: int) -> int | None:
        """The fewest GPUs (at most ``most``) that hold one replica, or None."""
        for parallel in range(1, most + 1):
            if self.fits(parallel, gpu_bytes, utilisation):
                return parallel
        return None

    def text(self) -> str:
        """``65.2 GiB: weights 60.7 (MXFP4) + KV cache 4.5 at 131072 tokens``."""
        return (
            f"{self.needed / GIB:.1f} GiB: weights {self.weight_bytes / GIB:.1f} "
            f"({self.quantisation}) + KV cache {self.kv_bytes / GIB:.1f} at "
            f"{self.max_model_len} tokens"
        )


def size_of(config: dict[str, Any], name: str, max_model_len: int | None = None) -> ModelSize:
    """A model's size from its ``config.json`` (a multimodal config's ``text_config``)."""
    text = config.get("text_config") or config
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        vocab = int(text["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SizingError(
            f"{name}: its config.json has no {exc} (not a decoder's config?)"
        ) from None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
    intermediate = int(text.get("intermediate_size") or 4 * hidden)
    if experts:
        per_expert = int(text.get("moe_intermediate_size") or intermediate)
        shared = int(text.get("shared_expert_intermediate_size") or 0)
        expert_weights = experts * 3 * hidden * per_expert
        dense = hidden * experts + 3 * hidden * shared  # the router, a shared expert
    else:
        expert_weights, dense = 0, 3 * hidden * intermediate
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2)
    per_layer_dense = attention + dense
    parameters = embeddings + layers * (per_layer_dense + expert_weights)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    base = DTYPE_BYTES.get(dtype, 2.0)
    method, weight_bytes = _weights(
        config.get("quantization_config") or {},
        base,
        embeddings,
        layers * per_layer_dense,
        layers * expert_weights,
    )
    length = max_model_len or int(text.get("max_position_embeddings") or 4096)
    kv = _kv_bytes(text, layers, kv_heads, head_dim, length, base)
    return ModelSize(
        name, parameters, int(weight_bytes), kv, length, heads, kv_heads, method or dtype
    )


def _weights(
    quant: dict[str, Any], base: float, embeddings: int, dense: int, experts: int
) -> tuple[str | None, float]:
    """(the quantisation's name, the weights' bytes): embeddings stay at the dtype."""
    method = str(quant.get("quant_method") or "").lower() or None
    if method == "mxfp4":  # gpt-oss: the experts in MXFP4, attention and router in bf16
        return "MXFP4", embeddings * base + dense * base + experts * MXFP4_BITS / 8
    if method in ("fp8", "fbgemm_fp8"):
        return method.upper(), embeddings * base + (dense + experts) * 1.0
    if method == "compressed-tensors":  # its weights' bits per group: 8 (FP8, INT8) or 4 (W4A16)
        bits = _compressed_bits(quant)  # a scale per group of 128 below 8 bits
        grouped = 1.03 if bits < 8 else 1.0
        return method.upper(), embeddings * base + (dense + experts) * (bits / 8) * grouped
    if method == "modelopt":  # NVIDIA's: NVFP4 is 4-bit values and an FP8 scale per 16
        bits = 4.5 if "FP4" in str(quant.get("quant_algo") or "").upper() else 8.0
        return method.upper(), embeddings * base + (dense + experts) * bits / 8
    if method in ("gptq", "awq", "bitsandbytes"):
        # bitsandbytes says load_in_8bit / load_in_4bit, not bits
        eight = method == "bitsandbytes" and quant.get("load_in_8bit")
        bits = float(quant.get("bits") or quant.get("w_bit") or (8 if eight else 4))
        # a scale and a zero point per group of 128 weights
        return method.upper(), embeddings * base + (dense + experts) * (bits / 8) * 1.03
    return method, (embeddings + dense + experts) * base


def _compressed_bits(quant: dict[str, Any]) -> float:
    """The widest weights of a compressed-tensors config's groups (8 where none says)."""
    groups = quant.get("config_groups") or {}
    bits = [
        float((group.get("weights") or {}).get("num_bits") or 8)
        for group in groups.values()
        if isinstance(group, dict)
    ]
    return max(bits, default=8.0)


def _kv_bytes(
    text: dict[str, Any], layers: int, kv_heads: int, head_dim: int, length: int, base: float
) -> int:
    """One sequence's keys and values at ``length`` tokens; a sliding-window layer keeps its
    window only (gpt-oss alternates them: ``layer_types``)."""
    types = text.get("layer_types") or []
    window = int(text.get("sliding_window") or length)
    sliding = sum(1 for t in types if "sliding" in str(t))
    full = layers - sliding
    per_token_layer = 2 * kv_heads * head_dim * base
    return int(per_token_layer * (full * length + sliding * min(window, length)))


def read_config(model: str, source: str) -> tuple[dict[str, Any], str] | None:
    """(config, where it was read) of a model directory or hub id (``source``: the directory or
    the repository a preset names): the folder's file, else the Hugging Face cache, else the
    hub itself where this node reaches it; None where none is found."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        return (_load(path), str(path)) if path.is_file() else None
    if "/" not in source:
        return None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of vLLM and transformers
        return None
    cache = hub_cache()
    cached = try_to_load_from_cache(source, "config.json", cache_dir=cache)
    if isinstance(cached, str):
        return _load(Path(cached)), f"{source} (Hugging Face cache)"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        fetched = hf_hub_download(source, "config.json", cache_dir=cache)
    except Exception:  # gated, private, no network: the plan says it cannot size the model
        return None
    return _load(Path(fetched)), f"{source} (the hub)"


def hub_cache() -> str:
    """The Hugging Face cache as this process's environment names it now (the library reads
    it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return str(Path(home) / "hub")


def _load(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SizingError(f"{path}: not a readable config.json ({exc})") from None
    if not isinstance(found, dict):
        raise SizingError(f"{path}: not a JSON object")
    return found
