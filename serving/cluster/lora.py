"""LoRA adapters on Ray Serve LLM replicas, read from paths instead of cloud storage.

Serve LLM routes a request for ``BASE:ADAPTER`` to a replica that has the adapter loaded (its
multiplexing), and the replica's loader fetches the adapter the first time. The stock loader only
downloads from S3 / GCS / Azure; ours resolves the adapter name to a directory every replica can
read (the local adapter registry on one machine, a shared file system on a cluster), given in the
replicas' environment as JSON. Everything else -- routing, loading into vLLM, eviction -- is
Serve's own. Imported only inside replicas and when adapters are served.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import HTTPException
from ray.llm._internal.common.models import global_id_manager
from ray.llm._internal.common.utils.lora_utils import get_lora_id
from ray.llm._internal.serve.core.configs.llm_config import DiskMultiplexConfig
from ray.llm._internal.serve.utils.lora_serve_utils import LoraModelLoader

from .replica import CountedServer

ADAPTERS_ENV = "GROUNDCOVER_SERVE_ADAPTERS"  # {"name": "/path/to/adapter", ...}


class PathAdapterLoader(LoraModelLoader):
    """``load_model_from_config`` for adapters named in ``ADAPTERS_ENV``; nothing is copied."""

    async def load_model_from_config(self, lora_model_id: str, llm_config: Any):
        if lora_model_id in self.disk_cache:
            return self.disk_cache[lora_model_id]
        paths = json.loads(os.environ.get(ADAPTERS_ENV, "{}"))
        name = get_lora_id(lora_model_id)
        if name not in paths:  # a client error, answered at once (vLLM says 404 too)
            raise HTTPException(
                404, f"adapter {name!r} does not exist here (served: {', '.join(sorted(paths))})"
            )
        config = DiskMultiplexConfig(
            model_id=lora_model_id,
            max_total_tokens=None,
            local_path=paths[name],
            lora_assigned_int_id=global_id_manager.next(),
        )
        self.disk_cache[lora_model_id] = config
        return config


class AdapterServer(CountedServer):
    """Our counting server with the path loader."""

    async def __init__(  # type: ignore[misc]  # Serve LLM's servers have an async __init__
        self,
        llm_config: Any,
        *,
        engine_cls: Any = None,
        model_downloader: Any = None,
    ):
        await super().__init__(
            llm_config,
            engine_cls=engine_cls,
            model_downloader=model_downloader or PathAdapterLoader,
        )
