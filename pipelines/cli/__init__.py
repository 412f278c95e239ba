"""The ``groundcover`` command line (typer, used nowhere else): ``main`` holds the app and its
groups, ``frameworks`` builds each framework's commands from its declaration when they run,
``options`` the flags every evaluation shares, and one module per command family (``serve``,
``index``, ``data``, ``finetune``, and, named as the report rooms they drive, ``report``,
``audits``, ``pages``, ``people``)."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``from groundcover.pipelines.cli import app``, loaded on first use (``python -m
    groundcover`` and the entry point import ``main`` directly)."""
    if name == "app":
        from .main import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
