"""`groundcover view` with people in the loop: a person labels six items of a finished run by
keyboard in a real Chromium (driven over the DevTools protocol), overrides one, reloads and finds
them kept; `agreement` then computes from exactly those labels. A forged cross-origin write and a
write without the page's token are refused; two writers at once keep every label; the report
page is served without its items, which the server filters, searches and pages."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from typer.testing import CliRunner

from groundcover.pipelines.cli import app
from groundcover.pipelines.reports.pages.viewer import SCALE, Viewer, make_server
from tests.support.browser import BROWSER, browser
from tests.test_exports import ARTIFACTS
from tests.test_labels import judged_run


@pytest.fixture
def served(tmp_path):
    """A finished run of twelve items served by the viewer on a free loopback port."""
    run = judged_run(tmp_path)
    viewer = Viewer([run])
    server = make_server(viewer, "127.0.0.1", 0, None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield run, viewer, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post(url: str, body: dict, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"} | headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.skipif(BROWSER is None, reason="no chromium: ./setup.sh installs Debian's chromium")
def test_six_labels_by_keyboard_an_override_and_a_reload(served):
    run, viewer, base = served
    # keys pressed per item, in the page's order (i00, i01, ...): the score scale's buttons
    keys = ["5", "3", "1", "4", "3", "2"]

    async def label() -> tuple[str, str]:
        async with browser() as page:
            await page.navigate(f"{base}/label?run=0&annotator=ana")
            await page.wait_for(["0 of 12 labelled", "Question 0?"])
            blind = await page.text()
            for key in keys:
                await page.key(key)
                await page.wait_for(["judge's verdict:"])
                await page.key("n")
            await page.wait_for(["6 of 12 labelled"])
            await page.key("p")  # back to the sixth item (i05): override it
            await page.evaluate(
                "document.getElementById('override-score').value = '0.5';"
                "document.getElementById('override-reason').value = 'half is covered';"
                "document.getElementById('override').click();"
            )
            await page.wait_for(["overridden to 0.5"])
            await page.navigate(f"{base}/label?run=0&annotator=ana")  # reload: all kept
            kept = await page.wait_for(["6 of 12 labelled", "Question 6?"])
            await page.screenshot(ARTIFACTS / "label-page.png")
            return blind, kept

    ARTIFACTS.mkdir(exist_ok=True)
    blind, kept = asyncio.run(label())
    assert "judge's verdict:" not in blind  # the verdict shows only after the label
    assert "6 of 12 labelled" in kept and "item i06 (7 of 12)" in kept
    lines = [json.loads(x) for x in (run / "labels" / "labels.jsonl").read_text().splitlines()]
    given = {x["id"]: x["label"] for x in lines}
    assert given == {f"i{k:02d}": SCALE[int(key) - 1] for k, key in enumerate(keys)}
    assert {x["annotator"] for x in lines} == {"ana"} and all(x["source"] == "view" for x in lines)
    (override,) = [
        json.loads(x) for x in (run / "labels" / "overrides.jsonl").read_text().splitlines()
    ]
    assert (override["id"], override["score"], override["judge"]) == ("i05", 0.5, 0.0)
    # agreement from exactly those labels: the judge 1, .5, 0, 1, .5, 0 on i00..i05; the
    # person 1, .5, 0, .75, .5, .25
    found = json.loads(CliRunner().invoke(app, ["agreement", str(run), "--json"]).output)
    score = found["runs"][0]["score"]
    assert score["labelled"] == 6 and score["human"][0] == pytest.approx(3.0 / 6)
    import ppi_py

    judge = [1.0, 0.5, 0.0, 1.0, 0.5, 0.0]
    human = [SCALE[int(k) - 1] for k in keys]
    rest = [1.0, 0.5, 0.0, 1.0, 0.5, 0.0]  # i06..i11
    expected = ppi_py.ppi_mean_pointestimate(np.array(human), np.array(judge), np.array(rest))
    assert score["ppi"][0] == pytest.approx(float(np.asarray(expected).reshape(-1)[0]))
    report = json.loads(CliRunner().invoke(app, ["report", str(run), "--json"]).output)
    assert report["overrides"]["overrides"] == 1
    assert report["overrides"]["overridden_mean"] == pytest.approx(6.5 / 12)  # 6 -> 6.5


def test_writes_need_the_token_and_the_pages_own_origin(served):
    run, viewer, base = served
    label = {"run": 0, "id": "i00", "label": 1.0, "annotator": "ana"}
    token = {"X-Groundcover-Token": viewer.token}
    assert post(f"{base}/api/labels", label, {})[0] == 403
    forged = post(f"{base}/api/labels", label, token | {"Origin": "http://evil.example"})
    assert forged == (403, {"error": "refused: a write from another origin (http://evil.example)"})
    site = post(f"{base}/api/labels", label, token | {"Sec-Fetch-Site": "cross-site"})
    assert site[0] == 403
    assert not (run / "labels" / "labels.jsonl").exists()
    origin = {"Origin": base}
    status, body = post(f"{base}/api/labels", label, token | origin)
    assert status == 200 and body == {"id": "i00", "key": 0, "label": 1.0, "judge": 1.0}
    bad = post(f"{base}/api/labels", label | {"id": "../../etc/passwd"}, token | origin)
    assert bad == (400, {"error": "'../../etc/passwd': not an item of run 0"})
    assert post(f"{base}/api/labels", label | {"run": 7}, token | origin)[0] == 400
    stage = post(f"{base}/api/labels", label | {"stage": "../labels"}, token | origin)
    assert stage == (400, {"error": "stage: '../labels' is not a judging stage of run 0"})

    def write(who: str) -> None:
        for k in range(40):
            item = {"run": 0, "id": f"i{k % 12:02d}", "label": 0.5, "annotator": who}
            assert post(f"{base}/api/labels", item, token | origin)[0] == 200

    writers = [threading.Thread(target=write, args=(who,)) for who in ("bo", "cy")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    lines = (run / "labels" / "labels.jsonl").read_text().splitlines()
    assert len(lines) == 81 and all(json.loads(x)["label"] in (0.5, 1.0) for x in lines)


def test_the_page_is_served_without_its_items_which_come_by_page(served):
    run, viewer, base = served
    with urllib.request.urlopen(f"{base}/", timeout=30) as response:
        page = response.read().decode()
    assert 'id="data-0" data-served="1">[]</script>' in page and "/label?run=0" in page
    first = get(f"{base}/api/items?run=0&size=5&page=1")
    assert first["total"] == 12 and [i["id"] for i in first["items"]] == [
        f"i{k:02d}" for k in range(5, 10)
    ]
    assert first["items"][0]["explanation"]  # the whole record, for the drill-down
    zeros = get(f"{base}/api/items?run=0&max=0")
    assert [i["id"] for i in zeros["items"]] == [f"i{k:02d}" for k in (2, 5, 8, 11)]
    assert get(f"{base}/api/items?run=0&q=i07")["total"] == 1
    assert get(f"{base}/api/item?run=0&id=i03")["score"] == 1.0


def test_a_panel_stage_is_labelled_with_its_own_labels_and_agreement_reads_them(tmp_path):
    # FanOutQA judged by three scripted judges (tests/test_panels.py): the judge stage decided
    # f1 B (B, B, A) and f2 D (C, D, E: a tie, the declared D); f3 was not judged
    from tests.test_panels import panel_run

    panel_run(tmp_path / "p", ["j1", "j2", "j3"])
    run = tmp_path / "p" / "run" / "closed-book"
    viewer = Viewer([run])
    server = make_server(viewer, "127.0.0.1", 0, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        queue = get(f"{base}/api/queue?run=0&stage=judge&annotator=ana")
        assert (queue["kind"], queue["choices"]) == ("labels", list("ABCDEF"))
        assert queue["stages"] == ["score", "judge"]
        assert [(e["id"], e["key"]) for e in queue["items"]] == [("f1", 0), ("f2", 0)]
        assert not any("judge" in e for e in queue["items"])  # blind
        with urllib.request.urlopen(f"{base}/label?run=0&stage=judge", timeout=30) as response:
            page = response.read().decode()
        assert "data-value='\"F\"'" in page and 'id="override"' not in page
        write = {"X-Groundcover-Token": viewer.token, "Origin": base}
        label = {"run": 0, "stage": "judge", "key": 0, "annotator": "ana"}
        assert post(f"{base}/api/labels", label | {"id": "f1", "label": "B"}, write) == (
            200,
            {"id": "f1", "key": 0, "label": "B", "judge": "B"},
        )
        assert post(f"{base}/api/labels", label | {"id": "f2", "label": "C"}, write)[0] == 200
        wrong = post(f"{base}/api/labels", label | {"id": "f2", "label": "Z"}, write)
        assert wrong[0] == 400 and "label: one of" in wrong[1]["error"]
        unit = post(f"{base}/api/labels", label | {"id": "f2", "key": 1, "label": "C"}, write)
        assert unit == (400, {"error": "key: item 'f2' has no unit 1 of stage judge"})
        unjudged = post(f"{base}/api/labels", label | {"id": "f3", "label": "C"}, write)
        assert unjudged[0] == 400
        after = get(f"{base}/api/queue?run=0&stage=judge&annotator=ana")["items"]
        assert [(e["label"], e["judge"]) for e in after] == [("B", "B"), ("C", "D")]
    finally:
        server.shutdown()
        server.server_close()
    out = CliRunner().invoke(app, ["agreement", str(run), "--json"])
    human = json.loads(out.output)["runs"][0]["stages"]["judge"]["human"]
    # the panel: B = B, D for C -> half agree; j1 said B and C: all agree
    assert human["judges"]["panel"]["confusion"] == {"B": {"B": 1}, "C": {"D": 1}}
    assert human["judges"]["panel"]["agree"] == 0.5
    assert human["judges"]["judge (j1)"]["agree"] == 1.0


def test_the_light_pass_reads_each_records_first_fields_as_the_run_store_does(tmp_path):
    from groundcover.pipelines.reports.pages.viewer import light_state
    from groundcover.pipelines.runtime.contract.results import ItemResult, StageFailure
    from groundcover.pipelines.runtime.store.run_dir import RESULTS, results_by_id

    panel = {"panel": [{"stage": "judge", "members": ["B"], "value": "B"}]}
    failed = StageFailure(stage="judge", error="boom")
    records = [
        ItemResult(id="a", status="ok", score=0.5, explanation='" \\ é', details=panel),
        ItemResult(id="b\u2603", status="undefined", score=None, explanation="no statements"),
        ItemResult(id="c", status="error", score=None, explanation="boom", failure=failed),
        ItemResult(id="c", status="ok", score=1.0, explanation="retried"),  # supersedes
    ]
    lines = [r.model_dump_json() + "\n" for r in records]
    # a record written with another key order is read whole; a torn last line is no record
    lines.append(json.dumps({"explanation": "x", "status": "ok", "id": "d", "score": 0.25}) + "\n")
    lines.append('{"id": "e", "status": "ok", "sco')
    (tmp_path / RESULTS).write_text("".join(lines))
    state = light_state(tmp_path, ())
    full = {r.id: r for r in results_by_id(tmp_path / RESULTS)}
    assert [r.id for r in state.rows] == sorted(full) == ["a", "b\u2603", "c", "d"]
    for row in state.rows:
        record = full[row.id]
        assert (row.status, row.score, row.explanation) == (
            record.status,
            record.score,
            record.explanation,
        )
        assert state.records[state.index[row.id]] == record  # read by offset when asked
    assert state.with_panel == [0] and list(state.stages) == ["judge"]
    (tmp_path / RESULTS).write_text(lines[0] + '{"no": "id"}\n')
    with pytest.raises(Exception, match=rf"{RESULTS}:2: corrupt record"):
        light_state(tmp_path, ())


def test_a_large_run_opens_on_the_light_page_then_reloads_to_the_whole_one(served, monkeypatch):
    from groundcover.pipelines.reports.pages import viewer as viewing

    run, viewer, base = served
    monkeypatch.setattr(viewing, "LIGHT_ABOVE", 5)  # twelve records: "large"
    gate = threading.Event()
    made = viewer._render

    def slow(key):  # the whole page is being made while the light one is served
        gate.wait(30)
        made(key)

    monkeypatch.setattr(viewer, "_render", slow)
    with urllib.request.urlopen(f"{base}/", timeout=30) as response:
        light = response.read().decode()
    assert "being made from its records" in light and get(f"{base}/api/ready") == {"ready": False}
    # the headline is the light pass's: twelve items, mean (4 x 1 + 4 x 0.5 + 4 x 0) / 12
    assert "0.5000" in light and "over 12 scored of 12 recorded" in light
    assert get(f"{base}/api/items?run=0&status=ok&min=0.75")["total"] == 4
    gate.set()
    for _ in range(300):
        if get(f"{base}/api/ready")["ready"]:
            break
        threading.Event().wait(0.1)
    with urllib.request.urlopen(f"{base}/", timeout=30) as response:
        whole = response.read().decode()
    assert "being made from its records" not in whole and "over 12 scored of 12 recorded" in whole
