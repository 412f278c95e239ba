"""Streaming corpus readers: JSONL, TSV and TREC-style SGML documents, and a ClueWeb09 copy as
its licensees receive it (a directory of WARC files), one document at a time."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class CorpusError(ValueError):
    pass


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str = ""
    line: int | None = field(default=None, compare=False)  # where it starts (for errors)


# ClueWeb09 Category B: the first English segment (en0000-en0011 and the Wikipedia copy,
# enwp00-enwp03), 50,220,423 pages, as ir_datasets' clueweb09/catb reads it
CLUEWEB09_B = "ClueWeb09_English_1"


def corpus_format(path: Path) -> str:
    if path.is_dir():
        if (path / CLUEWEB09_B).is_dir():
            return "clueweb09"
        raise CorpusError(f"{path}: a directory, but no {CLUEWEB09_B}/ (a ClueWeb09 copy) in it")
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".tsv"):
        return "tsv"
    if name.endswith((".trec", ".sgml", ".xml", ".txt")):
        return "trec"
    raise CorpusError(f"{path}: unknown corpus format (use .jsonl, .tsv or .trec)")


def _open(path: Path, binary: bool = False):
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb") if binary else gzip.open(path, "rt", encoding="utf-8")
    return open(path, "rb") if binary else open(path, encoding="utf-8")


def read_jsonl(path: Path) -> Iterator[Document]:
    """``id`` plus ``contents``, or ``title`` + ``text`` (also ``pageid`` / ``_id`` as the id)."""
    with _open(path, binary=True) as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start})") from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            except RecursionError:  # deeper than the parser's stack: bad input, not a crash
                raise CorpusError(f"{path}:{lineno}: JSON nested too deeply") from None
            if not isinstance(row, dict):
                raise CorpusError(f"{path}:{lineno}: record must be a JSON object")
            doc_id = next((row[k] for k in ("id", "_id", "docid", "pageid") if k in row), None)
            if doc_id is None:
                raise CorpusError(f"{path}:{lineno}: field id: missing (id, _id, docid or pageid)")
            text = row.get("contents", row.get("text"))
            if not isinstance(text, str):
                raise CorpusError(
                    f"{path}:{lineno}: record {str(doc_id)!r}: field contents: "
                    "missing or not a string ('contents' or 'text')"
                )
            yield Document(str(doc_id), text, str(row.get("title") or ""), lineno)


def read_tsv(path: Path) -> Iterator[Document]:
    """``id<TAB>text`` or ``id<TAB>title<TAB>text`` per line."""
    csv.field_size_limit(sys.maxsize)
    with _open(path) as handle:
        for lineno, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not row:
                continue
            if len(row) == 2:
                yield Document(row[0], row[1], line=lineno)
            elif len(row) == 3:
                yield Document(row[0], row[2], row[1], lineno)
            else:
                raise CorpusError(f"{path}:{lineno}: expected 2 or 3 tab-separated fields")


_DOC = re.compile(r"<DOC>(.*?)</DOC>", re.DOTALL | re.IGNORECASE)
_FIELD = {
    name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL | re.IGNORECASE)
    for name in ("DOCNO", "TITLE", "HEADLINE", "TEXT")
}
_TAG = re.compile(r"<[^>]+>")


def read_trec(path: Path, buffer_chars: int = 1 << 20) -> Iterator[Document]:
    """<DOC><DOCNO>..</DOCNO>[<TITLE>..</TITLE>]<TEXT>..</TEXT></DOC>, read in bounded blocks."""
    pending = ""
    with _open(path) as handle:
        while block := handle.read(buffer_chars):
            pending += block
            end = 0
            for match in _DOC.finditer(pending):
                yield _trec_document(path, match.group(1))
                end = match.end()
            pending = pending[end:]
    if _DOC.search(pending) or "<DOC>" in pending.upper():
        raise CorpusError(f"{path}: unterminated <DOC> at end of file")


def _trec_document(path: Path, body: str) -> Document:
    docno = _FIELD["DOCNO"].search(body)
    if not docno:
        raise CorpusError(f"{path}: a <DOC> without <DOCNO>")
    title = _FIELD["TITLE"].search(body) or _FIELD["HEADLINE"].search(body)
    texts = _FIELD["TEXT"].findall(body) or [body]
    text = "\n".join(" ".join(_TAG.sub(" ", t).split()) for t in texts)
    return Document(docno.group(1).strip(), text, " ".join(title.group(1).split()) if title else "")


def clueweb09_files(root: Path) -> list[Path]:
    """The WARC files of Category B in ClueWeb09's order (``<dir>/<NN>.warc.gz``)."""
    return sorted((root / CLUEWEB09_B).glob("*/*.warc.gz"))


def read_clueweb09(root: Path) -> Iterator[Document]:
    """ClueWeb09 Category B from the licensee's copy, streamed file by file: ir_datasets'
    ClueWeb09 WARC reading (the ``warc3-wet-clueweb09`` parser, for WARC/0.18 as ClueWeb09 wrote
    it) gives each response record; its HTML parser gives the title and the body text. Pages
    with no text are skipped. ir_datasets' own ``docs_iter`` is not used: it needs the copy's
    record counts and a 3.6 GB checkpoint download for random access, which a stream needs not."""
    import gzip
    import zlib

    from ir_datasets.datasets.clueweb09 import ClueWeb09Docs
    from ir_datasets.util import LocalDownload, sax_html_parser

    docs = ClueWeb09Docs(LocalDownload(root), None, dirs=[CLUEWEB09_B], lang="en")
    files = clueweb09_files(root)
    if not files:
        raise CorpusError(f"{root}: no {CLUEWEB09_B}/<dir>/<NN>.warc.gz files")
    for source in files:
        try:
            with gzip.open(source, "rb") as handle:
                for page in docs._docs_ctxt_iter_warc(handle):
                    title, body = sax_html_parser(
                        page.body, headers=page.http_headers, fields=[{"title"}, {"body"}]
                    )
                    text = " ".join(body.split())
                    if text:
                        yield Document(page.doc_id, text, " ".join(title.split()))
        except (OSError, EOFError, zlib.error, KeyError, ValueError) as exc:
            raise CorpusError(f"{source}: not a ClueWeb09 WARC file ({exc})") from None


READERS = {"jsonl": read_jsonl, "tsv": read_tsv, "trec": read_trec, "clueweb09": read_clueweb09}


def read_corpus(path: Path | str) -> Iterator[Document]:
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus file not found: {path}")
    return _decoded(path, READERS[corpus_format(path)](path))


def _decoded(path: Path, documents: Iterator[Document]) -> Iterator[Document]:
    """The TSV and TREC readers decode as they go: bad bytes become one clear error."""
    try:
        yield from documents
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{path}: not UTF-8 text: is this a {corpus_format(path)} corpus?"
        ) from exc


def fingerprint(path: Path | str) -> str:
    """SHA-256 of the corpus file bytes, streamed; of a ClueWeb09 copy (hundreds of GB), of its
    files' names and sizes."""
    digest = hashlib.sha256()
    if Path(path).is_dir():
        for file in clueweb09_files(Path(path)):
            digest.update(f"{file.relative_to(path)}\t{file.stat().st_size}\n".encode())
        return digest.hexdigest()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
