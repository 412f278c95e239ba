"""The vLLM engine of our Ray Serve LLM replicas: on a CPU node, the model in the engine's process.

Serve LLM runs vLLM's multiprocess executor on CPU nodes, so a replica is three processes: the
replica, vLLM's engine core and one worker that holds the model, each spawned and importing torch
and vLLM again (about 9 s of CPU each on 2 cores). With one worker there is nothing for the
multiprocess executor to coordinate: here the engine core runs the model itself (vLLM's ``uni``
executor), as ``vllm serve`` does with the CPU flags the plain launcher passes. GPU replicas, and
any replica with more than one worker, keep Serve LLM's executor.

Serve LLM loads this class by its path in each replica's ``RAYLLM_VLLM_ENGINE_CLS`` (set in the
replicas' runtime environment by ``serve_app.llm_config``): it is imported only in a replica.
"""

from __future__ import annotations

from typing import Any

from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

ONE_PROCESS = "uni"


class OneProcessEngine(VLLMEngine):
    """``VLLMEngine`` whose single CPU worker runs in the engine core's process."""

    def _prepare_engine_config(self, callback_ctx: Any) -> tuple[Any, Any, Any]:
        engine_args, frontend_args, config = super()._prepare_engine_config(callback_ctx)
        parallel = config.parallel_config
        if config.device_config.device_type == "cpu" and parallel.world_size == 1:
            parallel.distributed_executor_backend = ONE_PROCESS
            engine_args.distributed_executor_backend = ONE_PROCESS
        return engine_args, frontend_args, config
