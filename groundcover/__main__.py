"""``python -m groundcover``: the ``groundcover`` command."""

from groundcover.pipelines.cli.main import app

app(prog_name="groundcover")
