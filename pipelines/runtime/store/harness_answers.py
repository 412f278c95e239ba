"""Answers made by other harnesses, read as they write them (``--answers``), decided by content:

- an **inspect_ai eval log** (``.eval``, a zip; or a ``.json`` log), read through inspect_ai's
  own reader (the optional extra ``groundcover[inspect]``): one answer per sample, the sample's
  final completion (``output.completion``). The item is the sample's ``metadata[ID]`` where the
  task put the framework's id field there (``sample_id`` for GaRAGe, ``topic`` for CRUX), else
  the sample's ``id``. Only the first epoch is read; a sample that ended in an error has no
  answer (the item is then what the framework makes of a missing answer).
- an **lm-evaluation-harness samples file** (``samples_TASK_DATE.jsonl`` of ``--log_samples``):
  one answer per document, the filtered response of its first request
  (``filtered_resps[0]``, a generation task's text). The item is ``doc[ID]``, else
  ``doc["id"]``, else ``doc_id``. A file holding several filters' responses is read for the
  first filter it names (the others are the same documents again).

Each yields ``(where, {ID: id, ANSWER: text})`` as the JSON layouts do, so duplicates, unknown
ids and one-line errors are the same for every layout (``answers.read_answers``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..contract.errors import UserError
from ..contract.readers import iter_jsonl

ZIP_MAGIC = b"PK\x03\x04"
INSTALL = "pip install 'groundcover[inspect]'"
Row = tuple[str, dict[str, Any]]
T = TypeVar("T")


def outside_event_loop(call: Callable[[], T]) -> T:
    """``call()`` in a fresh thread: for inspect_ai's synchronous API. Called where an event loop
    runs (a run reading its answers from an inspect log), or in a thread that inherited an async
    library's context (``asyncio.to_thread`` under ``anyio.run``), inspect_ai re-enters that loop
    by patching asyncio for the whole process (``nest_asyncio2``: pure-Python tasks, and an
    ``asyncio.run`` that neither cancels the tasks left nor waits for their threads -- a later
    run's interrupted server start then went on serving). A fresh thread has no loop and empty
    context variables, so inspect_ai runs a loop of its own and patches nothing. (In a Jupyter
    kernel inspect_ai applies the patch whatever the thread.)"""
    with ThreadPoolExecutor(1, thread_name_prefix="groundcover-inspect") as pool:
        return pool.submit(call).result()


def harness_layout(path: Path) -> str | None:
    """ "inspect" or "lm-eval" where the file is one of theirs, else None (our JSON layouts)."""
    with path.open("rb") as handle:
        head = handle.read(4096)
    if head.startswith(ZIP_MAGIC):
        return "inspect"
    text = head.decode("utf-8", errors="ignore").lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return None
    if _is_inspect_json(path):
        return "inspect"
    try:
        first = next(iter_jsonl(path))[1]
    except (StopIteration, UserError):
        return None
    if isinstance(first, dict) and "doc_id" in first and "filtered_resps" in first:
        return "lm-eval"
    return None


def _is_inspect_json(path: Path) -> bool:
    """A whole-file JSON object with inspect's ``eval`` and ``version`` keys. JSON Lines is
    ruled out from its first line (a whole object), before the file is read whole."""
    with path.open("rb") as handle:
        first = handle.readline().decode("utf-8", errors="ignore")
    try:
        json.loads(first)
        return False  # the first line is a record of its own: JSON Lines
    except ValueError:
        pass
    try:
        whole = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):
        return False
    return isinstance(whole, dict) and "eval" in whole and "version" in whole


def harness_records(path: Path, layout: str, id_field: str, answer_field: str) -> Iterator[Row]:
    rows = inspect_rows if layout == "inspect" else lm_eval_rows
    for where, key, answer in rows(path, id_field):
        yield where, {id_field: key, answer_field: answer}


def inspect_rows(path: Path, id_field: str) -> Iterator[tuple[str, Any, Any]]:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise UserError(
            f"{path}: an inspect_ai log: reading it needs inspect_ai ({INSTALL})"
        ) from None
    try:
        log = outside_event_loop(lambda: read_eval_log(str(path)))
    except Exception as exc:  # noqa: BLE001 - inspect's reader raises many kinds: one line
        raise UserError(
            f"{path}: not a readable inspect_ai log: {' '.join(str(exc).split())}"
        ) from None
    for n, sample in enumerate(log.samples or []):
        if sample.epoch != 1 or sample.error is not None:
            continue
        key = (sample.metadata or {}).get(id_field, sample.id)
        yield f"{path}: sample #{n}", key, sample.output.completion


def lm_eval_rows(path: Path, id_field: str) -> Iterator[tuple[str, Any, Any]]:
    first_filter = None
    for lineno, row in iter_jsonl(path):
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise UserError(f"{where}: not a JSON object")
        first_filter = first_filter if first_filter is not None else row.get("filter")
        if row.get("filter") != first_filter:
            continue
        doc = row["doc"] if isinstance(row.get("doc"), dict) else {}
        key = doc.get(id_field, doc.get("id", row.get("doc_id")))
        yield where, key, _generation(where, row)


def _generation(where: str, row: dict[str, Any]) -> Any:
    """The text of the document's first request after the task's filters."""
    found = row.get("filtered_resps")
    if not isinstance(found, list) or not found:
        raise UserError(f"{where}: record {row.get('doc_id')!r}: field filtered_resps: missing")
    first = found[0]
    if isinstance(first, list):  # a loglikelihood task: [log-probability, is-greedy]
        raise UserError(
            f"{where}: record {row.get('doc_id')!r}: field filtered_resps: not a generation "
            "(a multiple-choice task's log-likelihoods); score a generate_until task"
        )
    return first
