"""Labels exchanged with annotation tools: a run's labelling queue out, people's labels back in.

- **Label Studio**: ``labels export RUN tasks.json`` writes Label Studio's import layout (a JSON
  list of tasks, each ``{"data": {...}}``) with the labelling configuration beside it
  (``tasks.label-config.xml``: the question, the answer and the reference as text, a ``Number``
  control named ``score`` on the framework's 0-1 scale and a ``TextArea`` named ``note``). The
  judge's verdict is not in the task: people label blind. ``labels import RUN export.json``
  reads Label Studio's JSON export (tasks with their ``annotations``: each a ``result`` list of
  ``{"from_name", "to_name", "type", "value"}``; ``completed_by`` the annotator; cancelled
  annotations skipped).
- **CSV**: the same columns a spreadsheet fills in (``id, input, answer, reference, score, note,
  annotator``); rows without a score are not labels. A CSV with the columns ``stage`` and
  ``label`` (and ``key``: the unit's number within the item and stage, 0 when absent) holds
  labels of judgements instead: what a judge cascade calibrates on and what people decide of
  the judgements it abstained on, each checked as the labelling page checks it (one of the
  stage's labels, a number, or a set of numbers "1, 3"). Nothing is imported when one row is
  wrong.
- **Judgements in Label Studio**: ``labels export RUN tasks.json --stage S`` writes a task per
  judgement of stage S (its ``data``: id, stage, key, what the judge was asked) with a
  configuration whose control ``label`` fits the stage: ``Choices`` of its labels, a ``Number``
  for a rating, a ``TextArea`` for the covered items of a set ("1, 3"). Their export comes back
  as judgement labels, checked and imported all or nothing as the CSV's are.

Imported labels are appended to the run's ``labels/labels.jsonl`` (``labels``) with the judge's
score at import time beside them; the run's records never change.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from ....serving.files import atomic_file, check_within, write_atomic
from ...runtime.contract.errors import UserError
from ...runtime.store.run_dir import RESULTS, results_by_id
from ..exports.rows import run_rows
from .choices import written_label
from .labels import QUEUE, append_labels, labels_dir

SCORE, NOTE, LABEL = "score", "note", "label"
CSV_COLUMNS = ("id", "input", "answer", "reference", "score", "note", "annotator")
# a judging stage's units to label (``labels export --stage``): what `labels import` reads back
STAGE_COLUMNS = (
    "id",
    "stage",
    "key",
    "input",
    "answer",
    "asked",
    "choose",
    "label",
    "note",
    "annotator",
)


def export_stage(run_dir: Path, out: Path, stage: str, kind: str = "csv") -> list[Path]:
    """Every unit of a judging stage to label, blind: the question, the answer, what the judge
    was asked (its prompt's values, as text) and what a label may be; not the judge's verdict.
    As a CSV to fill in (``label``), or as Label Studio tasks with a labelling configuration
    for the stage's kind of verdict beside them."""
    from ..pages.viewer import Viewer

    viewer = Viewer([run_dir])
    try:
        how = viewer.choices(0, stage)
        units = viewer.units(0, stage)
    except KeyError:
        stages = ", ".join(sorted(viewer.state(0).stages)) or "none"
        raise UserError(f"--stage {stage}: not a judging stage of this run ({stages})") from None
    choose = {
        "labels": "one of: " + ", ".join(str(c) for c in how["choices"]),
        "number": "a number",
        "set": "the numbers of the items covered, as 1, 3 (or none)",
    }[how["kind"]]
    rows = []
    for item, key, _verdict in units:
        shown = viewer.unit(0, item, stage, key)
        asked = "\n".join(f"{name}: {value}" for name, value in (shown.get("judged") or {}).items())
        rows.append(
            {"id": item, "stage": stage, "key": key, "input": shown["input"]}
            | {"answer": shown["answer"], "asked": asked, "choose": choose}
        )
    if kind == "label-studio":
        tasks = [{"data": row | {"run": str(run_dir)}} for row in rows]
        return write_label_studio(out, tasks, stage_label_config(how))
    if kind != "csv":
        raise UserError(f"--format must be label-studio or csv, got {kind!r}")
    return [write_sheet(out, STAGE_COLUMNS, rows)]


def stage_label_config(how: dict[str, Any]) -> str:
    """Label Studio's labelling interface for one judgement of a stage: what the judge was
    asked, shown as text, and a control named ``label`` for the stage's kind of verdict (one
    of its labels, a number, or the covered items typed as "1, 3")."""
    if how["kind"] == "labels":
        options = "".join(f"    <Choice value={quoteattr(str(c))}/>\n" for c in how["choices"])
        control = (
            f'  <Choices name={quoteattr(LABEL)} toName="asked" choice="single-radio" '
            f'required="true">\n{options}  </Choices>\n'
        )
    elif how["kind"] == "number":
        bounds = "".join(
            f" {name}={quoteattr(str(how[field]))}"
            for name, field in (("min", "low"), ("max", "high"))
            if how.get(field) is not None
        )
        whole = all(float(c).is_integer() for c in how["choices"])
        step = "" if whole and how.get("high") is None else ' step="any"'
        control = (
            f'  <Number name={quoteattr(LABEL)} toName="asked"{bounds}{step} required="true"/>\n'
        )
    else:
        control = (
            f'  <TextArea name={quoteattr(LABEL)} toName="asked" maxSubmissions="1" '
            'required="true" placeholder="the covered items: 1, 3 (or none)"/>\n'
        )
    return (
        "<View>\n"
        '  <Header value="Question"/>\n  <Text name="input" value="$input"/>\n'
        '  <Header value="Answer"/>\n  <Text name="answer" value="$answer"/>\n'
        '  <Header value="What the judge was asked"/>\n  <Text name="asked" value="$asked"/>\n'
        '  <Header value="Your label"/>\n  <Text name="choose" value="$choose"/>\n'
        f"{control}"
        f'  <TextArea name={quoteattr(NOTE)} toName="asked" maxSubmissions="1"/>\n'
        "</View>\n"
    )


def write_sheet(out: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> Path:
    """``rows`` as a CSV with ``columns`` (a missing cell empty; a cell a spreadsheet would
    read as a formula quoted), written whole or not at all."""
    from ..exports.cells import spreadsheet_row

    with atomic_file(out) as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(spreadsheet_row({k: r.get(k, "") for k in columns}) for r in rows)
    return out


def write_label_studio(out: Path, tasks: list[dict[str, Any]], config: str) -> list[Path]:
    """Label Studio's tasks as ``out`` (the file the user typed) and its labelling
    configuration beside it (a name made here: a link at it is refused, not followed)."""
    beside = out.with_name(f"{out.stem}.label-config.xml")
    check_within(beside, out.parent)  # a link there refused before anything is written
    write_atomic(out, json.dumps(tasks, ensure_ascii=False, indent=1))
    write_atomic(beside, config, within=out.parent)
    return [out, beside]


def export_tasks(run_dir: Path, out: Path, kind: str) -> list[Path]:
    """The run's labelling queue (every scored item where it has none) for a tool."""
    tasks = _tasks(run_dir)
    if kind == "label-studio":
        return write_label_studio(out, [{"data": t} for t in tasks], label_config())
    if kind != "csv":
        raise UserError(f"--format must be label-studio or csv, got {kind!r}")
    return [write_sheet(out, CSV_COLUMNS, tasks)]


def label_config() -> str:
    """Label Studio's labelling interface for an item's score."""
    scale = 'min="0" max="1" step="0.01" required="true"'
    return (
        "<View>\n"
        '  <Header value="Question"/>\n  <Text name="input" value="$input"/>\n'
        '  <Header value="Answer"/>\n  <Text name="answer" value="$answer"/>\n'
        '  <Header value="Reference"/>\n  <Text name="reference" value="$reference"/>\n'
        f'  <Number name={quoteattr(SCORE)} toName="answer" {scale}/>\n'
        f'  <TextArea name={quoteattr(NOTE)} toName="answer" maxSubmissions="1"/>\n'
        "</View>\n"
    )


def _tasks(run_dir: Path) -> list[dict[str, Any]]:
    run = run_rows(run_dir)
    records = {r.id: r for r in run.records}
    queue = labels_dir(run_dir) / QUEUE
    if queue.is_file():
        from ...runtime.contract.readers import iter_jsonl

        ids = [str(row["id"]) for n, row in iter_jsonl(queue) if not (n == 1 and "queue" in row)]
    else:
        ids = [i for i, r in records.items() if r.score is not None]
    tasks = []
    for item in ids:
        text = run.text(records[item]) if item in records else None
        tasks.append(
            {
                "id": item,
                "input": text.input if text else "",
                "answer": (text.answer if text else None) or "",
                "reference": (text.reference if text else None) or "",
                "run": str(run_dir),
            }
        )
    return tasks


# ---- back in --------------------------------------------------------------------------------


def import_labels(run_dir: Path, path: Path, annotator: str | None = None) -> int:
    """Read a Label Studio JSON export or a CSV of labels into the run; how many labels."""
    if not path.is_file():
        raise UserError(f"labels file not found: {path}")
    judged = {r.id: r.score for r in results_by_id(run_dir / RESULTS)}
    head = path.read_bytes()[:4096].decode("utf-8", errors="ignore").lstrip("\ufeff \t\r\n")
    if not head.startswith("[") and {"stage", "label"} <= set(_csv_columns(path)):
        return _append_judgements(run_dir, path, _stage_csv(run_dir, path, annotator))
    if head.startswith("["):
        tasks = _label_studio_tasks(path)
        if any("stage" in task["data"] for task in tasks):
            return _append_judgements(
                run_dir, path, _stage_label_studio(run_dir, path, tasks, annotator)
            )
    rows = _label_studio(path) if head.startswith("[") else _csv(path)
    labels = []
    for where, item, value, note, who, when in rows:
        if item not in judged:
            raise UserError(f"{where}: record {item!r}: field id: not an item of {run_dir}")
        label = {"id": item, "stage": "score", "key": 0, "label": value, "judge": judged[item]}
        label |= {"annotator": annotator or who or "unknown", "source": path.name}
        if note:
            label["note"] = note
        if when is not None:
            label["time"] = when
        labels.append(label)
    if not labels:
        raise UserError(f"{path}: no labels (no annotation with a score)")
    return append_labels(run_dir, labels)


Row = tuple[str, str, float, str | None, str | None, float | None]


def _label_studio_tasks(path: Path) -> list[dict[str, Any]]:
    """Label Studio's JSON export: its tasks, each with its ``data`` (our task's fields)."""
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a Label Studio JSON export: {exc}") from None
    if not isinstance(tasks, list):
        raise UserError(f"{path}: not a Label Studio JSON export (a list of tasks)")
    for n, task in enumerate(tasks):
        data = task.get("data") if isinstance(task, dict) else None
        if not isinstance(data, dict) or "id" not in data:
            raise UserError(f"{path}: task #{n}: field data.id: missing")
    return tasks


def _annotations(task: dict[str, Any]) -> list[dict[str, Any]]:
    """A task's annotations that label it (a skipped one is kept by Label Studio, cancelled)."""
    found = task.get("annotations") or []
    return [a for a in found if isinstance(a, dict) and not a.get("was_cancelled")]


def _completed_by(annotation: dict[str, Any]) -> str | None:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("id")
    return _text(who)


def _label_studio(path: Path) -> list[Row]:
    out = []
    for n, task in enumerate(_label_studio_tasks(path)):
        where = f"{path}: task #{n}"
        item = str(task["data"]["id"])
        for annotation in _annotations(task):
            found = _ls_result(f"{where} ({item!r})", annotation.get("result") or [])
            if found is None:
                continue
            value, note = found
            out.append((where, item, value, note, _completed_by(annotation), _seconds(annotation)))
    return out


def _ls_result(where: str, result: list[dict[str, Any]]) -> tuple[float, str | None] | None:
    value, note = None, None
    for region in result:
        name, kind, found = region.get("from_name"), region.get("type"), region.get("value") or {}
        if name == SCORE and kind == "number":
            value = _score(where, found.get("number"), "result.value.number")
        elif name == NOTE and kind == "textarea":
            note = " ".join(found.get("text") or []) or None
    return None if value is None else (value, note)


def _csv(path: Path) -> list[Row]:
    from ..exports.cells import from_spreadsheet

    out: list[Row] = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"id", "score"} <= set(reader.fieldnames):
            raise UserError(f"{path}: a labels CSV needs the columns id and score")
        for lineno, cells in enumerate(reader, start=2):
            where = f"{path}:{lineno}"
            # a cell our export wrote after a quote (it began like a formula), as it was
            row = {k: from_spreadsheet(v) if isinstance(v, str) else v for k, v in cells.items()}
            if not (row.get("score") or "").strip():
                continue  # not labelled yet
            value = _score(f"{where}: record {row['id']!r}", row["score"], "score")
            out.append(
                (
                    where,
                    row["id"],
                    value,
                    row.get("note") or None,
                    row.get("annotator") or None,
                    None,
                )
            )
    return out


def _csv_columns(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return next(csv.reader(handle), [])


def _stage_csv(run_dir: Path, path: Path, annotator: str | None) -> list[dict[str, Any]]:
    """The judgement labels of a CSV with ``stage`` and ``label`` columns, each checked against
    the run as the labelling page checks it; one line names the row and field that is wrong."""
    from ..exports.cells import from_spreadsheet
    from ..pages.viewer import Viewer

    viewer = Viewer([run_dir])
    lines = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        for lineno, cells in enumerate(csv.DictReader(handle), start=2):
            row = {k: from_spreadsheet(v) if isinstance(v, str) else v for k, v in cells.items()}
            text = (row.get("label") or "").strip()
            if not text:
                continue  # not labelled yet
            row["annotator"] = annotator or row.get("annotator")
            where = f"{path}:{lineno}: record {row.get('id')!r}"
            lines.append(_judgement_line(viewer, where, row, text, path.name))
    return lines


def _stage_label_studio(
    run_dir: Path, path: Path, tasks: list[dict[str, Any]], annotator: str | None
) -> list[dict[str, Any]]:
    """The judgement labels of a Label Studio export of ``labels export --stage`` tasks: each
    annotation's ``label`` (a choice, a number or the covered items typed) and ``note``, checked
    as the labelling page checks them."""
    from ..pages.viewer import Viewer

    viewer = Viewer([run_dir])
    lines = []
    for n, task in enumerate(tasks):
        data = task["data"]
        where = f"{path}: task #{n}: record {data.get('id')!r}"
        for annotation in _annotations(task):
            label, note = _ls_label(where, annotation.get("result") or [])
            if label is None:
                continue  # the annotation labels nothing of ours
            row = {name: data.get(name) for name in ("id", "stage", "key")}
            row |= {"note": note, "annotator": annotator or _completed_by(annotation)}
            lines.append(_judgement_line(viewer, where, row, label, path.name))
    return lines


def _ls_label(where: str, result: list[dict[str, Any]]) -> tuple[Any, str | None]:
    """An annotation's ``label`` control's value (one choice, a number, or a text) and note."""
    label, note = None, None
    for region in result:
        if not isinstance(region, dict):
            continue
        name, kind, found = region.get("from_name"), region.get("type"), region.get("value")
        found = found if isinstance(found, dict) else {}
        if name == NOTE and kind == "textarea":
            note = " ".join(str(t) for t in found.get("text") or []) or None
        if name != LABEL:
            continue
        if kind == "choices":
            chosen = found.get("choices")
            if not isinstance(chosen, list) or len(chosen) != 1:
                raise UserError(f"{where}: field result.value.choices: one choice, got {chosen!r}")
            label = chosen[0]
        elif kind == "number":
            label = found.get("number")
        elif kind == "textarea":
            texts = found.get("text")
            if not isinstance(texts, list) or len(texts) != 1:
                raise UserError(f"{where}: field result.value.text: one text, got {texts!r}")
            label = str(texts[0]).strip()
        else:
            raise UserError(f"{where}: field result.type: {kind!r} is not a label's control")
    return label, note


def _judgement_line(
    viewer: Any, where: str, row: dict[str, Any], label: Any, source: str
) -> dict[str, Any]:
    """One person's label of a judgement (``row``: its id, stage, key, annotator and note) as
    ``labels.jsonl`` keeps it, checked against the run; ``where`` names the row in one line."""
    if row.get("id") not in viewer.state(0).index:
        raise UserError(f"{where}: field id: not an item of {viewer.paths[0]}")
    key = str(row.get("key") if row.get("key") not in (None, "") else "0").strip()
    if not key.isdigit():
        raise UserError(f"{where}: field key: a unit's number (0, 1, ...), got {key!r}")
    stage = str(row.get("stage") or "").strip()
    try:
        how = viewer.choices(0, stage) if stage else None
    except KeyError:
        how = None
    if how is None:
        raise UserError(f"{where}: field stage: {stage!r} is not a judging stage")
    try:  # as written in a cell or a choice: the stage's label it names
        label = written_label(label, how)
    except UserError as exc:
        raise UserError(f"{where}: field {exc}") from None
    body = {"id": row["id"], "stage": stage, "key": int(key), "label": label}
    body |= {"note": row.get("note"), "annotator": row.get("annotator") or "unknown"}
    try:
        return viewer.label_line(0, body, source)
    except UserError as exc:
        raise UserError(f"{where}: field {exc}") from None


def _append_judgements(run_dir: Path, path: Path, lines: list[dict[str, Any]]) -> int:
    """All of a file's judgement labels, or none of them (every one was checked first)."""
    if not lines:
        raise UserError(f"{path}: no labels (no judgement with a label)")
    return append_labels(run_dir, lines)


def _score(where: str, value: Any, field: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: field {field}: not a number ({value!r})") from None
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise UserError(f"{where}: field {field}: {value!r} is outside the score's 0-1 scale")
    return number


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _seconds(annotation: dict[str, Any]) -> float | None:
    stamp = annotation.get("created_at")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
