"""Reading back what a terminal shows: the rows of rich's boxed tables, a cell wrapped over
several lines joined again (a folded name continues without a space, a wrapped header with
one)."""

from __future__ import annotations

import re

ROW = re.compile(r"^[│┃]")


def table_rows(text: str) -> list[list[str]]:
    """Every row of every boxed table in ``text`` (header rows too), cells joined over the
    lines a row wraps onto: a line with a cell empty where the row above has one (and none
    filled where it has none) continues that row."""
    rows: list[list[str]] = []
    previous_was_row = False
    for line in text.splitlines():
        if not ROW.match(line):
            previous_was_row = False
            continue
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if previous_was_row and rows and _continues(rows[-1], cells):
            rows[-1] = [a + b if a and b else a or b for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
        previous_was_row = True
    return rows


def _continues(above: list[str], cells: list[str]) -> bool:
    if len(above) != len(cells):
        return False
    pairs = list(zip(above, cells, strict=True))
    return any(a and not c for a, c in pairs) and not any(c and not a for a, c in pairs)
