"""Joining a Ray cluster, and noticing when it is gone.

A process connected to Ray is ended by Ray's own core about 60 s after the cluster's control
store (GCS) stops answering, with no exception to catch. So whatever waits on the cluster -- a
Ray Data NLI execution, the retries of a request to a Serve app -- asks ``cluster_gone()`` and
raises ``ClusterGone`` first: an ``EndpointError``, so the run stops the way it does for a dead
server (one ``error:`` line, whole records only, and the same command resumes later).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from serving.client import EndpointError

T = TypeVar("T")


class ClusterGone(EndpointError):
    """The Ray cluster stopped answering."""


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``auto``), or start a local Ray once."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        use_saved_token(address)
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, **kwargs)


def use_saved_token(address: str) -> None:
    """Ray 2.60 reads the token ``ray start`` saved (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``)
    only when it finds the cluster itself (``auto``); given an explicit address it must be told
    to, or the cluster refuses the connection. Ray's own helper does it (and refreshes the
    configuration it read at import)."""
    if address == "auto":
        return
    with contextlib.suppress(ImportError):  # other Ray versions: no token auth, nothing to do
        from ray._private.authentication import authentication_token_setup as auth

        auth.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def unreachable(gcs_address: str, timeout: float = 1.0) -> str | None:
    """Why the cluster whose GCS listens at ``host:port`` is unreachable; None while it answers."""
    host, _, port = gcs_address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        return f"the Ray cluster at {gcs_address} is gone ({getattr(exc, 'strerror', None) or exc})"
    return None


def cluster_gone(timeout: float = 1.0) -> str | None:
    """``unreachable`` for the cluster this process joined (None when it joined none)."""
    import ray

    if not ray.is_initialized():
        return None
    return unreachable(ray.get_runtime_context().gcs_address, timeout)


def while_cluster_lives(work: Callable[[], T], grace: float = 5.0, poll: float = 0.5) -> T:
    """``work()`` in a daemon thread; its result, or ``ClusterGone`` once the cluster has been
    unreachable for ``grace`` seconds (the thread, blocked inside Ray, is left behind)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="ray-work", daemon=True)
    thread.start()
    lost_since: float | None = None
    while thread.is_alive():
        thread.join(poll)
        if not thread.is_alive():
            break
        reason = cluster_gone()
        if reason is None:
            lost_since = None
        elif lost_since is None:
            lost_since = time.monotonic()
        elif time.monotonic() - lost_since >= grace:
            raise ClusterGone(f"{reason}; the run directory is resumable")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
