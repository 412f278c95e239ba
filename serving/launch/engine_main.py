"""vLLM's own entry points (its OpenAI server, ``run-batch``) as this launcher runs them: on a CPU
host with the one-process executor, the engine core is forked from the server, not spawned.

vLLM's server runs its engine core in a second process. vLLM forks it by default, but its CPU
platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for every process it starts, so on a CPU host
that process imports torch and vLLM all over again: the tiny Llama's server was up in 20.4 s and
20.4 CPU-s, against 12.9 and 12.9 forked (2 cores, measured side by side; same answers). The
spawn is there for vLLM's multiprocess executor, whose workers bind OpenMP threads to cores. With
the ``uni`` executor our CPU flags choose, the engine core starts no worker and runs the model
itself; the server has run no OpenMP region before the fork (one thread: ``CPU_ENV``), and a fork
at that point is what vLLM does on GPU hosts. Anything else keeps vLLM's choice: more than one
worker, another executor, or a method the user set.

``python -m groundcover.serving.launch.engine_main MODULE ARGS...`` runs ``python -m MODULE
ARGS...`` with that one change; a vLLM without the hook this needs runs unchanged.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
MODULES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.launchers.run_batch",
    "vllm.entrypoints.openai.run_batch",
)


def fork_one_process_engines() -> bool:
    """Wrap the CPU platform's config check so a one-process engine keeps vLLM's default
    (fork), or the method the environment gave; False where this vLLM has no such hook."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return False
    check = getattr(CpuPlatform.check_and_update_config, "__func__", None)
    if check is None:
        return False
    chosen = os.environ.get(METHOD_ENV)

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        check(cls, vllm_config)
        parallel = vllm_config.parallel_config
        if parallel.world_size == 1 and parallel.distributed_executor_backend == "uni":
            os.environ[METHOD_ENV] = chosen or "fork"

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    return True


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in MODULES:
        raise SystemExit(f"usage: engine_main {{{','.join(MODULES)}}} ARGS...")
    fork_one_process_engines()
    sys.argv = list(argv)  # what `python -m MODULE ARGS...` gives the module
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
