import json

import pytest

from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
from groundcover.pipelines.runtime.store.run_dir import (
    FORMAT_VERSION,
    RunStore,
    RunStoreError,
    results_by_id,
    status_counts,
)

CONFIG = {"model": "m", "temperature": 0}


def open_store(path, config=CONFIG):
    store = RunStore(path)
    store.open(
        framework="f", task="t", config=config, models={"model": "m"}, prompts={"p": "p@v1#x"}
    )
    return store


def ok(item_id, score=1.0):
    return ItemResult(id=item_id, status="ok", score=score, explanation="fine")


def failed(item_id, status):
    failure = StageFailure(stage="s", error="boom")
    return ItemResult(id=item_id, status=status, explanation="failed", failure=failure)


def test_manifest_records_provenance_and_format(tmp_path):
    open_store(tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    for key in ("command", "config", "models", "prompts", "package_version", "git_revision"):
        assert key in manifest
    assert manifest["prompts"] == {"p": "p@v1#x"}
    assert manifest["format_version"] == FORMAT_VERSION and manifest["framework"] == "f"


def test_other_format_version_is_refused_in_one_line(tmp_path):
    open_store(tmp_path / "run")
    path = tmp_path / "run" / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"format_version": 1}))
    with pytest.raises(RunStoreError, match="format version 1; this groundcover reads version"):
        open_store(tmp_path / "run")


def test_resume_keeps_results_and_refuses_other_config(tmp_path):
    store = open_store(tmp_path / "run")
    store.append(ok("a"))
    store.close()
    again = open_store(tmp_path / "run")
    assert again.pending(["a", "b"]) == {"b"}
    assert len(again.manifest().resumed_at) == 1
    with pytest.raises(RunStoreError, match="different task or config"):
        open_store(tmp_path / "run", {"model": "other"})


def test_error_items_are_retried_and_the_retry_supersedes(tmp_path):
    store = open_store(tmp_path / "run")
    store.append(failed("a", "error"))
    store.append(failed("b", "unparseable"))  # final: the model was asked, it stays recorded
    store.close()
    store = open_store(tmp_path / "run")
    assert store.pending(["a", "b"]) == {"a"}
    store.append(ok("a", 0.5))
    store.close()
    records = {r.id: r for r in open_store(tmp_path / "run").results()}  # file order
    assert [r.id for r in records.values()] == ["b", "a"]
    assert records["a"].status == "ok" and records["a"].score == 0.5


def test_torn_tail_is_cut_and_item_reruns(tmp_path):
    store = open_store(tmp_path / "run")
    store.append(ok("a"))
    store.close()
    with open(store.results_path, "a") as handle:
        handle.write('{"id": "b", "stat' + "x" * 100_000)  # killed mid-write, longer than a block
    assert [r.id for r in results_by_id(store.results_path)] == ["a"]
    store = open_store(tmp_path / "run")  # resume repairs the file
    assert store.pending(["a", "b"]) == {"b"}
    store.append(ok("b"))
    store.close()
    lines = store.results_path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]


def test_corrupt_middle_line_is_an_error_naming_file_and_line(tmp_path):
    store = open_store(tmp_path / "run")
    good = ok("a").model_dump_json()
    store.results_path.write_text(f"{good}\nGARBAGE\n{good}\n")
    with pytest.raises(RunStoreError, match=r"results.jsonl:2: corrupt record"):
        open_store(tmp_path / "run")


def test_every_status_is_counted_none_dropped(tmp_path):
    store = open_store(tmp_path / "run")
    records = [
        ok("0"),
        failed("1", "unparseable"),
        failed("2", "error"),
        ok("4"),
        ItemResult(id="3", status="undefined", explanation="nothing to cover"),
        ItemResult(id="5", status="abstained", explanation="no answer"),
    ]
    for record in records:
        store.append(record)
    store.close()
    counts = status_counts(store.results())
    assert counts == {
        "ok": 2,
        "unparseable": 1,
        "abstained": 1,
        "undefined": 1,
        "error": 1,
        "cut_in_reasoning": 0,
        "unjudged": 0,
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status": "fine"}, "status"),
        ({"status": "ok", "score": float("nan")}, "finite"),
        ({"status": "undefined", "score": 0.0}, "no score"),
        ({"status": "unparseable"}, "names its failing stage"),
    ],
)
def test_inconsistent_records_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ItemResult(id="x", explanation="e", **fields)


def test_store_takes_only_typed_records(tmp_path):
    store = open_store(tmp_path / "run")
    with pytest.raises(TypeError, match="ItemResult"):
        store.append({"id": "x", "status": "ok"})


def test_results_are_read_back_from_disk_as_recorded(tmp_path):
    """The store keeps each record's offset, not the record: what it gives back is the last
    record of each id, in the order asked for, also after reopening."""
    store = open_store(tmp_path / "run")
    assert list(store.results(["a"])) == [] and not store.results()  # no file yet
    for record in (ok("b", 0.5), failed("a", "error"), ok("c"), ok("a", 0.25)):  # a retried
        store.append(record)
    wanted = [ok("a", 0.25), ok("b", 0.5), ok("c")]
    assert list(store.results(["a", "b", "c", "missing"])) == wanted
    store.close()
    again = open_store(tmp_path / "run")
    view = again.results(["c", "a"])
    assert len(view) == 2 and view[1] == ok("a", 0.25) and list(view[:1]) == [ok("c")]
    assert list(again.results()) == [ok("b", 0.5), ok("c"), ok("a", 0.25)]  # file order
    assert list(results_by_id(tmp_path / "run" / "results.jsonl")) == wanted
    assert all(not isinstance(v, ItemResult) for v in again.index.values())
