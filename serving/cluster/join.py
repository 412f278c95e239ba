"""Joining a Ray cluster, and noticing when it is gone.

A process connected to Ray is ended by Ray's own core about 60 s after the cluster's control
store (GCS) stops answering, with no exception to catch. So whatever waits on the cluster -- a
call to the NLI actors, the retries of a request to a Serve app -- asks ``cluster_gone()`` and
raises ``ClusterGone`` first: an ``EndpointError``, so the run stops the way it does for a dead
server (one ``error:`` line, whole records only, and the same command resumes later).

Both Ray drivers (the NLI scorer's, the Serve app's) run in a ``DriverChild``, so what Ray ends
is that child, never the run.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from ..client import EndpointError
from ..launch.startlog import timed
from ..redact import clipped

T = TypeVar("T")


class ClusterGone(EndpointError):
    """The Ray cluster stopped answering."""


# The Ray node a driver child joins: its parent's, when the parent runs in Ray (set in the child).
_parent_node_ip: str | None = None


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``auto``), or start a local Ray once."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        use_saved_token(address)
        if _parent_node_ip:
            kwargs["_node_ip_address"] = _parent_node_ip
        with timed("ray-join", address):
            ray.init(address=address, **kwargs)
    else:
        # Serve kills a proxy not ready within 5 s of its start and starts another, and a
        # deployment waiting on the first fails with its death; on a loaded machine a worker's
        # imports alone take longer (seen: every Serve app of a test module lost this way). The
        # local Ray's processes inherit this from ours; a cluster's nodes take theirs.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        with timed("ray-local", f"{num_cpus or 'all'} CPUs"):
            start_local(lambda: ray.init(num_cpus=num_cpus, **kwargs))


# Ray gives a new local node 30 s (fixed in its code) to register with its control store; on a
# machine whose cores are all busy that is sometimes not enough (seen in CI: "The current node
# timed out during startup"), while a second start succeeds.
LOCAL_START_TRIES = 3


def start_local(start: Callable[[], object], tries: int = LOCAL_START_TRIES) -> None:
    """``start()`` (a local ``ray.init``), tried again after Ray's startup timeout; the
    processes each timed-out start left (the children of this process it made) are ended."""
    import psutil

    for attempt in range(1, tries + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            start()
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc):
                raise
            left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(left, timeout=10)
            if attempt == tries:
                raise


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


def error_line(exc: BaseException) -> str:
    """An exception from inside Ray as one short line, to send across a driver's pipe."""
    return clipped(f"{type(exc).__name__}: {exc}", 500)


# ---- a Ray driver in a child process -----------------------------------------------------------


class Channel:
    """The child's end of a ``DriverChild`` pipe: JSON messages, each with raw bytes after it."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def say(self, message: dict[str, Any], payload: bytes = b"") -> None:
        self.conn.send_bytes(json.dumps(message).encode())
        self.conn.send_bytes(payload)

    def requests(self) -> Iterator[dict[str, Any]]:
        """The parent's requests until it says stop or goes away (even SIGKILLed)."""
        while True:
            try:
                request = json.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                return
            if request.get("stop"):
                return
            yield request

    def answer_requests(self, answer: Callable[[dict[str, Any]], tuple[dict, bytes]]) -> bool:
        """Answer each request with ``answer(request)``, run while the cluster lives: its message
        and bytes, or one ``error`` line. False when the cluster is gone (the driver ends: there
        is nothing left to tidy); True when the parent said stop."""
        for request in self.requests():
            try:
                message, payload = while_cluster_lives(lambda: answer(request))  # noqa: B023
            except ClusterGone as exc:
                self.say({"gone": str(exc)})
                return False
            except Exception as exc:
                self.say({"error": error_line(exc)})
                continue
            self.say(message, payload)
        return True


def running_node_ip() -> str | None:
    """The address of the Ray node this process runs on; None outside Ray.

    A driver child joins its parent's node. Left to itself, ``ray.init(address=...)`` picks a
    node by listing the raylet processes it can see and prefers the head's: where several nodes'
    raylets share one process table (nodes in network namespaces of one machine, or a container
    that sees its host's processes), a child of a driver actor on node 2 joined node 1's raylet
    from node 2's network and its Serve calls were never answered."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.util.get_node_ip_address())


def _child_main(
    target: Callable[..., None], conn: Connection, args: tuple, node_ip: str | None
) -> None:
    global _parent_node_ip
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the run; it stops us in order
    _parent_node_ip = node_ip
    target(Channel(conn), *args)


class DriverChild:
    """A Ray driver in a fresh (spawned) child process, ``target(channel, *args)``.

    Ray ends a driver process without an exception when its node's raylet dies or the cluster's
    GCS stays unreachable for 60 s; in a child that ends only the child, and the run can say so
    in one line. The child ignores Ctrl-C (the run stops it in order) and leaves when the pipe
    closes, so even a SIGKILLed run leaves no driver behind."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str):
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited Ray
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_child_main,
            args=(target, child, args, running_node_ip()),
            name=name,
            daemon=True,
        )
        self.process.start()
        child.close()

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a child that is gone: ``receive`` says so
            self.conn.send_bytes(json.dumps(message).encode())

    def receive(self, timeout: float | None) -> tuple[dict[str, Any], bytes] | None:
        """The child's next message and its bytes; None when it ended without one or said
        nothing within ``timeout`` seconds (None: wait as long as it lives)."""
        if self.conn.closed:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.conn.poll(0.5):
            if not self.process.is_alive():
                break
            if deadline is not None and time.monotonic() > deadline:
                return None
        try:
            return json.loads(self.conn.recv_bytes()), self.conn.recv_bytes()
        except (EOFError, OSError):  # the pipe closed: the child is ending, let it finish
            self.process.join(5)
            return None

    def alive(self) -> bool:
        return self.process.is_alive()

    def ended(self) -> str:
        code = self.process.exitcode
        return "its Ray driver process " + (
            "is not answering" if code is None else f"ended (exit code {code})"
        )

    def stop(self, *, tidy: bool, wait: float) -> None:
        """Ask the child to stop (``tidy``: it may still reach its cluster) and wait ``wait``
        seconds for it; then terminate, then kill."""
        if tidy and self.process.is_alive():
            self.send({"stop": True})
            self.process.join(wait)
        for end in (self.process.terminate, self.process.kill):
            if self.process.is_alive():
                end()
                self.process.join(5)
        self.conn.close()
