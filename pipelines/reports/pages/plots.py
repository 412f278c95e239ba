"""Small matplotlib figures as inline SVG, for the HTML report's per-framework plots.

A framework describes its plots as data (``Framework.figures``); these functions draw them, so
no framework imports matplotlib and the report embeds everything it shows.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def own_style() -> Iterator[None]:
    """Matplotlib's own defaults while a figure is drawn, whatever ``matplotlibrc`` it read when
    imported: it reads one from the folder the command runs in, and a received bundle's could
    turn on ``text.usetex`` with a LaTeX preamble of its own (LaTeX run here, reading the
    reader's files into the page) or restyle the page. The caller's settings return after."""
    import matplotlib

    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # the backend is kept (Agg, chosen where a figure is made)
        yield


def _svg(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with warnings.catch_warnings():  # a label's letters the font lacks: drawn as boxes
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        figure.tight_layout()
        figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # inline in HTML: no XML prolog


def _label(text: Any) -> str:
    """A label as the terminal shows it: control and bidi characters as escapes."""
    from ...runtime.terminal import printable

    return printable(str(text))


def _axes(width: float = 5.0, height: float = 2.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100)


def bars(spec: dict[str, Any]) -> str:
    """{"kind": "bars", "labels": [...], "values": [...], "low": [...]?, "high": [...]?,
    "ylabel": str}: bars with optional interval whiskers (e.g. BCa 95%)."""
    figure, axes = _axes()
    values = [v if v is not None else 0.0 for v in spec["values"]]
    errors = None
    if spec.get("low") and spec.get("high"):
        below = zip(values, spec["low"], strict=True)
        above = zip(values, spec["high"], strict=True)
        errors = [
            [max(0.0, v - lo) if lo is not None else 0 for v, lo in below],
            [max(0.0, hi - v) if hi is not None else 0 for v, hi in above],
        ]
    labels = [_label(label) for label in spec["labels"]]
    axes.bar(labels, values, yerr=errors, capsize=4, color="#4a7ab5")
    axes.set_ylabel(spec.get("ylabel", ""))
    axes.set_ylim(0, max(1.0, max(values, default=0) * 1.1))
    return _svg(figure)


def lines(spec: dict[str, Any]) -> str:
    """{"kind": "lines", "x": [...], "series": {name: [y...]}, "xlabel", "ylabel"}."""
    figure, axes = _axes()
    for name, ys in spec["series"].items():
        axes.plot(
            spec["x"],
            [y if y is not None else float("nan") for y in ys],
            marker="o",
            label=_label(name),
        )
    axes.set_xlabel(spec.get("xlabel", ""))
    axes.set_ylabel(spec.get("ylabel", ""))
    if len(spec["series"]) > 1:
        axes.legend(fontsize=7)
    return _svg(figure)


DRAW = {"bars": bars, "lines": lines}


def draw(spec: dict[str, Any]) -> str:
    """``spec`` drawn; its labels are data (a source, a system's name), drawn as written:
    parsed, "$x$" would be mathtext, and a stray "$\\" that fails to parse would stop the page."""
    import matplotlib

    with own_style(), matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        return DRAW[spec["kind"]](spec)
