"""``groundcover view``: the runs' page served on 127.0.0.1, page by page, with labelling.

- ``GET /``: the report page without its items (a million-item run opens as fast as a small
  one); the items come from ``/api/items``, filtered, searched and paged by the server.
- ``GET /label?run=K[&stage=S]``: the labelling page of run K's score (its queue from
  ``agreement --sample``, else every scored item) or of one judging stage of a panel (every
  unit the panel decided), one at a time: the question, the answer under judgement and the
  reference, the stage's labels (or the score scale) as buttons with keys 1-9, a note,
  progress. Blind by default: the judge's verdict shows only after the label is given. An
  override of an item's score (with a reason) is a layer over the records (``overrides``).
- ``POST /api/labels`` and ``/api/overrides``: written only with the page's per-session token
  (``X-Groundcover-Token``) from the page's own origin: another site's form or script is
  refused. Runs are named by their number on the command line and items by their ids in the
  run: nothing a request says becomes a path. Two browsers at once lose nothing (each label is
  one append).

The run's page and rows are kept until its records or labels change on disk (a running
evaluation still shows its progress on the next request).
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..runtime.errors import UserError
from ..runtime.panels import Vote
from ..runtime.results import ItemResult
from ..runtime.runstore import RESULTS, results_by_id
from .agreement import Unit
from .labels import LABELS_DIR, annotator_units, append_labels
from .overrides import OVERRIDES, add_override, read_overrides, withdraw_override

PAGE_SIZE = 100
SCORE = "score"  # the item's score: the stage a label of the whole item names
SCALE = (0.0, 0.25, 0.5, 0.75, 1.0)  # the score scale's buttons, keys 1-5
LABEL_PAGE = Path(__file__).with_name("label_page.html.j2")


@dataclass
class RunState:
    """What a run's page and requests read, kept until the run changes on disk."""

    stamp: tuple
    records: Any  # the records view (read on access)
    rows: list[dict[str, Any]]  # id, status, score, explanation: what filters read
    index: dict[str, int]  # id -> position in ``records``
    texts: Any  # ``rows.RunRows``: what a person reads of an item
    stages: dict[str, list[Unit]]  # per panel stage, the units the panel decided


class Viewer:
    def __init__(self, paths: list[Path], prices: dict[str, Any] | None = None):
        self.paths = paths
        self.prices = prices
        self.token = secrets.token_urlsafe(24)  # every write shows it: a page of ours
        self.lock = threading.Lock()
        self.states: dict[int, RunState] = {}
        self.pages: dict[tuple, str] = {}

    # ---- reading -------------------------------------------------------------------------

    def stamp(self, k: int, *names: str) -> tuple:
        """When run k's files last changed: its records, and the label files ``names``."""
        path = self.paths[k]
        found: list[tuple[int, int] | None] = []
        for name in (RESULTS, *(f"{LABELS_DIR}/{n}" for n in names)):
            try:
                stat = (path / name).stat()
                found.append((stat.st_mtime_ns, stat.st_size))
            except OSError:
                found.append(None)
        return tuple(found)

    def state(self, k: int) -> RunState:
        if not 0 <= k < len(self.paths):
            raise KeyError(k)
        stamp = self.stamp(k)
        with self.lock:
            found = self.states.get(k)
            if found is not None and found.stamp == stamp:
                return found
        from .agreement import panel_units
        from .rows import run_rows

        path = self.paths[k]
        records = results_by_id(path / RESULTS)
        rows, index = [], {}
        stages: dict[str, list[Unit]] = {}
        for n, record in enumerate(records):  # one pass over the records
            index[record.id] = n
            rows.append(
                {"id": record.id, "status": record.status, "score": record.score}
                | {"explanation": record.explanation}
            )
            for stage, units in panel_units([record]).items():
                stages.setdefault(stage, []).extend(units)
        state = RunState(stamp, records, rows, index, run_rows(path), stages)
        with self.lock:
            self.states[k] = state
        return state

    def page(self) -> str:
        """The report page without its items (they are fetched by page)."""
        from .report_html import render

        # the headline shows the overrides; labels are read by the labelling page itself
        key = tuple(self.stamp(k, OVERRIDES) for k in range(len(self.paths)))
        with self.lock:
            if key in self.pages:
                return self.pages[key]
        html = render(self.paths, prices=self.prices, served=True)
        with self.lock:
            self.pages = {key: html}
        return html

    def items(self, k: int, query: dict[str, str]) -> dict[str, Any]:
        """One page of run k's items, filtered and searched here."""
        state = self.state(k)
        status, text = query.get("status", ""), query.get("q", "").lower()
        low, high = _number(query.get("min")), _number(query.get("max"))
        found = []
        for row in state.rows:
            score = row["score"]
            if status and row["status"] != status:
                continue
            if low is not None and not (score is not None and score >= low):
                continue
            if high is not None and not (score is not None and score <= high):
                continue
            if text and text not in f"{row['id']} {row['explanation']}".lower():
                continue
            found.append(row["id"])
        page = max(int(query.get("page", "0") or 0), 0)
        size = min(max(int(query.get("size", str(PAGE_SIZE)) or PAGE_SIZE), 1), 1000)
        shown = found[page * size : (page + 1) * size]
        return {
            "total": len(found),
            "page": page,
            "size": size,
            "items": [self.item(k, i) for i in shown],
        }

    def item(self, k: int, item: str) -> dict[str, Any]:
        from .report_html import _graph

        state = self.state(k)
        if item not in state.index:
            raise KeyError(item)
        record = state.records[state.index[item]]
        found = record.model_dump(mode="json")
        found["graph"] = _graph(self.paths[k], found.get("details", {}))
        return found

    def choices(self, k: int, stage: str) -> dict[str, Any]:
        """What a person labels ``stage`` with: ``labels`` (one of the stage's labels) or
        ``number`` (buttons for the usual values, any number accepted)."""
        if stage == SCORE:
            return {"kind": "number", "choices": list(SCALE), "low": 0.0, "high": 1.0}
        state = self.state(k)
        if stage not in state.stages:
            raise KeyError(f"stage {stage!r}")
        rule = state.texts.framework.panel_rule(stage)
        declared = getattr(rule, "choices", None)
        if declared:
            return {"kind": "labels", "choices": list(declared)}
        seen = {v for u in state.stages[stage] for v in (*u.values, u.combined) if v is not None}
        if isinstance(rule, Vote):
            return {"kind": "labels", "choices": sorted(seen | {rule.tie}, key=str)}
        numbers = sorted(v for v in seen if isinstance(v, int | float))
        return {"kind": "number", "choices": numbers[:9], "low": None, "high": None}

    def units(self, k: int, stage: str) -> list[tuple[str, int, Any]]:
        """(item, key, the judge's verdict) of each unit to label, in the queue's order."""
        state = self.state(k)
        if stage != SCORE:
            if stage not in state.stages:
                raise KeyError(f"stage {stage!r}")
            return [(u.item, u.key, u.combined) for u in state.stages[stage]]
        from .labels import read_queue

        drawn = read_queue(self.paths[k])
        if drawn is None:
            return [(r["id"], 0, r["score"]) for r in state.rows if r["score"] is not None]
        by_id = {r["id"]: r["score"] for r in state.rows}
        return [(i, 0, by_id[i]) for i in drawn if i in by_id]

    def queue(self, k: int, annotator: str, stage: str = SCORE) -> dict[str, Any]:
        """Run k's labelling queue of ``stage`` with what a person reads of each unit; the
        judge's verdict and the labels already given come only for units this annotator
        labelled."""
        state = self.state(k)
        mine = annotator_units(self.paths[k], stage).get(annotator, {})
        overrides = read_overrides(self.paths[k]) if stage == SCORE else {}
        out = []
        for item, key, verdict in self.units(k, stage):
            record: ItemResult = state.records[state.index[item]]
            text = state.texts.text(record)
            entry = {
                "id": item,
                "key": key,
                "input": text.input if text else "",
                "answer": (text.answer if text else None) or "",
                "reference": (text.reference if text else None) or "",
            }
            if (item, key) in mine:  # blind until labelled
                entry |= {"label": mine[(item, key)], "judge": verdict}
                if item in overrides:
                    entry["override"] = {
                        "score": overrides[item].score,
                        "reason": overrides[item].reason,
                    }
            out.append(entry)
        return {
            "run": str(self.paths[k]),
            "stage": stage,
            "stages": [SCORE, *sorted(state.stages)],
            "items": out,
            "agreement": self._annotators(k, stage),
        } | self.choices(k, stage)

    def _annotators(self, k: int, stage: str) -> dict[str, Any] | None:
        """Several annotators' agreement with each other and with the judge (Krippendorff's
        alpha at the stage's level), on the units labelled by all of them."""
        from .agreement import raters_agreement

        by = annotator_units(self.paths[k], stage)
        names = sorted(by)
        shared = sorted(set.intersection(*(set(v) for v in by.values()))) if by else []
        if not shared:
            return None
        judge = {(i, n): v for i, n, v in self.units(k, stage)}
        units = [
            Unit(i, stage, n, [judge.get((i, n)), *(by[a][(i, n)] for a in names)])
            for i, n in shared
        ]
        rule = None if stage == SCORE else self.state(k).texts.framework.panel_rule(stage)
        stats = raters_agreement(units, ["judge", *names], rule)
        return {"annotators": names, "items": len(shared), "alpha": stats["alpha"]}

    # ---- writing -------------------------------------------------------------------------

    def add_label(self, k: int, body: dict[str, Any]) -> dict[str, Any]:
        state = self.state(k)
        item, annotator = _text(body, "id"), _text(body, "annotator")
        stage = body.get("stage", SCORE)
        key = body.get("key", 0)
        if item not in state.index:
            raise UserError(f"{item!r}: not an item of run {k}")
        if not isinstance(stage, str) or (stage != SCORE and stage not in state.stages):
            raise UserError(f"stage: {stage!r} is not a judging stage of run {k}")
        if stage == SCORE:  # the item's score: one unit, whether the queue drew it or not
            key, judge = 0, state.records[state.index[item]].score
        else:
            verdicts = {(i, n): v for i, n, v in self.units(k, stage) if i == item}
            if isinstance(key, bool) or not isinstance(key, int) or (item, key) not in verdicts:
                raise UserError(f"key: item {item!r} has no unit {key!r} of stage {stage}")
            judge = verdicts[(item, key)]
        label = checked_label(body.get("label"), self.choices(k, stage))
        line = {"id": item, "stage": stage, "key": key, "label": label}
        line |= {"annotator": annotator, "judge": judge, "source": "view"}
        if isinstance(body.get("note"), str) and body["note"].strip():
            line["note"] = body["note"].strip()[:2000]
        append_labels(self.paths[k], [line])
        return {"id": item, "key": key, "label": label, "judge": judge}

    def override(self, k: int, body: dict[str, Any]) -> dict[str, Any]:
        state = self.state(k)
        item, annotator = _text(body, "id"), _text(body, "annotator")
        if body.get("withdraw"):
            withdraw_override(self.paths[k], item, annotator)
            return {"id": item, "withdrawn": True}
        score = body.get("score")
        records = {item: state.records[state.index[item]]} if item in state.index else {}
        found = add_override(
            self.paths[k], records, item, score, str(body.get("reason", "")), annotator
        )
        return {"id": item, "score": found.score, "judge": found.judge}


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _text(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise UserError(f"{field}: missing or not a short text")
    return value.strip()


def checked_label(label: Any, how: dict[str, Any]) -> Any:
    """A label as the stage takes it: one of its labels, or a number in its range."""
    if how["kind"] == "labels":
        if label not in how["choices"]:
            raise UserError(f"label: one of {how['choices']}, got {label!r}")
        return label
    if not isinstance(label, int | float) or isinstance(label, bool):
        raise UserError(f"label: a number, got {label!r}")
    low, high = how.get("low"), how.get("high")
    if (low is not None and label < low) or (high is not None and label > high):
        raise UserError(f"label: a score from {low} to {high}, got {label!r}")
    return float(label)


# ---- the HTTP server -----------------------------------------------------------------------


def make_server(
    viewer: Viewer, host: str, port: int, allowed: Callable[[str | None], bool] | None
) -> Any:
    """The viewer's HTTP server (not yet serving); ``allowed``: checks a request's
    Authorization header (off loopback, the key of --api-key-env), None on loopback."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def _authorised(self) -> bool:
            if allowed is None or allowed(self.headers.get("Authorization")):
                return True
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="groundcover"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value, default=str).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if not self._authorised():
                return
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/":
                    self._send(200, viewer.page().encode(), "text/html; charset=utf-8")
                elif url.path == "/label":
                    page = label_page(viewer, int(query.get("run", "0")), query.get("stage"))
                    self._send(200, page.encode(), "text/html; charset=utf-8")
                elif url.path == "/api/items":
                    self._json(200, viewer.items(int(query.get("run", "0")), query))
                elif url.path == "/api/item":
                    self._json(200, viewer.item(int(query.get("run", "0")), query.get("id", "")))
                elif url.path == "/api/queue":
                    run, stage = int(query.get("run", "0")), query.get("stage", SCORE)
                    self._json(200, viewer.queue(run, query.get("annotator", ""), stage))
                else:
                    self._json(404, {"error": "no such page"})
            except (KeyError, ValueError) as exc:
                self._json(404, {"error": f"not found: {exc}"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            refused = self._refused()
            if refused:
                self._json(403, {"error": refused})
                return
            url = urlparse(self.path)
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(min(length, 1 << 20)) or b"{}")
                if not isinstance(body, dict):
                    raise UserError("the body: a JSON object")
                run = int(body.get("run", 0))
                if not 0 <= run < len(viewer.paths):
                    raise UserError(f"run: no run {run}")
                if url.path == "/api/labels":
                    self._json(200, viewer.add_label(run, body))
                elif url.path == "/api/overrides":
                    self._json(200, viewer.override(run, body))
                else:
                    self._json(404, {"error": "no such endpoint"})
            except (UserError, ValueError, json.JSONDecodeError) as exc:
                self._json(400, {"error": str(exc)})

        def _refused(self) -> str | None:
            """A write comes from our page: its token, and its own origin where a browser
            says one (another site's form or script says its own)."""
            given = self.headers.get("X-Groundcover-Token", "")
            if not hmac.compare_digest(given.encode(), viewer.token.encode()):
                return "a write needs the page's token"
            origin = self.headers.get("Origin")
            expected = f"http://{self.headers.get('Host', '')}"
            if origin is not None and origin != expected:
                return f"refused: a write from another origin ({origin})"
            if self.headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
                return "refused: a cross-site write"
            return None

        def log_message(self, *args) -> None:
            pass

    return http.server.ThreadingHTTPServer((host, port), Handler)


def serve(
    viewer: Viewer,
    host: str,
    port: int,
    allowed: Callable[[str | None], bool] | None,
    announce: Callable[[str], None],
) -> None:
    """Serve until Ctrl-C."""
    server = make_server(viewer, host, port, allowed)
    announce(f"report at http://{host}:{server.server_address[1]}/  (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def label_page(viewer: Viewer, run: int, stage: str | None = None) -> str:
    from jinja2 import Environment, select_autoescape

    if not 0 <= run < len(viewer.paths):
        raise KeyError(run)
    stage = stage or SCORE
    how = viewer.choices(run, stage)
    stages = [SCORE, *sorted(viewer.state(run).stages)]
    environment = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    template = environment.from_string(LABEL_PAGE.read_text(encoding="utf-8"))
    return template.render(
        run=run,
        path=str(viewer.paths[run]),
        token=viewer.token,
        stage=stage,
        stages=stages,
        choices=how["choices"],
        free=how["kind"] == "number" and stage != SCORE,
    )
