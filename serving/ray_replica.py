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
