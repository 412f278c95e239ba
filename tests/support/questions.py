"""A questions file for `generate` runs in the tests that start real servers."""

from __future__ import annotations

import json
from pathlib import Path


def questions_file(path: Path, ids: list[str], text: str = "Why {}?") -> Path:
    """One ``{"id", "question"}`` line per id; ``text`` is formatted with the id."""
    path.write_text("".join(json.dumps({"id": i, "question": text.format(i)}) + "\n" for i in ids))
    return path
