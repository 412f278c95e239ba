"""Serve's start on a loaded node: Serve waits a fixed 60 s for a new HTTP proxy
(``HTTP_PROXY_TIMEOUT``, no setting) and raises while the proxy is still coming up. The app's
start joins the controller Serve made and waits for the proxy for the run's own start timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from groundcover.serving.launch.server import free_port

# In a fresh interpreter (a local Ray of its own: what is tested is Serve started anew, which no
# running Serve app of the session would do): Serve's fixed wait set to 0 s stands for a node too
# loaded for its 60 s; every call of Serve's start is recorded.
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import ray
    from ray import serve
    from ray.serve._private import api
    from ray.serve._private.proxy_router import NO_ROUTES_MESSAGE
    from groundcover.serving.cluster import serve_app

    api.HTTP_PROXY_TIMEOUT = 0
    port, calls = int(sys.argv[1]), []

    class Recorded:
        def start(self, **options):
            try:
                serve.start(**options)
                calls.append("started")
            except TimeoutError as exc:
                calls.append(f"raised: {exc}")
                raise

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve_app._start_serve(Recorded(), "127.0.0.1", port)
        serve_app._proxy_up(f"http://127.0.0.1:{port}/v1", time.monotonic() + 180, 180)
        health = __import__("httpx").get(f"http://127.0.0.1:{port}/-/healthz", timeout=10)
        said = {"calls": calls, "health": [health.status_code, health.text]}
        print("RESULT " + json.dumps(said | {"no_routes": NO_ROUTES_MESSAGE}), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    """
)


def test_a_serve_start_past_serves_own_proxy_wait_joins_it_and_waits():
    pytest.importorskip("ray.serve", reason="needs ray[serve] (the engine extra)")
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(port)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(said[-1].removeprefix("RESULT "))
    # Serve gave up at its own wait, the start joined what it made, and Serve's proxy answers
    # (no app deployed yet: its health route says there are no routes)
    assert result["calls"] == ["raised: HTTP proxies not available after 0s.", "started"]
    assert result["health"] == [503, result["no_routes"]]
