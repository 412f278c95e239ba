"""CRUX's files: topics with sub-questions, passages, ratings (our exchange format), TREC runs.

- topics: {"topic", "query", "questions": [...]}
- passages: {"id", "topic", "text"}, ids like "{example}:{doc}#{passage}"; their order is the
  index order of P**'s tie rule
- ratings: {"topic", "passage_id", "question", "rating"}, question = 0-based index, rating -1..5
- runs: TREC run files, "qid Q0 docid rank score tag" per line
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from groundcover import UserError
from groundcover.inputs import iter_jsonl


class Topic(BaseModel):
    id: str
    query: str
    questions: list[str]


def _text(row: dict, field: str, where: str, record: str | None = None) -> str:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        named = f" record {record!r}:" if record else ""
        raise UserError(f"{where}:{named} field {field}: missing or not a string")
    return str(value).strip()


def load_topics(path: Path) -> dict[str, Topic]:
    topics: dict[str, Topic] = {}
    for lineno, row in iter_jsonl(path):
        where = f"{path}:{lineno}"
        tid = _text(row, "topic", where)
        questions = row.get("questions")
        if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
            raise UserError(f"{where}: record {tid!r}: field questions: not a list of strings")
        if tid in topics:
            raise UserError(f"{where}: record {tid!r}: duplicate topic")
        topics[tid] = Topic(id=tid, query=_text(row, "query", where), questions=questions)
    if not topics:
        raise UserError(f"{path}: no topics")
    return topics


def load_passages(path: Path, topics: dict[str, Topic]) -> dict[str, dict[str, str]]:
    """topic -> passage id -> text, in file order."""
    out: dict[str, dict[str, str]] = {t: {} for t in topics}
    for lineno, row in iter_jsonl(path):
        where = f"{path}:{lineno}"
        pid = _text(row, "id", where)
        tid = _text(row, "topic", where, pid)
        if tid not in topics:
            raise UserError(f"{where}: record {pid!r}: field topic: unknown topic {tid!r}")
        if pid in out[tid]:
            raise UserError(f"{where}: record {pid!r}: duplicate passage id in topic {tid!r}")
        out[tid][pid] = _text(row, "text", where, pid)
    if not any(out.values()):
        raise UserError(f"{path}: no records")
    return out


def load_ratings(path: Path | None, topics: dict[str, Topic]) -> dict[str, dict[str, list[int]]]:
    """topic -> passage id -> rating per sub-question (-1 where not rated)."""
    out: dict[str, dict[str, list[int]]] = {t: {} for t in topics}
    if path is None:
        return out
    for lineno, row in iter_jsonl(path):
        where = f"{path}:{lineno}"
        pid = _text(row, "passage_id", where)
        tid = _text(row, "topic", where, pid)
        if tid not in topics:
            raise UserError(f"{where}: record {pid!r}: field topic: unknown topic {tid!r}")
        question, rating = row.get("question"), row.get("rating")
        n = len(topics[tid].questions)
        if isinstance(question, bool) or not isinstance(question, int) or not 0 <= question < n:
            raise UserError(f"{where}: record {pid!r}: field question: not an index 0..{n - 1}")
        if isinstance(rating, bool) or not isinstance(rating, int) or not -1 <= rating <= 5:
            raise UserError(f"{where}: record {pid!r}: field rating: not an integer -1..5")
        out[tid].setdefault(pid, [-1] * n)[question] = rating
    if not any(out.values()):  # a ratings file was named: an empty one is a mistake
        raise UserError(f"{path}: no records")
    return out


def load_run(path: Path, topics: dict[str, Topic]) -> dict[str, list[str]]:
    """topic -> passage ids in the run's rank order (ties in rank: file order)."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    ranked: dict[str, list[tuple[int, int, str]]] = {}
    for lineno, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}:{lineno}: not UTF-8 text: is this a TREC run?") from None
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise UserError(f"{path}:{lineno}: expected 'qid Q0 docid rank score tag'")
        qid, _, doc, rank, score, _ = parts
        if qid not in topics:
            raise UserError(f"{path}:{lineno}: field qid: unknown topic {qid!r}")
        try:
            rank_n = int(rank)
        except ValueError:
            raise UserError(f"{path}:{lineno}: field rank: not an integer") from None
        try:
            float(score)
        except ValueError:
            raise UserError(f"{path}:{lineno}: field score: not a number") from None
        ranked.setdefault(qid, []).append((rank_n, lineno, doc))
    if not ranked:
        raise UserError(f"{path}: no run lines")
    return {q: [doc for _, _, doc in sorted(rows)] for q, rows in ranked.items()}
