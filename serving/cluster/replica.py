"""The replica class of our Ray Serve LLM apps: Serve LLM's own server, counting what it answers.

Serve routes each request to a replica; which one answered is not in the response. A run with
``--replicas N`` wants to know that the load spread (and a cluster user, where each replica ran),
so every replica counts its chat and completion requests and says where it runs when asked
(``served``, called on every replica by ``DeploymentHandle.broadcast``). Imported only inside
replicas and by the app's driver.
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve.llm import LLMServer


class CountedServer(LLMServer):
    """``LLMServer`` that counts the requests it answers."""

    answered = 0  # per replica: the first request sets the instance's own count

    async def chat(self, request: Any, raw_request_info: Any = None) -> Any:
        self.answered += 1
        return await super().chat(request, raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None) -> Any:
        self.answered += 1
        return await super().completions(request, raw_request_info)

    async def served(self) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node": node, "requests": self.answered}


try:  # Serve LLM's callback hooks (not exported by ray.serve.llm; present in the pinned 2.60)
    from ray.llm._internal.common.callbacks.base import CallbackBase
except ImportError:  # pragma: no cover - another Ray: its default node initialisation runs
    CallbackBase = None

if CallbackBase is not None:

    class NoMirrorDownload(CallbackBase):
        """Skips Serve LLM's per-node "download" task. Our configs name no cloud mirror, and
        without one that task only returns the model id it was given (vLLM itself fetches a hub
        model), yet it costs each replica a fresh Ray worker process: ~9 s of imports per start,
        measured on 2 cores."""

        async def on_before_node_init(self) -> None:
            self.ctx.run_init_node = False


# The path Serve LLM loads the callback by (None: keep its default).
NO_MIRROR_CALLBACK = None if CallbackBase is None else f"{__name__}:NoMirrorDownload"
