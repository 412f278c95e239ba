import json

import pytest

from pipelines.runstore import RunStore, RunStoreError, status_counts

CONFIG = {"model": "m", "temperature": 0}


def open_store(path, config=CONFIG):
    store = RunStore(path)
    store.open(task="t", config=config, models={"model": "m"}, prompts={"p": "p@v1#x"})
    return store


def test_manifest_records_provenance(tmp_path):
    open_store(tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    for key in ("command", "config", "models", "prompts", "package_version", "git_revision"):
        assert key in manifest
    assert manifest["prompts"] == {"p": "p@v1#x"}


def test_resume_keeps_results_and_refuses_other_config(tmp_path):
    store = open_store(tmp_path / "run")
    store.append({"id": "a", "status": "ok"})
    store.close()
    again = open_store(tmp_path / "run")
    assert again.completed_ids() == {"a"}
    assert "resumed_at" in again.manifest()
    with pytest.raises(RunStoreError, match="different task or config"):
        open_store(tmp_path / "run", {"model": "other"})


def test_torn_tail_is_cut_and_item_reruns(tmp_path):
    store = open_store(tmp_path / "run")
    store.append({"id": "a", "status": "ok"})
    store.close()
    with open(store.results_path, "a") as handle:
        handle.write('{"id": "b", "stat')  # killed mid-write
    assert store.completed_ids() == {"a"}
    store = open_store(tmp_path / "run")  # resume repairs the file
    store.append({"id": "b", "status": "ok"})
    store.close()
    lines = store.results_path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]


def test_corrupt_middle_line_is_an_error_naming_file_and_line(tmp_path):
    store = open_store(tmp_path / "run")
    store.results_path.write_text(
        '{"id": "a", "status": "ok"}\nGARBAGE\n{"id": "b", "status": "ok"}\n'
    )
    with pytest.raises(RunStoreError, match=r"results.jsonl:2: corrupt record"):
        store.results()


def test_every_status_is_counted_none_dropped(tmp_path):
    store = open_store(tmp_path / "run")
    for i, status in enumerate(["ok", "unparseable", "abstained", "undefined", "ok"]):
        store.append({"id": str(i), "status": status})
    store.close()
    counts = status_counts(store.results())
    assert counts == {"ok": 2, "unparseable": 1, "abstained": 1, "undefined": 1, "error": 0}
    assert sum(counts.values()) == 5


def test_unknown_status_refused(tmp_path):
    store = open_store(tmp_path / "run")
    with pytest.raises(ValueError, match="status must be one of"):
        store.append({"id": "x", "status": "fine"})
