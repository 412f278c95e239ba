"""Chunking documents into passages whose ids trace back to document and character offset.

- words: windows of at most ``size`` words overlapping by ``overlap`` (ICAT: 128 / 32), ending
  with the first window that reaches the end of the document, or with ``trailing`` (the ICAT
  authors' snippets) one window starting every ``size - overlap`` words until none is left, so
  the shorter windows at the end are kept too;
- chars: pieces of at most ``size`` characters cut at a paragraph break if there is one in the
  window, else at a sentence end, else at a space (FanOutQA: 1,024).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from .corpus import Document

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]?\s")


@dataclass(frozen=True)
class Chunk:
    id: str  # "<doc id>@<start offset>"
    doc_id: str
    start: int  # character offsets into the document text
    end: int
    text: str
    title: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ChunkSpec:
    by: Literal["words", "chars"] = "words"
    size: int = 128
    overlap: int = 32  # words only
    trailing: bool = False  # words only: keep every window start (ICAT's snippets)

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.overlap < max(self.size, 1):
            raise ValueError(f"bad chunking: size {self.size}, overlap {self.overlap}")

    def describe(self) -> dict:
        """For the manifest (``trailing`` only when on, so older manifests still match)."""
        out = {"by": self.by, "size": self.size, "overlap": self.overlap}
        return out | ({"trailing": True} if self.trailing else {})

    def chunks(self, doc: Document) -> list[Chunk]:
        spans = (
            word_spans(doc.text, self.size, self.overlap, self.trailing)
            if self.by == "words"
            else (char_spans(doc.text, self.size))
        )
        return [Chunk(f"{doc.id}@{s}", doc.id, s, e, doc.text[s:e], doc.title) for s, e in spans]


def word_spans(text: str, size: int, overlap: int, trailing: bool = False) -> list[tuple[int, int]]:
    words = [m.span() for m in _WORD.finditer(text)]
    if not words:
        return []
    step = size - overlap
    spans = []
    for first in range(0, len(words), step):
        last = min(first + size, len(words)) - 1
        spans.append((words[first][0], words[last][1]))
        if last == len(words) - 1 and not trailing:
            break
    return spans


def char_spans(text: str, size: int) -> list[tuple[int, int]]:
    spans, start, n = [], 0, len(text)
    while start < n:
        while start < n and text[start].isspace():
            start += 1
        if start >= n:
            break
        end = min(start + size, n)
        if end < n:
            window = text[start:end]
            cut = window.rfind("\n\n")
            if cut <= 0:
                ends = [m.end() for m in _SENTENCE_END.finditer(window)]
                cut = ends[-1] if ends else window.rfind(" ")
            if cut > 0:
                end = start + cut
        piece_end = end
        while piece_end > start and text[piece_end - 1].isspace():
            piece_end -= 1
        spans.append((start, piece_end))
        start = end
    return spans


def chunk_documents(docs: Iterable[Document], spec: ChunkSpec) -> Iterator[Chunk]:
    for doc in docs:
        yield from spec.chunks(doc)
