"""ICAT's inputs in the authors' formats (SPEC §2), each bad record stopping with one line.

- queries: {"query_id", "query", "subtopics": [...]}; a subtopic is a string (numbered 1..n) or an
  object with "subtopic_id"/"id" and "text"/"description". A TREC Web Track topics file
  ("topic_id", subtopics with "subtopic_id" and "description") is read as is; its subtopic ids
  have gaps and are kept.
- responses: {"query_id", "response"}, optional "id" (default: the query id) and "system".
- qrels: {"query_id", "doc_id", "relevance", "subtopic_id"}; relevance == 1 marks the subtopic
  (the authors' rule; the TREC Web diversity qrels grade subtopics 0/1).
- web snippets: {"claim", "snippets": [{"text", "id"?, "doc_id"?}]} -- retrieved per claim
  elsewhere (the paper: Brave Search), used instead of a corpus index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from groundcover import UserError
from groundcover.inputs import iter_jsonl


class Subtopic(BaseModel):
    id: str
    text: str


class Query(BaseModel):
    query_id: str
    query: str
    subtopics: list[Subtopic] = Field(default_factory=list)


class Response(BaseModel):
    """One evaluated response, with its query attached at load time."""

    model_config = ConfigDict(extra="allow")

    id: str
    query_id: str
    response: str
    system: str = "response"
    query: str = ""
    subtopics: list[Subtopic] = Field(default_factory=list)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _id(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    return str(value).strip() if isinstance(value, int | str) and str(value).strip() else None


def load_queries(path: Path) -> dict[str, Query]:
    queries: dict[str, Query] = {}
    for lineno, row in iter_jsonl(path):
        qid = _id(row.get("query_id", row.get("topic_id")))
        where = f"{path}:{lineno}: record {qid!r}"
        if qid is None:
            raise UserError(f"{path}:{lineno}: field query_id: missing (or topic_id)")
        if qid in queries:
            raise UserError(f"{where}: duplicate query_id")
        query = _text(row.get("query"))
        if query is None:
            raise UserError(f"{where}: field query: missing or not a string")
        raw = row.get("subtopics", [])
        if not isinstance(raw, list):
            raise UserError(f"{where}: field subtopics: not a list")
        subtopics = []
        for n, entry in enumerate(raw, 1):
            sid: str | None
            text: str | None
            if isinstance(entry, str):
                sid, text = str(n), _text(entry)
            elif isinstance(entry, dict):
                sid = _id(entry.get("subtopic_id", entry.get("id")))
                text = _text(entry.get("text", entry.get("description")))
            else:
                sid = text = None
            if sid is None or text is None:
                raise UserError(f"{where}: field subtopics[{n - 1}]: needs an id and a text")
            subtopics.append(Subtopic(id=sid, text=text))
        if len({s.id for s in subtopics}) != len(subtopics):
            raise UserError(f"{where}: field subtopics: duplicate subtopic ids")
        queries[qid] = Query(query_id=qid, query=query, subtopics=subtopics)
    if not queries:
        raise UserError(f"{path}: no queries")
    return queries


def load_responses(path: Path, queries: dict[str, Query], need_subtopics: bool) -> list[Response]:
    items: list[Response] = []
    seen: set[str] = set()
    for lineno, row in iter_jsonl(path):
        qid = _id(row.get("query_id"))
        if qid is None:
            raise UserError(f"{path}:{lineno}: field query_id: missing")
        rid = _id(row.get("id")) or (f"{row['system']}:{qid}" if _id(row.get("system")) else qid)
        where = f"{path}:{lineno}: record {rid!r}"
        if qid not in queries:
            raise UserError(f"{where}: field query_id: unknown query {qid!r}")
        if not isinstance(row.get("response"), str):
            raise UserError(f"{where}: field response: missing or not a string")
        query = queries[qid]
        if need_subtopics and not query.subtopics:
            raise UserError(f"{where}: query {qid!r} has no subtopics (ICAT-M/S need them)")
        if rid in seen:
            raise UserError(f"{where}: duplicate id")
        seen.add(rid)
        extra = {k: v for k, v in row.items() if k not in {"id", "query_id", "response", "system"}}
        items.append(
            Response(
                id=rid,
                query_id=qid,
                response=row["response"],
                system=_id(row.get("system")) or "response",
                query=query.query,
                subtopics=query.subtopics,
                **extra,
            )
        )
    if not items:
        raise UserError(f"{path}: no responses")
    return items


def load_qrels(path: Path, wanted: set[str]) -> tuple[dict[str, dict[str, set[str]]], dict]:
    """query id -> doc id -> subtopic ids judged relevant; and where each doc was named."""
    qrels: dict[str, dict[str, set[str]]] = {}
    where: dict[tuple[str, str], int] = {}
    rows = 0
    for lineno, row in iter_jsonl(path):
        rows += 1
        values = {f: _id(row.get(f)) for f in ("query_id", "doc_id", "subtopic_id")}
        record = f"{path}:{lineno}: record {values['query_id'] or '?'}/{values['doc_id'] or '?'}"
        for field, value in values.items():
            if value is None:
                raise UserError(f"{record}: field {field}: missing")
        relevance = row.get("relevance")
        if isinstance(relevance, bool) or not isinstance(relevance, int | float):
            raise UserError(f"{record}: field relevance: not a number")
        qid, doc = values["query_id"], values["doc_id"]
        if qid not in wanted:
            continue
        assert qid is not None and doc is not None  # checked above
        docs = qrels.setdefault(qid, {})
        docs.setdefault(doc, set())
        where.setdefault((qid, doc), lineno)
        if relevance == 1:  # the ICAT authors' rule: grade 1 marks the subtopic, no other
            docs[doc].add(values["subtopic_id"])  # type: ignore[arg-type]
    if not rows:
        raise UserError(f"{path}: no records")
    return qrels, where


class Snippet(BaseModel):
    text: str = Field(min_length=1)
    id: str | None = None
    doc_id: str | None = None


def load_snippets(path: Path) -> dict[str, list[Snippet]]:
    """claim text -> its web snippets in rank order."""
    out: dict[str, list[Snippet]] = {}
    for lineno, row in iter_jsonl(path):
        claim = _text(row.get("claim"))
        if claim is None:
            raise UserError(f"{path}:{lineno}: field claim: missing or not a string")
        record = f"{path}:{lineno}: record {claim[:40]!r}"
        raw = row.get("snippets")
        if not isinstance(raw, list):
            raise UserError(f"{record}: field snippets: not a list")
        snippets = []
        for n, entry in enumerate(raw):
            text = _text(entry.get("text")) if isinstance(entry, dict) else _text(entry)
            if text is None:
                raise UserError(f"{record}: field snippets[{n}]: no text")
            ident = entry if isinstance(entry, dict) else {}
            snippets.append(
                Snippet(
                    text=text,
                    id=_id(ident.get("id")) or f"{lineno}#{n}",
                    doc_id=_id(ident.get("doc_id")),
                )
            )
        out[" ".join(claim.split())] = snippets
    if not out:
        raise UserError(f"{path}: no records")
    return out
