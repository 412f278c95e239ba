"""How long each heavy part took to start: vLLM servers, Ray, Serve apps, model conversions.

Off unless ``GROUNDCOVER_START_LOG`` names a file; then each start appends one JSON line
(``kind``, ``name``, ``seconds``, and ``PYTEST_CURRENT_TEST`` when a test started it, which a
child process inherits). The test suite turns it on to say where its minutes go; a user can
turn it on to see what a run spends before its first request.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

ENV = "GROUNDCOVER_START_LOG"


def record(kind: str, name: str, seconds: float) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = {"kind": kind, "name": name, "seconds": round(seconds, 3), "pid": os.getpid()}
    if test := os.environ.get("PYTEST_CURRENT_TEST"):
        line["test"] = test.rsplit(" ", 1)[0]
    with contextlib.suppress(OSError), open(path, "a") as out:  # one short append per start
        out.write(json.dumps(line) + "\n")


@contextlib.contextmanager
def timed(kind: str, name: str) -> Iterator[None]:
    """Record the block's wall time under ``kind``/``name`` when it finishes without error."""
    began = time.monotonic()
    yield
    record(kind, name, time.monotonic() - began)
