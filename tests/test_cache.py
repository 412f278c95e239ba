import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from serving.cache import ResponseCache, cache_key


def test_key_ignores_dict_order_but_not_content():
    a = cache_key({"model": "m", "params": {"temperature": 0, "max_tokens": 5}})
    b = cache_key({"params": {"max_tokens": 5, "temperature": 0}, "model": "m"})
    c = cache_key({"model": "m", "params": {"temperature": 0, "max_tokens": 6}})
    assert a == b
    assert a != c


def test_template_and_adapter_change_the_key():
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}], "template": "t@v1#aa"}
    assert cache_key(base) != cache_key(base | {"template": "t@v2#bb"})
    assert cache_key(base) != cache_key(base | {"model": "adapter"})


def test_persists_across_instances(tmp_path):
    path = tmp_path / "c.sqlite"
    first = ResponseCache(path)
    assert len(first) == 0
    first.put("k", {"choices": [{"message": {"content": "hi"}}]})
    first.close()
    second = ResponseCache(path)
    assert second.get("k") == {"choices": [{"message": {"content": "hi"}}]}
    assert second.get("missing") is None
    assert len(second) == 1


FIXTURE = Path(__file__).parent / "fixtures" / "cache-before-wire-speed.sqlite"


async def test_a_cache_written_before_the_wire_speed_client_is_still_hit(tmp_path):
    """tests/fixtures/cache-before-wire-speed.sqlite was written by the cache and key code of the
    openai-SDK client (one row: a CRUX-style rating with logprobs); the same request now comes
    back from it without a request being sent."""
    from serving.client import EvalClient

    path = tmp_path / "cache.sqlite"
    shutil.copy(FIXTURE, path)
    client = EvalClient("http://127.0.0.1:9/v1", "tiny-llama", cache=ResponseCache(path))

    async def no_request(*args, **kwargs):
        raise AssertionError("the cached answer was not found: a request was sent")

    client._http.post = no_request  # type: ignore[method-assign]
    messages = [
        {"role": "system", "content": "Rate the passage."},
        {
            "role": "user",
            "content": "Passage: the tower is 330 m tall. Question: how tall is "
            "the tower? Answer 1-5.",
        },
    ]
    result = await client.chat(
        messages,
        template="crux/rating@1",
        temperature=0.0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
        extra_body={"structured_outputs": {"choice": ["1", "2", "3", "4", "5"]}},
    )
    assert result.cached and result.text == "4" and result.prompt_tokens == 41
    assert result.sequence_probability == pytest.approx(math.exp(-0.105))
    assert client.usage["default"].cache_hits == 1 and client.usage["default"].requests == 0
    client.cache.close()  # type: ignore[union-attr]


def test_rows_are_read_before_their_commit(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite", flush_seconds=60)
    cache.put("k", {"choices": [1]})
    assert cache.get("k") == {"choices": [1]}  # queued for the writer, already readable
    cache.close()  # commits what was queued
    again = ResponseCache(tmp_path / "c.sqlite")
    assert again.get("k") == {"choices": [1]}
    again.close()


KILLED_WRITER = """
import sys, time
from serving.cache import ResponseCache
cache = ResponseCache(sys.argv[1], flush_seconds=600)
for n in range(5):
    cache.put(f"committed-{n}", {"n": n})
cache.flush()
for n in range(3):
    cache.put(f"lost-{n}", {"n": n})
print("ready", flush=True)
time.sleep(600)
"""


def test_a_sigkill_loses_only_the_rows_not_yet_committed(tmp_path):
    """The writer commits in batches: a process killed outright keeps every batch committed
    before the kill and loses only the rows queued after it (a resumed run asks for those)."""
    path = tmp_path / "c.sqlite"
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    cache = ResponseCache(path)
    assert len(cache) == 5
    assert all(cache.get(f"committed-{n}") == {"n": n} for n in range(5))
    assert all(cache.get(f"lost-{n}") is None for n in range(3))
    cache.close()


def test_many_rows_are_committed_in_few_transactions(tmp_path):
    """1,000 answers put back to back reach disk in a handful of commits, not one each."""
    cache = ResponseCache(tmp_path / "c.sqlite", flush_seconds=5, batch_rows=512)
    for n in range(1000):
        cache.put(f"k{n}", {"n": n})
    cache.flush()
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 1000
        created = {row[0] for row in db.execute("SELECT created FROM responses")}
    assert len(created) <= 3  # one timestamp per transaction: 512 + 488, or a split by the flush
    cache.close()
