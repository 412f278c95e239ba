"""How fast ``groundcover view`` opens a large run: the first page, a page of items, a search,
one item's drill-down and the labelling queue, on a run made here of N records.

    .venv/bin/python scripts/benchmarks/bench_viewer.py --records 1000000 --statements 4
    .venv/bin/python scripts/benchmarks/bench_viewer.py --records 20000 --statements 400 --whole

Each record is a comprehensiveness record whose details hold ``--statements`` statements (4: about
1.2 KB a record; 400: about 35 KB, a run with fact graphs). ``--whole`` also waits for the whole
page (tables, figures, agreement: every record parsed), as the light page does in the background.
Peak memory is the process's (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path


def manifest(records: int) -> str:
    from groundcover.pipelines.runtime.store.manifest import FORMAT_VERSION, RunManifest

    made = RunManifest(
        framework="comprehensiveness",
        task="comprehensiveness-qa",
        config={},
        config_fingerprint="bench",
        options={"dataset": "items", "method": "qa", "protocol": "spec"},
        items=records,
        format_version=FORMAT_VERSION,
    )
    return made.model_dump_json()


def make_run(root: Path, records: int, statements: int) -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(manifest(records))
    details = {
        "method": "qa",
        "protocol": "spec",
        "statements": [
            {"id": f"q{k}.c1.1", "text": "The Eiffel Tower is 330 metres tall.", "source": "c1"}
            for k in range(statements)
        ],
    }
    with open(run / "results.jsonl", "w") as out:
        for k in range(records):
            record = {
                "id": f"i{k:07d}",
                "status": "ok",
                "score": (k % 5) / 4,
                "explanation": f"{k % 5} of 4 relevant context statements are covered",
                "details": details,
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return run


def timed(what: str, action) -> object:
    began = time.perf_counter()
    found = action()
    print(f"{what:<28} {time.perf_counter() - began:8.2f} s")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--statements", type=int, default=4)
    parser.add_argument("--whole", action="store_true", help="also wait for the whole page")
    args = parser.parse_args()
    from groundcover.pipelines.reports.pages.viewer import Viewer

    with tempfile.TemporaryDirectory(prefix="gc-bench-view-") as tmp:
        run = make_run(Path(tmp), args.records, args.statements)
        size = (run / "results.jsonl").stat().st_size
        print(f"{args.records:,} records, {size / 1e6:,.0f} MB of results.jsonl")
        viewer = Viewer([run])
        page = timed("first page", viewer.page)
        assert isinstance(page, str) and "could not be made" not in page, page[:300]
        if "being made" in page:
            print("  (the light page: the whole one is being made meanwhile)")
        timed("a page of 100 items", lambda: viewer.items(0, {}))
        timed("search, filter", lambda: viewer.items(0, {"q": "i00999", "min": "0.5"}))
        timed("one item's record", lambda: viewer.item(0, f"i{args.records // 2:07d}"))
        timed("the labelling queue", lambda: viewer.queue(0, "bench"))
        if args.whole:

            def whole() -> None:
                while not viewer.ready():
                    time.sleep(0.2)

            timed("the whole page, made", whole)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory {peak:,.0f} MB")


if __name__ == "__main__":
    main()
