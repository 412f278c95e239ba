"""``DriverChild``, the pipe both Ray drivers (NLI actors, Serve app) live behind: requests and
answers round-trip with their bytes, Ctrl-C does not reach the child, a closed pipe ends it, and
a child that dies is reported with its exit code instead of a hang."""

from __future__ import annotations

import os
import signal
import time

from groundcover.serving.cluster.join import Channel, DriverChild


def echo(channel: Channel, greeting: str) -> None:
    channel.say({"ready": greeting, "pid": os.getpid()})
    for request in channel.requests():
        if request.get("die"):
            os._exit(3)
        channel.say({"n": request["n"] * 2}, bytes(range(request["n"])))


def test_requests_round_trip_and_stop_ends_the_child():
    child = DriverChild(echo, ("hello",), "gc-test-echo")
    (ready, payload) = child.receive(60)
    assert ready["ready"] == "hello" and payload == b""
    os.kill(ready["pid"], signal.SIGINT)  # the run's Ctrl-C: ignored, the run stops us in order
    for n in (1, 5):
        child.send({"n": n})
        assert child.receive(30) == ({"n": 2 * n}, bytes(range(n)))
    assert child.alive()
    child.stop(tidy=True, wait=30)
    assert child.process.exitcode == 0  # left on "stop", not terminated
    assert child.receive(1) is None  # and a stopped child answers nothing, at once


def test_a_child_that_dies_is_reported_not_waited_for():
    child = DriverChild(echo, ("hi",), "gc-test-echo")
    assert child.receive(60) is not None
    child.send({"die": True})
    started = time.monotonic()
    assert child.receive(None) is None  # no timeout given: ends because the child did
    assert time.monotonic() - started < 10
    assert not child.alive() and child.ended() == "its Ray driver process ended (exit code 3)"
    child.stop(tidy=True, wait=30)


def test_a_closed_pipe_ends_the_child():
    child = DriverChild(echo, ("hi",), "gc-test-echo")
    assert child.receive(60) is not None
    child.conn.close()  # what the run's death does to the pipe (even SIGKILL)
    child.process.join(30)
    assert child.process.exitcode == 0


def test_a_local_ray_start_that_timed_out_is_ended_and_tried_again():
    """Ray gives a local node a fixed 30 s to register; on a busy machine a start can miss it.
    The processes the failed start made are ended, and the start is tried again; any other
    error, or the last try's, is raised as it came."""
    import subprocess
    import sys

    import pytest

    from groundcover.serving.cluster.join import start_local

    made: list[subprocess.Popen] = []

    def flaky(fails: int, message: str):
        def start() -> None:
            made.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
            if len(made) <= fails:
                raise Exception(message)

        return start

    timeout = "The current node timed out during startup. This could happen because ..."
    start_local(flaky(2, timeout), tries=3)
    assert len(made) == 3
    assert [p.wait(10) is not None for p in made[:2]] == [True, True]  # the failed starts' ended
    assert made[2].poll() is None  # the start that worked keeps its processes
    made[2].kill()

    made.clear()
    with pytest.raises(Exception, match="timed out during startup"):
        start_local(flaky(5, timeout), tries=2)
    assert len(made) == 2 and all(p.wait(10) is not None for p in made)  # none left behind

    made.clear()
    with pytest.raises(Exception, match="address in use"):
        start_local(flaky(1, "address in use"), tries=3)
    assert len(made) == 1  # not a startup timeout: not tried again
    made[0].kill()
