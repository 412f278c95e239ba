import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from groundcover.serving.cache import ResponseCache, cache_key


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
    from groundcover.serving.client import EvalClient

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
from groundcover.serving.cache import ResponseCache
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


# ---- content keys, a damaged file, several hosts -------------------------------------------------


def fixture_messages():
    return [
        {"role": "system", "content": "Rate the passage."},
        {
            "role": "user",
            "content": "Passage: the tower is 330 m tall. Question: how tall is "
            "the tower? Answer 1-5.",
        },
    ]


FIXTURE_PARAMS = {
    "template": "crux/rating@1",
    "temperature": 0.0,
    "max_tokens": 8,
    "logprobs": True,
    "top_logprobs": 2,
    "extra_body": {"structured_outputs": {"choice": ["1", "2", "3", "4", "5"]}},
}


def counting_client(path, revisions):
    """A client whose requests are counted and answered '3' (the cache answers the rest)."""
    from groundcover.serving.client import EvalClient

    client = EvalClient(
        "http://127.0.0.1:9/v1", "tiny-llama", cache=ResponseCache(path), revisions=revisions
    )
    sent: list[str] = []

    async def answer(path_, body, **kwargs):
        sent.append(body["model"])
        message = {"role": "assistant", "content": "3"}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    client._http.post = answer  # type: ignore[method-assign]
    return client, sent


async def test_a_cache_from_before_revisions_still_answers_an_unchanged_model(tmp_path):
    """The fixture's row was keyed by name only. A model known by revision now is answered from
    it, and that revision is bound to the name; another revision of the same name (a replaced
    model) is asked again."""
    path = tmp_path / "cache.sqlite"
    shutil.copy(FIXTURE, path)
    client, sent = counting_client(path, {"tiny-llama": "endpoint:aaaa"})
    result = await client.chat(fixture_messages(), **FIXTURE_PARAMS)
    assert result.cached and result.text == "4" and sent == []
    await client.aclose()
    client.cache.close()  # type: ignore[union-attr]

    again, sent = counting_client(path, {"tiny-llama": "endpoint:aaaa"})
    assert (await again.chat(fixture_messages(), **FIXTURE_PARAMS)).text == "4" and sent == []
    again.cache.close()  # type: ignore[union-attr]

    replaced, sent = counting_client(path, {"tiny-llama": "endpoint:bbbb"})
    result = await replaced.chat(fixture_messages(), **FIXTURE_PARAMS)
    assert not result.cached and result.text == "3" and sent == ["tiny-llama"]
    replaced.cache.close()  # type: ignore[union-attr]


async def test_a_retrained_adapter_is_asked_again(tmp_path):
    path = tmp_path / "cache.sqlite"
    revisions = {"tiny-llama": "sha256:base", "claims": "sha256:weights-a"}
    first, sent = counting_client(path, revisions)
    messages = [{"role": "user", "content": "claims of: the tower is tall"}]
    await first.chat(messages, adapter="claims", max_tokens=4)
    await first.chat(messages, adapter="claims", max_tokens=4)
    assert sent == ["claims"]  # the second from the cache
    first.cache.close()  # type: ignore[union-attr]
    retrained, sent = counting_client(path, revisions | {"claims": "sha256:weights-b"})
    result = await retrained.chat(messages, adapter="claims", max_tokens=4)
    assert not result.cached and sent == ["claims"]
    retrained.cache.close()  # type: ignore[union-attr]
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT model, revision FROM responses ORDER BY created").fetchall()
    assert rows == [
        ("claims", "sha256:base+sha256:weights-a"),
        ("claims", "sha256:base+sha256:weights-b"),
    ]


def damage(path: Path, start: int, length: int = 8192) -> None:
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(bytes(range(256)) * (length // 256))


def filled(path: Path, rows: int = 400) -> None:
    cache = ResponseCache(path)
    for n in range(rows):
        cache.put(f"k{n}", {"choices": [{"message": {"content": "x" * 200}}], "n": n})
    cache.close()
    with sqlite3.connect(path) as db:  # everything in the main file, none in the WAL
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@pytest.mark.parametrize(
    "where", [0, 4096 * 3, 4096 * 8], ids=["header", "first-pages", "later-pages"]
)
def test_a_damaged_cache_is_moved_aside_and_a_fresh_one_takes_its_place(tmp_path, capsys, where):
    path = tmp_path / "responses.sqlite"
    filled(path)
    damage(path, where, 4096 * 4)
    cache = ResponseCache(path)  # the header: found at open; pages: found at the first read
    found = [cache.get(f"k{n}") for n in range(400)]
    assert all(f is None or f["n"] == n for n, f in enumerate(found))
    aside = [p for p in tmp_path.glob("responses.sqlite.damaged-*") if p.suffix != ".sqlite"]
    aside = [p for p in aside if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1, capsys.readouterr().err
    err = capsys.readouterr().err
    assert err.count("is damaged") == 1 and "moved aside" in err
    cache.put("new", {"choices": [1]})
    cache.flush()
    assert cache.get("new") == {"choices": [1]}
    cache.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_two_hosts_sharing_one_cache_directory_each_write_their_own_file_and_read_all(
    tmp_path, monkeypatch
):
    import groundcover.serving.cache as serving_cache

    monkeypatch.setattr(serving_cache, "RESCAN_SECONDS", 0.0)
    path = tmp_path / "shared" / "responses.sqlite"
    monkeypatch.setenv("GROUNDCOVER_HOST_ID", "node-a")
    a = ResponseCache(path, shared=True)
    monkeypatch.setenv("GROUNDCOVER_HOST_ID", "node-b")
    b = ResponseCache(path, shared=True)
    a.put("from-a", {"choices": ["a"]})
    b.put("from-b", {"choices": ["b"]})
    a.flush()
    b.flush()
    assert sorted(p.name for p in path.parent.glob("*.sqlite")) == [
        "responses@node-a.sqlite",
        "responses@node-b.sqlite",
    ]
    assert a.get("from-b") == {"choices": ["b"]} and b.get("from-a") == {"choices": ["a"]}
    with sqlite3.connect(path.parent / "responses@node-a.sqlite") as db:
        assert [r[0] for r in db.execute("SELECT key FROM responses")] == ["from-a"]
    a.close()
    b.close()


def test_the_cache_command_lists_prunes_and_clears_by_model_revision(tmp_path):
    from typer.testing import CliRunner

    from groundcover.pipelines.cli.main import app
    from groundcover.serving.content import digest_path

    adapter = tmp_path / "claims"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights a")
    revision = f"sha256:{digest_path(adapter).sha256}"
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    cache.remember_model(revision, "claims", str(adapter))
    for n in range(3):
        cache.put(f"a{n}", {"choices": [n]}, "claims", f"sha256:base+{revision}")
    cache.put("b0", {"choices": [0]}, "tiny", "sha256:base")
    cache.close()
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "list", "--cache", str(path), "--json"])
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.output)
    assert found["entries"] == 4
    by_model = {g["model"]: g for g in found["groups"]}
    assert by_model["claims"]["rows"] == 3 and by_model["tiny"]["rows"] == 1
    assert by_model["claims"]["revision"] == f"sha256:base+{revision}"
    assert by_model["claims"]["present"] is True  # the adapter still has that content
    assert by_model["claims"]["names"][revision] == f"claims @ {adapter}"
    shown = runner.invoke(app, ["cache", "list", "--cache", str(path)])
    assert shown.exit_code == 0 and "4 entries" in shown.output

    (adapter / "adapter_model.safetensors").write_bytes(b"weights b")  # retrained
    pruned = runner.invoke(app, ["cache", "prune", "--missing", "--cache", str(path)])
    assert pruned.exit_code == 0 and "3 of missing models" in pruned.output
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT key FROM responses")] == ["b0"]
    older = runner.invoke(app, ["cache", "prune", "--before", "2000-01-01", "--cache", str(path)])
    assert older.exit_code == 0 and "deleted 0 older" in older.output
    refused = runner.invoke(app, ["cache", "clear", "--cache", str(path)])
    assert refused.exit_code == 2 and "--yes" in refused.output
    cleared = runner.invoke(app, ["cache", "clear", "--yes", "--cache", str(path)])
    assert cleared.exit_code == 0 and "deleted 1 entries" in cleared.output


def test_a_run_on_a_damaged_cache_completes_with_the_records_of_a_clean_run(tmp_path, capsys):
    """CRUX with one unrated passage: its four ratings come from a judge on 127.0.0.1 through the
    product's client and cache. The same run on a copy of that cache, damaged, asks them again
    (the damaged file moved aside) and records what the clean run recorded."""
    from groundcover.pipelines.crux.framework import CRUX, PROMPTS
    from groundcover.pipelines.runtime.contract.config import EvaluatorConfig, RunConfig
    from groundcover.pipelines.runtime.contract.protocol import RunRequest
    from groundcover.pipelines.runtime.execution.execute import execute
    from tests.support.loopback import StageByPrompt, loopback_judge
    from tests.support.scripted import ScriptedClient, field_of
    from tests.test_crux import crux_options, write_crux

    paths = write_crux(tmp_path)
    options = crux_options(paths)
    judge = ScriptedClient(
        {"rate": lambda p: "4" if field_of(p, "Question") in ("Q2?", "Q3?") else "1"},
        check_constraints=False,
    )
    judge.keep_calls = True

    def solved(run_dir: Path, cache: Path) -> list[dict]:
        evaluator = EvaluatorConfig(model="judge", endpoint=url, concurrency=2)
        request = RunRequest(evaluator, RunConfig(run_dir=run_dir, cache=cache), options)
        execute(CRUX, request, quiet=True)
        lines = (run_dir / "results.jsonl").read_text().splitlines()
        return [
            {k: r[k] for k in ("id", "status", "score", "details")} for r in map(json.loads, lines)
        ]

    with loopback_judge(judge, None, StageByPrompt(PROMPTS, {"rate": "rate"})) as url:
        clean = solved(tmp_path / "clean", tmp_path / "a" / "responses.sqlite")
        asked = len(judge.calls)
        assert asked == 3  # the unrated pairs of the top k
        damaged = tmp_path / "b" / "responses.sqlite"
        damaged.parent.mkdir()
        shutil.copy(tmp_path / "a" / "responses.sqlite", damaged)
        damage(damaged, 0, 4096)
        again = solved(tmp_path / "again", damaged)
    assert again == clean
    assert len(judge.calls) == 2 * asked  # nothing came from the damaged file
    assert "is damaged" in capsys.readouterr().err
    assert len(list(damaged.parent.glob("responses.sqlite.damaged-*"))) >= 1
