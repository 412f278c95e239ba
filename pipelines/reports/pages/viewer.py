"""``groundcover view``: the runs' page served on 127.0.0.1, page by page, with labelling.

- ``GET /``: the report page without its items (a million-item run opens as fast as a small
  one); the items come from ``/api/items``, filtered, searched and paged by the server.
- ``GET /label?run=K[&stage=S]``: the labelling page of run K's score (its queue from
  ``agreement --sample``, else every scored item) or of one judging stage (every unit a panel,
  a judge cascade, a lone judge with ``--confidence logprobs`` or an NLI model decided), one
  at a time: the question, the answer under judgement and the reference, the stage's labels
  (or the score scale) as buttons with keys 1-9, a note, progress. Blind by default: the
  judge's verdict shows only after the label is given. An override of an item's score (with a
  reason) is a layer over the records (``overrides``).
- ``POST /api/labels`` and ``/api/overrides``: written only with the page's per-session token
  (``X-Groundcover-Token``) from the page's own origin: another site's form or script is
  refused. Runs are named by their number on the command line and items by their ids in the
  run: nothing a request says becomes a path. Two browsers at once lose nothing (each label is
  one append).

The run's page and rows are kept until its records or labels change on disk (a running
evaluation still shows its progress on the next request).
"""

from __future__ import annotations

import functools
import hmac
import json
import math
import mmap
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlparse

from ...runtime.contract.errors import UserError
from ...runtime.store.labels import TEXT_LIMIT
from ...runtime.store.run_dir import RESULTS
from ..audits.agreement import Unit
from ..people.choices import SCALE as SCALE
from ..people.choices import SCORE as SCORE
from ..people.choices import checked_label as checked_label
from ..people.choices import score_choices, stage_choices
from ..people.labels import LABELS_DIR, annotator_units, append_labels
from ..people.overrides import OVERRIDES, add_override, read_overrides, withdraw_override

PAGE_SIZE = 100
LIGHT_ABOVE = 10_000  # records beyond which the first page is the light one, not awaited
LABEL_PAGE = Path(__file__).with_name("label_page.html.j2")


@dataclass
class RunState:
    """What a run's page and requests read, kept until the run changes on disk: the records'
    first fields from one light pass (never the details), the records themselves read by
    offset when one is asked for, and what only the labelling pages need, made when asked."""

    stamp: tuple
    path: Path
    records: Any  # the records view (read on access)
    rows: list[Head]  # id, status, score, explanation: what filters read
    index: dict[str, int]  # id -> position in ``records``
    with_panel: list[int]  # positions of the records whose details hold a panel's verdicts

    @functools.cached_property
    def texts(self) -> Any:
        """``rows.RunRows``: what a person reads of an item (the run's inputs, loaded once)."""
        from ..exports.rows import run_rows

        return run_rows(self.path, self.records)

    @functools.cached_property
    def stages(self) -> dict[str, list[Unit]]:
        """Per judging stage, the units a panel or a judge cascade decided, an abstained one
        included (only the records holding them read)."""
        from ..audits.agreement import judged_units

        stages: dict[str, list[Unit]] = {}
        for k in self.with_panel:
            for stage, units in judged_units([self.records[k]]).items():
                stages.setdefault(stage, []).extend(units)
        return stages


def light_state(path: Path, stamp: tuple) -> RunState:
    """One pass over the run's results files reading each record's id, status, score and
    explanation only (the fields a record starts with), with the run store's own rule for
    which record of an id survives."""
    from ...runtime.store.run_dir import index_files, records_view, result_files

    files = [f for f in result_files(path) if f.exists()] or [path / RESULTS]
    heads: dict[tuple[int, int], Head] = {}
    numbers = {file: n for n, file in enumerate(files)}

    def scan(file: Path) -> Iterator[tuple[str, int, str]]:
        number = numbers[file]
        for head in scan_heads(file):
            heads[(number, head.offset)] = head
            yield head.id, head.offset, head.status

    if len(files) == 1:  # the usual run: a later record of an id supersedes an earlier one
        survivors = {head.id: head for head in scan_heads(files[0])}
        ids = sorted(survivors)
        chosen = [survivors[i] for i in ids]
        entries = [(0, head.offset, head.status) for head in chosen]
    else:
        index = index_files(files, scan)
        ids = sorted(index)
        entries = [index[i] for i in ids]
        chosen = [heads[(number, offset)] for number, offset, _ in entries]
    with_panel = [k for k, head in enumerate(chosen) if head.panel]
    positions = {record_id: k for k, record_id in enumerate(ids)}
    return RunState(stamp, path, records_view(files, entries), chosen, positions, with_panel)


class Head(NamedTuple):
    """A record's leading fields, where it starts, and whether it holds a panel's verdicts."""

    id: str
    status: str
    score: float | None
    explanation: str
    offset: int
    panel: bool


# A record as the run store writes it: id, status, score and explanation before anything else
# (``ItemResult``'s field order). A JSON string's quotes inside it are escaped, so a string
# ends at the first unescaped quote.
_STRING = rb'"([^"\\]*(?:\\.[^"\\]*)*)"'
_HEAD = re.compile(
    rb'\{"id":'
    + _STRING
    + rb',"status":"(\w+)","score":(null|[-+0-9.eE]+),"explanation":'
    + _STRING
)
# a panel's, a judge cascade's, or a lone judge's with their confidences (an NLI model's too)
_PANEL = re.compile(rb'"(?:panel|cascade|confidence)":\[')


def scan_heads(file: Path) -> Iterator[Head]:
    """Each whole record of one results file, read for its leading fields by one regular
    expression over the mapped file (no record parsed whole); a line written otherwise is
    parsed whole. A torn last line is not a record."""
    if not file.exists() or file.stat().st_size == 0:
        return
    with open(file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        panels = [m.start() for m in _PANEL.finditer(data)]
        panels.append(len(data))  # a sentinel: the next panel at or after a line
        lineno, position, panel, size = 1, 0, 0, len(data)
        match, find = _HEAD.match, data.find
        while position < size:
            end = find(b"\n", position)
            if end < 0:
                return  # torn tail: not a finished record
            while panels[panel] < position:
                panel += 1
            found = match(data, position, end)
            if found is None:
                yield _slow(file, lineno, data[position : end + 1], position, panels[panel] < end)
            else:
                record_id, status, score, explanation = found.groups()
                yield Head(
                    record_id.decode() if b"\\" not in record_id else _string(record_id),
                    status.decode(),
                    None if score == b"null" else float(score),
                    explanation.decode() if b"\\" not in explanation else _string(explanation),
                    position,
                    panels[panel] < end,
                )
            position, lineno = end + 1, lineno + 1


def _string(raw: bytes) -> str:
    """A JSON string's inside as text, its escapes decoded."""
    return json.loads(b'"' + raw + b'"')


def _slow(file: Path, lineno: int, line: bytes, offset: int, panel: bool) -> Head:
    from ...runtime.store.run_dir import RunStoreError

    try:
        record = json.loads(line)
        score = record.get("score")
        return Head(
            str(record["id"]),
            str(record["status"]),
            None if score is None else float(score),
            str(record.get("explanation", "")),
            offset,
            panel,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise RunStoreError(f"{file}:{lineno}: corrupt record: id or status") from None


class Viewer:
    def __init__(self, paths: list[Path], prices: dict[str, Any] | None = None):
        self.paths = paths
        self.prices = prices
        self.token = secrets.token_urlsafe(24)  # every write shows it: a page of ours
        self.lock = threading.Lock()
        self.states: dict[int, RunState] = {}
        self.pages: dict[tuple, str] = {}
        self.jobs: dict[tuple, threading.Thread] = {}

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
        state = light_state(self.paths[k], stamp)
        with self.lock:
            self.states[k] = state
        return state

    def page(self) -> str:
        """The report page without its items (they are fetched by page). Its tables, figures
        and agreement need every record parsed: they are made in the background. Runs of up to
        ``LIGHT_ABOVE`` records wait for them; a larger one's page comes from the light pass
        at once, says so, and reloads itself when the whole page is ready."""
        key = self.page_key()
        with self.lock:
            if key in self.pages:
                return self.pages[key]
        light = {k: self.state(k).rows for k in range(len(self.paths))}  # the light pass first
        if sum(map(len, light.values())) <= LIGHT_ABOVE:
            self._start(key).join()
            with self.lock:
                if key in self.pages:
                    return self.pages[key]
        from .report_html import render

        html = render(self.paths, prices=self.prices, served=True, light=light)
        self._start(key)  # after the light page: the two would share one interpreter's time
        return html

    def _start(self, key: tuple) -> threading.Thread:
        """The whole page's making for ``key``, started once."""
        with self.lock:
            job = self.jobs.get(key)
            if job is None:
                job = threading.Thread(target=self._render, args=(key,), daemon=True)
                self.jobs = {key: job}
                job.start()
        return job

    def page_key(self) -> tuple:
        # the headline shows the overrides; labels are read by the labelling page itself
        return tuple(self.stamp(k, OVERRIDES) for k in range(len(self.paths)))

    def ready(self) -> bool:
        """Whether the whole page of the runs as they are now is made."""
        key = self.page_key()
        with self.lock:
            return key in self.pages

    def _render(self, key: tuple) -> None:
        from .report_html import render

        try:
            html = render(self.paths, prices=self.prices, served=True)
        except Exception as exc:  # shown on the page in place of the tables, never a hang
            html = f"<!DOCTYPE html><p>the report could not be made: {escape(str(exc))}</p>"
        with self.lock:
            self.pages = {key: html}

    def items(self, k: int, query: dict[str, str]) -> dict[str, Any]:
        """One page of run k's items, filtered and searched here."""
        state = self.state(k)
        status, text = query.get("status", ""), query.get("q", "").lower()
        low, high = _number(query.get("min")), _number(query.get("max"))
        found = []
        for row in state.rows:
            score = row.score
            if status and row.status != status:
                continue
            if low is not None and not (score is not None and score >= low):
                continue
            if high is not None and not (score is not None and score <= high):
                continue
            if text and text not in f"{row.id} {row.explanation}".lower():
                continue
            found.append(row.id)
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

    def unit(
        self, k: int, item: str, stage: str | None = None, key: int | None = None
    ) -> dict[str, Any]:
        """What a person reads of one item: the question, the answer judged, the reference;
        for the ``key``-th unit of a panel ``stage``, also what the judge read for it (the
        values its prompt was rendered with: a passage judged on its own, say)."""
        state = self.state(k)
        if item not in state.index:
            raise KeyError(item)
        record = state.records[state.index[item]]
        text = state.texts.text(record)
        found = {
            "id": item,
            "input": text.input if text else "",
            "answer": (text.answer if text else None) or "",
            "reference": (text.reference if text else None) or "",
        }
        if stage not in (None, SCORE) and key is not None:
            judged = judged_values(state.texts, record, stage, key)
            if judged is not None:
                found["judged"] = judged
        return found

    def choices(self, k: int, stage: str) -> dict[str, Any]:
        """What a person labels ``stage`` with (``people.choices``): ``labels`` (one of the
        stage's labels), ``number`` (buttons for the usual values, any number accepted) or
        ``set`` (the numbers of the items it covers, as the unit lists them: "1, 3", or
        "none")."""
        if stage == SCORE:
            return score_choices()
        state = self.state(k)
        if stage not in state.stages:
            raise KeyError(f"stage {stage!r}")
        return stage_choices(state.texts.framework.panel_rule(stage), state.stages[stage])

    def units(self, k: int, stage: str) -> list[tuple[str, int, Any]]:
        """(item, key, the judge's verdict) of each unit to label, in the queue's order."""
        state = self.state(k)
        if stage != SCORE:
            if stage not in state.stages:
                raise KeyError(f"stage {stage!r}")
            every = [(u.item, u.key, u.combined) for u in state.stages[stage]]
            return drawn_first(every, self.drawn(k, stage))
        from ..people.labels import read_queue

        drawn = read_queue(self.paths[k])
        if drawn is None:
            return [(r.id, 0, r.score) for r in state.rows if r.score is not None]
        by_id = {r.id: r.score for r in state.rows}
        return [(i, 0, by_id[i]) for i in drawn if i in by_id]

    def drawn(self, k: int, stage: str) -> list[tuple[str, int]]:
        """The judgements of ``stage`` drawn for a cascade's calibration (``labels queue
        --for-calibration``), in the order drawn."""
        from ..audits.cascade import read_draws

        draws = [found for found in read_draws(self.paths[k]) if found["stage"] == stage]
        return [unit for found in draws for unit in found["units"]]

    def calibration(self, k: int, stage: str) -> dict[str, Any] | None:
        """What people's labels of ``stage`` give its cascade tier now: its threshold, or the
        agreeing labels still needed for one (None: the stage has no confidence)."""
        if stage == SCORE:
            return None
        from ..audits.cascade_queue import progress

        try:
            return progress(self.paths[k], stage)
        except (UserError, KeyError, ValueError):  # a run it cannot read as a tier: nothing said
            return None

    def queue(self, k: int, annotator: str, stage: str = SCORE) -> dict[str, Any]:
        """Run k's labelling queue of ``stage``: each unit, and the judge's verdict and the label
        given only for units this annotator labelled (what a person reads of a unit comes from
        ``unit``, as the page shows it: a queue of every item of a large run stays small)."""
        mine = annotator_units(self.paths[k], stage).get(annotator, {})
        overrides = read_overrides(self.paths[k]) if stage == SCORE else {}
        out = []
        for item, key, verdict in self.units(k, stage):
            entry: dict[str, Any] = {"id": item, "key": key}
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
            "stages": [SCORE, *sorted(self.state(k).stages)],
            "items": out,
            "agreement": self._annotators(k, stage),
            "calibration": self.calibration(k, stage),
        } | self.choices(k, stage)

    def _annotators(self, k: int, stage: str) -> dict[str, Any] | None:
        """Several annotators' agreement with each other and with the judge (Krippendorff's
        alpha at the stage's level), on the units labelled by all of them."""
        from ..audits.agreement import raters_agreement

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
        line = self.label_line(k, body, "view")
        append_labels(self.paths[k], [line])
        return {name: line[name] for name in ("id", "key", "label", "judge")}

    def label_line(self, k: int, body: dict[str, Any], source: str) -> dict[str, Any]:
        """A person's label of a unit of run k (``body``: its id, stage, key, label, annotator
        and note), checked as the labelling page checks it, as ``labels.jsonl`` keeps it."""
        state = self.state(k)
        item, annotator = _item_id(body), _text(body, "annotator")
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
        line |= {"annotator": annotator, "judge": judge, "source": source}
        note = body.get("note")
        if note is not None and not isinstance(note, str):
            raise UserError("note: a text")
        if note and note.strip():
            line["note"] = note.strip()[:TEXT_LIMIT]
        return line

    def override(self, k: int, body: dict[str, Any]) -> dict[str, Any]:
        state = self.state(k)
        item, annotator = _item_id(body), _text(body, "annotator")
        withdraw = body.get("withdraw", False)
        if not isinstance(withdraw, bool):
            raise UserError("withdraw: true or false")
        if withdraw:
            withdraw_override(self.paths[k], item, annotator)
            return {"id": item, "withdrawn": True}
        score, reason = body.get("score"), body.get("reason", "")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1
        ):
            raise UserError(f"score: a number from 0 to 1 or null, got {score!r}")
        if not isinstance(reason, str):
            raise UserError("reason: a text")
        records = {item: state.records[state.index[item]]} if item in state.index else {}
        found = add_override(self.paths[k], records, item, score, reason, annotator)
        return {"id": item, "score": found.score, "judge": found.judge}


def drawn_first(
    units: list[tuple[str, int, Any]], drawn: list[tuple[str, int]]
) -> list[tuple[str, int, Any]]:
    """``units`` with the drawn ones first, in the order drawn (each once), then the rest."""
    by_unit = {(item, key): (item, key, verdict) for item, key, verdict in units}
    first = [by_unit[u] for u in dict.fromkeys(drawn) if u in by_unit]
    chosen = {(item, key) for item, key, _ in first}
    return first + [u for u in units if (u[0], u[1]) not in chosen]


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _item_id(body: dict[str, Any]) -> str:
    """An item's id exactly as the run has it (an id may begin or end with blanks: never
    stripped, or it names another item or none)."""
    value = body.get("id")
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise UserError("id: missing or not an item's id")
    return value


def _text(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise UserError(f"{field}: missing or not a short text")
    return value.strip()


# ---- the HTTP server -----------------------------------------------------------------------

DEFAULT_PORT = 8765  # the usual port; taken, a free one is used (and printed)
MAX_BODY = 1 << 20  # a label or an override is a few hundred bytes
SOCKET_SECONDS = 30.0  # silence on a connection before the viewer closes it


class Refused(Exception):
    """A request answered with a 4xx and one line saying why (the server stays up)."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def own_names(host: str, port: int) -> frozenset[str]:
    """The ``Host`` values (lower case) a request to this server may carry: the loopback
    names and the bound host, on the served port. Any other name is refused, whatever it
    resolves to: a page on another name that resolves to 127.0.0.1 (DNS rebinding) reaches
    the server but is not answered."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if host not in ("", "0.0.0.0", "::"):  # a wildcard bind has no name of its own
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset(f"{name.lower()}:{port}" for name in names)


def _not_a_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(raw: bytes) -> dict[str, Any]:
    """A write's body: one JSON object (NaN and Infinity refused: they are not JSON)."""
    try:
        body = json.loads(raw or b"{}", parse_constant=_not_a_constant)
    except (ValueError, RecursionError) as exc:
        raise Refused(400, f"the body: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body: a JSON object")
    return body


def body_length(header: str | None) -> int:
    """``Content-Length`` as the server takes it: given, a whole number, at most ``MAX_BODY``."""
    if header is None:
        raise Refused(411, "a write needs a Content-Length")
    if not header.strip().isdigit():
        raise Refused(400, f"Content-Length: a whole number of bytes, got {header!r}")
    length = int(header)
    if length > MAX_BODY:
        raise Refused(413, f"the body: at most {MAX_BODY} bytes, got {length}")
    return length


def run_number(value: Any, runs: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(400, f"run: a run's number, got {value!r}")
    if not 0 <= value < runs:
        raise Refused(400, f"run: no run {value}")
    return value


def finite(value: Any) -> Any:
    """``value`` with every non-finite number as null: JSON has no NaN (a record or label
    from elsewhere may hold one)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def make_server(
    viewer: Viewer, host: str, port: int, allowed: Callable[[str | None], bool] | None
) -> Any:
    """The viewer's HTTP server (not yet serving); ``allowed``: checks a request's
    Authorization header (off loopback, the key of --api-key-env), None on loopback. ``port``
    0 picks a free one."""
    import http.server

    names: frozenset[str] = frozenset()

    class Handler(http.server.BaseHTTPRequestHandler):
        # a connection that sends nothing (half-open, or a slow client holding a thread) is
        # closed after this many seconds of silence instead of being held forever
        timeout = SOCKET_SECONDS

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
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            text = json.dumps(finite(value), default=str, allow_nan=False)
            self._send(status, text.encode(), "application/json")

        def _answer(self, route: Callable[[], None]) -> None:
            """One request: our own name, authorised, routed; a refusal is a 4xx with its
            reason, anything unforeseen a 500: the connection is answered, the server stays."""
            try:
                if str(self.headers.get("Host", "")).lower() not in names:
                    raise Refused(421, "this server answers only to its own names")
                if not self._authorised():
                    return
                route()
            except Refused as exc:
                self._json(exc.status, {"error": str(exc)})
            except UserError as exc:
                self._json(400, {"error": str(exc)})
            except (KeyError, ValueError) as exc:
                self._json(404, {"error": f"not found: {exc}"})
            except Exception as exc:  # noqa: BLE001 - never a dropped connection
                self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self._answer(self._get)

        def do_POST(self) -> None:  # noqa: N802
            self._answer(self._post)

        def _not_allowed(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "GET, POST")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = (  # noqa: N815
            _not_allowed
        )

        def _get(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if url.path == "/":
                self._send(200, viewer.page().encode(), "text/html; charset=utf-8")
            elif url.path == "/label":
                page = label_page(viewer, int(query.get("run", "0")), query.get("stage"))
                self._send(200, page.encode(), "text/html; charset=utf-8")
            elif url.path == "/api/unit":
                key = query.get("key")
                found = viewer.unit(
                    int(query.get("run", "0")),
                    query.get("id", ""),
                    query.get("stage"),
                    int(key) if key is not None and key.isdigit() else None,
                )
                self._json(200, found)
            elif url.path == "/api/calibration":
                run, stage = int(query.get("run", "0")), query.get("stage", SCORE)
                self._json(200, {"calibration": viewer.calibration(run, stage)})
            elif url.path == "/api/ready":
                self._json(200, {"ready": viewer.ready()})
            elif url.path == "/api/items":
                self._json(200, viewer.items(int(query.get("run", "0")), query))
            elif url.path == "/api/item":
                self._json(200, viewer.item(int(query.get("run", "0")), query.get("id", "")))
            elif url.path == "/api/queue":
                run, stage = int(query.get("run", "0")), query.get("stage", SCORE)
                self._json(200, viewer.queue(run, query.get("annotator", ""), stage))
            else:
                self._json(404, {"error": "no such page"})

        def _post(self) -> None:
            refused = self._refused()
            if refused:
                raise Refused(403, refused)
            url = urlparse(self.path)
            length = body_length(self.headers.get("Content-Length"))
            body = parse_body(self.rfile.read(length))
            run = run_number(body.get("run", 0), len(viewer.paths))
            if url.path == "/api/labels":
                self._json(200, viewer.add_label(run, body))
            elif url.path == "/api/overrides":
                self._json(200, viewer.override(run, body))
            else:
                self._json(404, {"error": "no such endpoint"})

        def _refused(self) -> str | None:
            """A write comes from our page: its token, and one of our own origins where a
            browser says one (another site's form or script says its own)."""
            given = self.headers.get("X-Groundcover-Token", "")
            if not hmac.compare_digest(given.encode(), viewer.token.encode()):
                return "a write needs the page's token"
            origin = self.headers.get("Origin")
            if origin is not None and origin.lower().removeprefix("http://") not in names:
                return f"refused: a write from another origin ({origin})"
            if self.headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
                return "refused: a cross-site write"
            return None

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    names = own_names(host, server.server_address[1])
    return server


def bind(
    viewer: Viewer,
    host: str,
    port: int | None,
    allowed: Callable[[str | None], bool] | None,
) -> Any:
    """``make_server`` on ``port``; ``None``: the usual port, or a free one when it is taken."""
    import errno

    if port is not None:
        return make_server(viewer, host, port, allowed)
    try:
        return make_server(viewer, host, DEFAULT_PORT, allowed)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return make_server(viewer, host, 0, allowed)


def serve(
    viewer: Viewer,
    host: str,
    port: int | None,
    allowed: Callable[[str | None], bool] | None,
    announce: Callable[[str], None],
) -> None:
    """Serve until Ctrl-C."""
    server = bind(viewer, host, port, allowed)
    shown = f"[{host}]" if ":" in host else host
    announce(f"report at http://{shown}:{server.server_address[1]}/  (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def label_page(viewer: Viewer, run: int, stage: str | None = None) -> str:
    from .report_html import page_environment

    if not 0 <= run < len(viewer.paths):
        raise KeyError(run)
    stage = stage or SCORE
    how = viewer.choices(run, stage)
    stages = [SCORE, *sorted(viewer.state(run).stages)]
    template = page_environment().from_string(LABEL_PAGE.read_text(encoding="utf-8"))
    return template.render(
        run=run,
        path=str(viewer.paths[run]),
        token=viewer.token,
        stage=stage,
        stages=stages,
        choices=how["choices"],
        free=(how["kind"] == "number" and stage != SCORE) or how["kind"] == "set",
        free_kind=how["kind"],
    )


def judged_values(run: Any, record: Any, stage: str, key: int) -> dict[str, str] | None:
    """What the judge read for the ``key``-th time a panel decided ``stage`` for ``record``:
    the values of the framework's recorded judgement whose digest the panel entry keeps, or
    those a judge cascade kept with a judgement it abstained on (None where neither is there,
    or the run's inputs changed)."""
    from ...runtime.contract.panels import asked_digest, shown

    entries = [
        entry
        for field in ("panel", "cascade", "confidence")  # a stage is in one of them
        for entry in record.details.get(field) or []
        if entry.get("stage") == stage
    ]
    if key >= len(entries) or "asked" not in entries[key]:
        return None
    kept = entries[key].get("values")
    if isinstance(kept, dict):  # an abstained judgement: its own, as text
        return {str(name): str(value) for name, value in kept.items()}
    item = (run.items or {}).get(record.id)
    if item is None:
        return None
    for judgement in run.framework.judgements(item, record, run.options):
        if judgement.stage == stage and asked_digest(judgement.values) == entries[key]["asked"]:
            return {name: shown(value) for name, value in judgement.values.items()}
    return None
