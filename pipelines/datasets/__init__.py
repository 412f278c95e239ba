"""Datasets by name: a catalogue of the papers' data, fetched, pinned, verified and cached.

``groundcover data list | info | get | path | add`` is ``pipelines.cli.data``; every command that
reads a data file also takes a catalogue name in its place (``names.resolve_names``).
"""

from .catalog import CATALOG, Dataset, is_name, lookup, parse_spec
from .fetch import Resolved, add, cached, data_root, get, provenance

__all__ = [
    "CATALOG",
    "Dataset",
    "Resolved",
    "add",
    "cached",
    "data_root",
    "get",
    "is_name",
    "lookup",
    "parse_spec",
    "provenance",
]
