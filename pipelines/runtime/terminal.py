"""Tables a person can read in any terminal, 80 columns included, and in a log file (where rich
prints 80 columns): a name or a number is never cut short with "…".

``terminal()`` is the console every command prints through (frameworks' ``render`` get it too).
Each table it prints is fitted first:

- a number column keeps its widest number whole (numbers carry thousands separators; a
  column's unit is in its header), a name column wraps instead of being cut;
- a usage table (``usage_table``) leaves out the number columns that are zero in every
  row and lists them in one line under it, as the HTML page does;
- a table that still cannot fit is stacked: one block per row, each value under its header.

Data stays text. A run's text comes from anybody (items files, model outputs, run directories
sent by someone else), so this console reads no markup in a string (``[link=...]`` is shown as
written, never made a link or a style) and no emoji code (``:warning:`` stays text), and writes
no control character a terminal would act on: C0 and C1 controls (ESC among them: colour, cursor
moves, OSC 8 links, the window title) and the bidirectional overrides and isolates (text shown in
another order than it is) are shown as ``\\x1b`` / ``\\u202e`` escapes (``printable``). Style
comes from ``Text`` and ``style=``, never from the text itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text, TextType

# a number, an interval "[0.41, 0.58]", a count "0/2/0", a time "0:01:02", a dash for none:
# no letters, some digit (or only the dash); such a cell is never wrapped
NUMERIC = re.compile(r"[\d\s.,:/%$+\-\[\]()±]*")
DROP_ZERO = "groundcover_drop_zero"  # set on a Table: its all-zero number columns are left out


# what a terminal acts on or shows out of order: C0 controls but tab and newline, DEL, C1
# controls, the Arabic letter mark, the directional marks, embeddings, overrides and isolates;
# written with escapes, so a page's script reads the same class (``UNPRINTABLE_CLASS``)
UNPRINTABLE_CLASS = r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
UNPRINTABLE = re.compile(UNPRINTABLE_CLASS)


def _escape(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (or reorder) shown as an escape."""
    return UNPRINTABLE.sub(_escape, text) if UNPRINTABLE.search(text) else text


class FittedConsole(Console):
    """The console every command prints through: tables that never cut a name or a number,
    strings that are text (no markup read, no control character written; the module's
    docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)  # ':warning:' in data stays those nine characters
        super().__init__(*args, **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        fitted = [fit(o, self) if isinstance(o, Table) else o for o in objects]
        super().print(*fitted, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # a string made text here is measured as it is shown: the escapes are in its width
        kwargs["markup"] = kwargs["emoji"] = False
        return super().render_str(printable(text), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        # the last word: a ``Text`` built from data (not a string) is cleaned here, segment by
        # segment; rich's own control segments (cursor moves of a live display) pass
        for segment in super().render(renderable, options):
            if segment.control is None and UNPRINTABLE.search(segment.text):
                segment = Segment(printable(segment.text), segment.style)
            yield segment


def terminal(stderr: bool = False, **kwargs: Any) -> Console:
    return FittedConsole(stderr=stderr, **kwargs)


def labelled(label: str, style: str, message: TextType) -> Text:
    """``label`` styled, then ``message`` as plain text (``error:`` in red, then the line),
    every character of it shown (``Text`` alone would drop a bell or a backspace unseen)."""
    shown = printable(message) if isinstance(message, str) else message
    return Text.assemble((label, style), " ", shown)


def usage_table(*columns: str, title: str | None = None) -> Table:
    """A table whose number columns that are zero in every row are left out when printed."""
    table = Table(*columns, title=title)
    setattr(table, DROP_ZERO, True)
    return table


def _plain(cell: Any) -> str | None:
    if isinstance(cell, str):
        return cell
    if isinstance(cell, Text):
        return cell.plain
    return None


def _is_number(text: str) -> bool:
    stripped = text.strip()
    if stripped in ("-", "—", ""):
        return True
    return bool(NUMERIC.fullmatch(stripped)) and any(ch.isdigit() for ch in stripped)


def _is_zero(text: str) -> bool:
    stripped = text.strip().lstrip("$").rstrip("%").replace(",", "")
    try:
        return float(stripped) == 0
    except ValueError:
        return False


def fit(table: Table, console: Console) -> RenderableType:
    """``table`` rebuilt to be read whole at ``console.width``, or stacked where it cannot be."""
    cells = [list(column.cells) for column in table.columns]
    plain = [[_plain(c) for c in column] for column in cells]
    if any(p is None for column in plain for p in column):
        return table  # cells that are renderables of their own: printed as they are
    texts: list[list[str]] = [[p or "" for p in column] for column in plain]
    if not texts:
        return table
    rows = len(texts[0]) if texts else 0
    numeric = [rows > 0 and all(_is_number(t) for t in column) for column in texts]
    whole = [n or c.no_wrap for n, c in zip(numeric, table.columns, strict=True)]  # never wraps
    keep = list(range(len(table.columns)))
    dropped: list[str] = []
    if getattr(table, DROP_ZERO, False) and rows:
        zero = [numeric[k] and all(_is_zero(t) or t.strip() == "-" for t in texts[k]) for k in keep]
        dropped = [str(table.columns[k].header) for k in keep if zero[k]]
        keep = [k for k in keep if not zero[k]]
    note = Text(f"all zero: {', '.join(dropped)}", style="dim") if dropped else None
    widths = _widths(table, keep, texts, whole, console.width)
    if widths is None:
        return _stacked(table, keep, texts, note)
    fitted = Table(title=table.title, show_header=table.show_header, box=table.box)
    for k, width in zip(keep, widths, strict=True):
        justify = "right" if numeric[k] else table.columns[k].justify
        fitted.add_column(table.columns[k].header, justify=justify, width=width, overflow="fold")
    for r in range(rows):
        fitted.add_row(*(texts[k][r] for k in keep))
    parts: list[RenderableType] = [fitted]
    title = str(table.title or "")
    if len(title) > sum(widths) + 3 * len(widths) + 1:  # a title the table would break
        fitted.title = None
        parts.insert(0, Text(title, style="italic"))
    return Group(*parts, note) if note is not None else Group(*parts)


NAME_WIDTH = 8  # the narrowest a wrapped name column may be and still read as names
TALL = 6  # a cell wrapped over more lines than this: the table is stacked instead


def _widths(
    table: Table, keep: list[int], texts: list[list[str]], whole: list[bool], width: int
) -> list[int] | None:
    """Each column's width at ``width`` (None: the table cannot fit and is stacked). A number
    column is as wide as its widest number and header word (a header wraps between words), a
    name column at least ``NAME_WIDTH`` (its names wrap); what is left goes to the first
    column (the row's name), then to the other names, then unwraps the number headers."""
    least, natural = [], []
    for k in keep:
        header = str(table.columns[k].header)
        word = max((len(w) for w in header.split()), default=0)
        widest = max((len(t) for t in texts[k]), default=0)
        least.append(max(widest, word) if whole[k] else max(word, min(widest, NAME_WIDTH)))
        natural.append(max(widest, len(header)))
    room = width - 1 - 3 * len(keep)  # a border after each column and one before, padding 2
    if sum(least) > room:
        return None
    widths = list(least)
    spare = room - sum(widths)
    # the first column names its row (a preset, a role, a stage): whole where it can be; then
    # the other names grow a character at a time, the narrowest first; then number headers
    grow = min(natural[0] - widths[0], spare, room // 3)
    widths[0] += max(0, grow)
    for names in (True, False):
        growing = [i for i, k in enumerate(keep) if whole[k] != names]
        while room > sum(widths):
            short = [i for i in growing if widths[i] < natural[i]]
            if not short:
                break
            widths[min(short, key=lambda i: widths[i])] += 1
    # a name that would take more than a few lines of its column reads better stacked
    tall = any(not whole[k] and natural[i] > TALL * widths[i] for i, k in enumerate(keep))
    return None if tall else widths


def _stacked(table: Table, keep: list[int], texts: list[list[str]], note: Text | None):
    """One block per row: its first value as a heading, then each other value under its
    header's name (a table too wide for the terminal even with every name wrapped)."""
    blocks: list[RenderableType] = []
    if table.title:
        blocks.append(Text(str(table.title), style="italic"))
    first, rest = keep[0], keep[1:]
    for r in range(len(texts[first])):
        blocks.append(Text(texts[first][r], style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(overflow="fold")
        grid.add_column(overflow="fold")
        for k in rest:
            grid.add_row(f"  {table.columns[k].header}", texts[k][r])
        blocks.append(grid)
    if note is not None:
        blocks.append(note)
    return Group(*blocks)
