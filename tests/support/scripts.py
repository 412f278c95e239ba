"""A Python file that is no importable module (a script of ``scripts/``, a file inside a package
that must not run its package's imports) loaded as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """``path`` relative to the repository's root (or absolute), as module ``name`` (its stem)."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, as an import would: dataclasses look their module up there
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
