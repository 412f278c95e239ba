"""The ``groundcover`` command line (typer): ``main`` builds the app from the registry,
``data`` the dataset commands, ``options`` the flags every evaluation shares."""

from pipelines.cli.main import app

__all__ = ["app"]
