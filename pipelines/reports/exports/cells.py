"""CSV cells a spreadsheet reads as text: a cell that begins with ``=``, ``+``, ``-``, ``@``, a
tab or a carriage return is a formula to Excel, LibreOffice and Google Sheets
(``=HYPERLINK(...)``, ``=cmd|...``), so such a text is written after a single quote, which they
show as the text itself (OWASP's rule for CSV injection). Numbers stay numbers: a number, and a
text that is only a number ("-0.5"), are written as they are. ``from_spreadsheet`` takes the
quote off again when a CSV of ours is read back (labels imported from an exported file)."""

from __future__ import annotations

import re
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _quoted(text: str) -> bool:
    """Whether reading ``text`` back would take a quote off it (see ``from_spreadsheet``)."""
    return text.startswith(QUOTE) and text[1:].startswith((*FORMULA_START, QUOTE))


def spreadsheet_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs (numbers and other values as they are)."""
    if not isinstance(value, str) or PLAIN_NUMBER.fullmatch(value):
        return value
    if value.startswith(FORMULA_START) or _quoted(value):  # a leading quote of its own kept
        return QUOTE + value
    return value


def spreadsheet_row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: spreadsheet_cell(value) for key, value in row.items()}


def from_spreadsheet(text: str) -> str:
    """A cell written by ``spreadsheet_cell``, as it was."""
    return text[1:] if _quoted(text) else text
