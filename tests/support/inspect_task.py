"""An inspect_ai evaluation whose answers are given: run with inspect_ai's own ``eval()`` (mockllm
model, no network), so the log it writes is exactly what inspect_ai writes. Each sample's
output is the answer given for its id; ``metadata`` carries the ids under other names.

    python tests/support/inspect_task.py LOG_DIR ANSWERS.json [METADATA_KEY]

ANSWERS.json: {"id": {"input": ..., "answer": ...}}. Prints the log file's path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(log_dir: str, answers_file: str, key: str | None = None) -> None:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessageAssistant, ModelOutput
    from inspect_ai.solver import solver

    answers = json.loads(Path(answers_file).read_text())

    @solver
    def given():
        async def solve(state, generate):
            text = answers[str(state.sample_id)]["answer"]
            state.output = ModelOutput.from_content("harness", text)
            state.messages.append(ChatMessageAssistant(content=text))
            return state

        return solve

    samples = [
        Sample(id=k, input=v["input"], target="", metadata={key: v[key]} if key else {})
        for k, v in answers.items()
    ]
    (log,) = inspect_eval(
        Task(dataset=samples, solver=given(), name="given-answers"),
        model="mockllm/model",
        log_dir=log_dir,
        display="none",
    )
    print(log.location)


if __name__ == "__main__":
    main(*sys.argv[1:])
