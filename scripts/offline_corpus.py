"""Assemble a corpus of real English prose that any Debian/Ubuntu machine has offline.

Sources: the documentation packages install under /usr/share/doc (plain text, Markdown, reST,
HTML with tags stripped, gzip-compressed or not; changelogs and copyright files skipped: they are
lists, not prose) and the docstrings of every module, class and function in the Python standard
library and the installed site-packages (read with ``ast``; nothing is imported or executed).

Writes JSONL (``id``, ``title``, ``text``) for ``groundcover index build`` or
``scripts/benchmarks/bench_retrieval.py --corpus``:

    python scripts/offline_corpus.py /tmp/offline.jsonl --min-words 40
"""

from __future__ import annotations

import argparse
import ast
import gzip
import html
import json
import re
import site
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

PROSE_SUFFIXES = (".txt", ".md", ".rst", ".html", ".htm", ".text", "")
SKIP_NAMES = ("changelog", "copyright", "news", "license", "authors", "thanks", "readme.debian")
TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.S | re.I)
SPACE = re.compile(r"\s+")


def _read_doc(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if b"\0" in raw[:4096]:
        return ""  # binary
    text = raw.decode("utf-8", errors="ignore")
    if ".htm" in path.name.lower():
        text = html.unescape(TAG.sub(" ", text))
    return text


def debian_docs(root: Path) -> Iterator[tuple[str, str, str]]:
    for path in sorted(root.rglob("*")):
        name = path.name.lower().removesuffix(".gz")
        if not path.is_file() or path.is_symlink() or name.startswith(SKIP_NAMES):
            continue
        if Path(name).suffix not in PROSE_SUFFIXES:
            continue
        text = _read_doc(path)
        # paragraphs as documents: the index chunks them further
        for n, para in enumerate(re.split(r"\n\s*\n", text)):
            yield f"doc:{path.relative_to(root)}#{n}", path.parent.name, para


def docstrings(root: Path) -> Iterator[tuple[str, str, str]]:
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or path.name.startswith("test_"):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, RecursionError, OSError):
            continue
        for node in ast.walk(tree):  # the module first
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            text = ast.get_docstring(node)
            if text:
                name = getattr(node, "name", "")
                yield f"py:{path.relative_to(root)}:{name}:{getattr(node, 'lineno', 0)}", name, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--min-words", type=int, default=40, help="drop shorter documents")
    parser.add_argument("--docs", type=Path, default=Path("/usr/share/doc"))
    args = parser.parse_args()
    roots = [Path(sysconfig.get_paths()["stdlib"]), *map(Path, site.getsitepackages())]
    sources = [debian_docs(args.docs)] + [docstrings(r) for r in dict.fromkeys(roots) if r.is_dir()]
    seen: set[str] = set()
    documents = words = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for source in sources:
            for doc_id, title, text in source:
                text = SPACE.sub(" ", text).strip()
                n = len(text.split())
                if n < args.min_words or text in seen or doc_id in seen:
                    continue
                seen.update((text, doc_id))
                out.write(json.dumps({"id": doc_id, "title": title, "text": text}) + "\n")
                documents += 1
                words += n
    print(f"{args.out}: {documents} documents, {words} words", file=sys.stderr)


if __name__ == "__main__":
    main()
