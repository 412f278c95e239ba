"""``python -m groundcover.pipelines.cli`` (or ``python -m groundcover``): the command."""

import sys

from .main import app

sys.exit(app())
