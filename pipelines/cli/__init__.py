"""The ``groundcover`` command line (typer): ``main`` builds the app from the registry,
``data`` the dataset commands, ``options`` the flags every evaluation shares."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``from pipelines.cli import app``, loaded on first use: the frameworks import
    ``pipelines.cli.options``, and the app imports every framework."""
    if name == "app":
        from pipelines.cli.main import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
