"""``python -m pipelines.cli``: the same as the ``groundcover`` command."""

import sys

from pipelines.cli.main import app

sys.exit(app())
