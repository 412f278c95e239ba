"""A comprehensiveness run (scripted LLM, NLI method) whose cross-encoder scores on a Ray cluster,
run the way the CLI runs a command (``clean_errors``: one line and an exit code). For the
cluster-gone test, which kills the cluster under it, and the Ray job test, which submits it.

    python -m tests.support.ray_gone ITEMS RUN_DIR NLI_MODEL ADDRESS|local [PLACEMENT]

PLACEMENT: ``bulk`` (one plain Ray actor, the default) or a JSON object of NLI placement options
(``pipelines.runtime.execution.nli_placement``), e.g. ``{"nli_replicas": 2, "nli_wait": 10}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def placement(spec: str) -> dict:
    return {"nli_replicas": 1, "nli_bulk": True} if spec == "bulk" else json.loads(spec)


def main(items: str, run_dir: str, nli_model: str, address: str, where: str = "bulk") -> None:
    from groundcover.pipelines.cli.options import clean_errors
    from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions
    from groundcover.pipelines.comprehensiveness.framework import COMPREHENSIVENESS
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.execute import execute, fixed_client
    from tests.support.scripted import ScriptedClient
    from tests.test_exact_scores import NLI_SCRIPTS

    on_ray = address != "local"
    options = ComprehensivenessOptions(
        input=Path(items),
        method="nli",
        protocol="spec",
        nli_backend="cross-encoder",
        nli_model=nli_model,
        export_graphs=False,
        **(placement(where) if on_ray else {}),
    )
    evaluator = EvaluatorConfig(
        model="judge",
        endpoint="http://127.0.0.1:9/v1",
        concurrency=8,
        ray_address=address if on_ray else None,
    )
    client = ScriptedClient({k: v for k, v in NLI_SCRIPTS.items() if k != "nli"})
    request = RunRequest(evaluator, RunConfig(run_dir=Path(run_dir), cache=None), options)

    @clean_errors
    def run() -> None:
        execute(
            COMPREHENSIVENESS, request, quiet=True, open_client=lambda ev, d: fixed_client(client)
        )

    try:
        run()
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)


if __name__ == "__main__":
    main(*sys.argv[1:6])
