"""Converters: published files in, the shape our readers take out (written into ``out``).

Each converter checks the published schema and stops with one line naming the file, record and
field; the caller writes into a temporary directory, so a failed conversion leaves nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...serving.files import atomic_file, write_atomic
from ..runtime.contract.errors import UserError

WC_RESPONSES = 5  # prompts 0..4: no context, context 1, context 2, both, both with a hint
WC_ANSWER_PREFIX = "\nAnswer: "  # what the authors' notebook removed from every response


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON: {exc}") from None


def _text(path: Path, where: str, record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str):
        got = "missing" if value is None else f"not a string ({type(value).__name__})"
        raise UserError(f"{path}: {where}: field {field}: {got}")
    return value


def wikicontradict_humaneval(sources: list[Path], out: Path) -> None:
    """The published adjudication file (model -> records) to one JSONL row per (model,
    question), models and records in the file's order: the rows of the authors' notebook."""
    [path] = sources
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected an object mapping each model to its records")
    lines = []
    for model, records in data.items():
        if not isinstance(records, list):
            raise UserError(f"{path}: model {model!r}: expected a list of records")
        for n, record in enumerate(records):
            where = f"model {model!r} record {n}"
            if not isinstance(record, dict):
                raise UserError(f"{path}: {where}: not an object")
            row = {
                "question": _text(path, where, record, "question1"),
                "context1_self_contained": _text(path, where, record, "question1_context1"),
                "context2_self_contained": _text(path, where, record, "question1_context2"),
                "gt_answer_1": _text(path, where, record, "question1_answer1"),
                "gt_answer_2": _text(path, where, record, "question1_answer2"),
            }
            for i in range(WC_RESPONSES):
                answer = _text(path, where, record, f"ModelAnswer_prompt_{i}")
                row[f"answer{i}"] = answer.replace(WC_ANSWER_PREFIX, "")
            for i in range(WC_RESPONSES):
                row[f"label{i}"] = _text(path, where, record, f"ModelAnswer_prompt_{i}_humanEval")
            row["model"] = model
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    write_atomic(out / "humaneval.jsonl", "".join(lines), within=out)


CB_FIELDS = (
    "question",
    "default_claim",
    "misinformation_conflict_claim",
    "default_evidence",
    "misinformation_conflict_evidence",
    "temporal_conflict_evidence",
    "semantic_conflict_evidence",
)


def _train_files(sources: list[Path]) -> list[Path]:
    """The train split's files, in name order (the order the Hub's loader reads shards in)."""
    named = [p for p in sources if "train" in p.name.lower() or "train" in p.parent.name.lower()]
    return sorted(named or sources, key=lambda p: p.as_posix())


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) of a JSON list, a JSONL file or a Parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield f"row {n}", row
                n += 1
        return
    if path.suffix == ".json" and _json_lines(path):
        yield from _line_rows(path)  # JSON Lines despite the name (ConflictBank's QA_dataset.json)
        return
    if path.suffix == ".json":
        if not _starts_with(path, "["):  # not a list: an object such as {"train": [...]}
            data = _read_json(path)
            if not isinstance(data, dict) or not isinstance(data.get("train"), list):
                raise UserError(f"{path}: expected a JSON list of records")
            yield from ((f"record {n}", row) for n, row in enumerate(data["train"]))
            return
        yield from ((f"record {n}", row) for n, row in enumerate(json_array(path)))
        return
    yield from _line_rows(path)


def _line_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) per non-empty line, one line in memory at a time."""
    with path.open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield f"line {n}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}:{n}: not valid JSON: {exc}") from None


def _json_lines(path: Path) -> bool:
    """Whether a ``.json`` file holds JSON Lines: its first line is a whole JSON object and it is
    not one document wrapping the records (``{"train": [...]}``). Reads the first line only."""
    with path.open(encoding="utf-8") as f:
        first = f.readline()
        while first and not first.strip():
            first = f.readline()
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and not isinstance(row.get("train"), list)


def _starts_with(path: Path, char: str) -> bool:
    with path.open(encoding="utf-8") as f:
        return f.read(4096).lstrip().startswith(char)


_SPACE = re.compile(r"\s*")
_BETWEEN = re.compile(r"[\s,]*")  # between a list's items


def json_array(path: Path, chunk: int = 1 << 20) -> Iterator[Any]:
    """The items of a top-level JSON array one at a time, so a 1.3 GB file is never whole in
    memory: items are decoded in place from a buffer refilled as it runs out."""
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as f:
        buf, pos, eof, opened = "", 0, False, False
        while True:
            pos = (_BETWEEN if opened else _SPACE).match(buf, pos).end()  # type: ignore[union-attr]
            item, end, complete = None, pos, False
            if pos < len(buf):
                if not opened:
                    if buf[pos] != "[":
                        raise UserError(f"{path}: expected a JSON list of records")
                    pos, opened = pos + 1, True
                    continue
                if buf[pos] == "]":
                    return
                try:
                    item, end = decoder.raw_decode(buf, pos)
                    complete = end < len(buf) or eof  # a number cut at the buffer's end is not
                except json.JSONDecodeError as exc:
                    if eof:
                        raise UserError(f"{path}: not valid JSON: {exc.msg}") from None
            elif eof:
                raise UserError(f"{path}: not valid JSON: the list is not closed")
            if complete:
                yield item
                pos = end
                continue
            more = f.read(chunk)
            eof = not more
            buf, pos = buf[pos:] + more, 0


def conflictbank_train(sources: list[Path], out: Path) -> None:
    """CB_qa_v2's train split as one JSONL file in the published row order (the seed-42 sample
    is drawn from it at read time, so the order must be the Hub's)."""
    count = 0
    with atomic_file(out / "train.jsonl", within=out) as sink:
        for path in _train_files(sources):
            for where, row in _rows(path):
                if not isinstance(row, dict):
                    raise UserError(f"{path}: {where}: not an object")
                for field in CB_FIELDS:
                    _text(path, where, row, field)
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    if not count:
        raise UserError(f"{sources[0] if sources else 'conflictbank'}: no train records")


def check_clueweb09(path: Path) -> None:
    """ClueWeb09 Category B as CMU ships it (a directory holding ``ClueWeb09_English_1/``): its
    first WARC file's first page is read; or a JSONL export {id, contents}."""
    if not path.is_dir():
        check_corpus(path)
        return
    from ...index_build.corpus import CorpusError, read_corpus

    try:
        first = next(iter(read_corpus(path)), None)
    except CorpusError as exc:
        raise UserError(str(exc)) from None
    if first is None:
        raise UserError(f"{path}: its first WARC file holds no page with text")


def check_corpus(path: Path) -> None:
    """A JSONL corpus {id, contents}: its first lines are checked (the file may be huge)."""
    if not path.is_file():
        raise UserError(f"{path}: not a file (a JSONL corpus with lines {{id, contents}})")
    with path.open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, 1):
            if n > 100:
                return
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n}: not valid JSON: {exc}") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{n}: not an object")
            if not isinstance(row.get("id"), (str, int)):
                raise UserError(f"{path}:{n}: field id: missing")
            _text(path, f"line {n}", row, "contents")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for where, row in _rows(path):
        if not isinstance(row, dict):
            raise UserError(f"{path}: {where}: not an object")
        yield where, row


def crux_mds(sources: list[Path], out: Path) -> None:
    """CRUX-MDS as the authors' loaders read it (``crux-mds-<subset>/topic/requests.*.jsonl``
    with {id, request}, ``subtopics/subquestions.*.jsonl`` with {id, subquestions}) to our topics
    exchange file per subset, ``topics-<subset>.jsonl`` {topic, query, questions}; a topic without
    sub-questions is left out, as their loader drops it. Qrels and judgement files are kept as
    published, renamed ``<subset>-<folder>-<file>``."""
    subsets: dict[str, dict[str, list[Path]]] = {}
    for path in sources:
        subset = next(
            (p.removeprefix("crux-mds-") for p in path.parts if p.startswith("crux-mds-")), None
        )
        if subset is None:
            continue
        subsets.setdefault(subset, {}).setdefault(path.parent.name, []).append(path)
    if not subsets:
        raise UserError("crux-mds: no crux-mds-<subset>/ folder among the published files")
    for subset, folders in sorted(subsets.items()):
        requests: dict[str, str] = {}
        for path in sorted(folders.get("topic", [])):
            for where, row in _jsonl_rows(path):
                requests[_text(path, where, row, "id")] = _text(path, where, row, "request")
        questions: dict[str, list[str]] = {}
        for path in sorted(folders.get("subtopics", [])):
            for where, row in _jsonl_rows(path):
                found = row.get("subquestions")
                if not isinstance(found, list) or not all(isinstance(q, str) for q in found):
                    raise UserError(f"{path}: {where}: field subquestions: not a list of strings")
                questions[_text(path, where, row, "id")] = found
        lines = [
            json.dumps({"topic": t, "query": q, "questions": questions[t]}, ensure_ascii=False)
            + "\n"
            for t, q in requests.items()
            if t in questions
        ]
        if not lines:
            raise UserError(f"crux-mds-{subset}: no topic with sub-questions")
        write_atomic(out / f"topics-{subset}.jsonl", "".join(lines), within=out)
        _crux_ratings(sorted(folders.get("judge", [])), questions, out / f"ratings-{subset}.jsonl")
        for folder, paths in folders.items():
            if folder not in ("topic", "subtopics"):
                for path in paths:
                    write_atomic(
                        out / f"{subset}-{folder}-{path.name}", path.read_bytes(), within=out
                    )


def _crux_ratings(paths: list[Path], questions: dict[str, list[str]], target: Path) -> None:
    """The authors' judge lines {example_id, pid, rating: [one 0-5 rating per sub-question]} as
    our ratings exchange lines {topic, passage_id, question, rating}, one per sub-question, so
    ``eval crux --ratings`` reads the published ratings and rates nothing itself."""
    lines: list[str] = []
    for path in paths:
        for where, row in _jsonl_rows(path):
            topic = row.get("example_id")
            if not isinstance(topic, (str, int)) or isinstance(topic, bool):
                raise UserError(f"{path}: {where}: field example_id: missing")
            pid = _text(path, where, row, "pid")
            ratings = row.get("rating")
            if not isinstance(ratings, list) or not all(_rating(r) for r in ratings):
                raise UserError(
                    f"{path}: {where}: record {pid!r}: field rating: not a list of 0-5 ratings"
                )
            n = len(questions.get(str(topic), ratings))
            if len(ratings) != n:
                raise UserError(
                    f"{path}: {where}: record {pid!r}: field rating: {len(ratings)} "
                    f"ratings for {n} sub-questions of topic {topic}"
                )
            lines += [
                json.dumps(
                    {"topic": str(topic), "passage_id": pid, "question": q, "rating": int(r)}
                )
                + "\n"
                for q, r in enumerate(ratings)
            ]
    if lines:
        write_atomic(target, "".join(lines), within=target.parent)


def _rating(value: Any) -> bool:
    """A whole 0-5 rating (published as an int, or a float with no fraction)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value).is_integer() and 0 <= value <= 5


def _clean(text: str | None) -> str:
    return " ".join((text or "").split())


def trec_web_diversity(datasets: list[Any], out: Path) -> None:
    """ir_datasets' TREC Web Track diversity datasets (queries with subtopics, subtopic qrels)
    to ICAT's formats: ``topics.jsonl`` (topic_id, query, type, description, subtopics with
    subtopic_id, type, description) and ``qrels.jsonl`` (query_id, doc_id, relevance,
    subtopic_id), topics in number order."""
    topics = []
    for dataset in datasets:
        for q in dataset.queries_iter():
            subtopics = [
                {"subtopic_id": int(s.number), "type": s.type, "description": _clean(s.text)}
                for s in q.subtopics
            ]
            topic = {"topic_id": int(q.query_id), "query": _clean(q.query), "type": q.type}
            topics.append(topic | {"description": _clean(q.description), "subtopics": subtopics})
    if not topics:
        raise UserError("trec-web-topics: ir_datasets gave no topics")
    topics.sort(key=lambda t: t["topic_id"])
    with atomic_file(out / "topics.jsonl", within=out) as sink:
        for topic in topics:
            sink.write(json.dumps(topic, ensure_ascii=False) + "\n")
    with atomic_file(out / "qrels.jsonl", within=out) as sink:
        for dataset in datasets:
            for r in dataset.qrels_iter():
                row = {
                    "query_id": r.query_id,
                    "doc_id": r.doc_id,
                    "relevance": r.relevance,
                    "subtopic_id": r.subtopic_id,
                }
                sink.write(json.dumps(row) + "\n")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` set: only what is cached is used, for every home."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _evidence(node: Any, into: dict[int, dict[str, Any]]) -> None:
    """Every Wikipedia page a FanOutQA question rests on: its decomposition's evidence (dev) or
    its necessary_evidence list (test)."""
    if isinstance(node, list):
        for child in node:
            _evidence(child, into)
    elif isinstance(node, dict):
        if isinstance(node.get("pageid"), int) and "revid" in node:
            into.setdefault(node["pageid"], node)
        for key in ("evidence", "necessary_evidence", "decomposition"):
            if key in node:
                _evidence(node[key], into)


def fanoutqa_wiki(sources: list[Path], out: Path) -> None:
    """The Wikipedia pages of the FanOutQA questions at the dataset's epoch, as our articles
    JSONL {pageid, title, text}: from the ``fanoutqa`` package's own page cache where present,
    else fetched by the package (its dated revision, then cached there too)."""
    from fanoutqa import wiki
    from fanoutqa.models import Evidence

    pages: dict[int, dict[str, Any]] = {}
    for path in sources:
        _evidence(_read_json(path), pages)
    missing = []
    with atomic_file(out / "articles.jsonl", within=out) as sink:
        for pageid, page in sorted(pages.items()):
            cached = wiki.WIKI_CACHE_DIR / f"{pageid}-dated.md"
            if cached.is_file():
                text = cached.read_text(encoding="utf-8")
            elif offline():
                missing.append(pageid)
                continue
            else:
                text = wiki.wiki_content(
                    Evidence(pageid, page["revid"], page.get("title", ""), page.get("url", ""))
                )
            row = {"pageid": pageid, "title": page.get("title", ""), "text": text}
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
    if missing:
        raise UserError(
            f"fanoutqa-wiki: {len(missing)} of {len(pages)} pages (first: {missing[0]}) are not "
            f"in the fanoutqa package's cache {wiki.WIKI_CACHE_DIR} and HF_HUB_OFFLINE is set"
        )
