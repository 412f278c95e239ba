"""Deprecated: the Slurm launcher is ``groundcover cluster`` now (docs/clusters.md, "Slurm").

``launch.py --dry-run ...`` is ``groundcover cluster plan ...``, ``--prefetch`` is ``cluster
prefetch``, ``--check-offline`` is ``cluster check-offline``, and the job itself ``cluster run``
(what ``groundcover.sbatch`` calls); the other arguments are the same. This script says so on
stderr and hands its arguments over; it goes in a later release.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

MODES = {"--dry-run": "plan", "--prefetch": "prefetch", "--check-offline": "check-offline"}


def translated(argv: list[str]) -> list[str]:
    """``groundcover cluster SUBCOMMAND ...`` for the launcher's arguments: the mode flag
    becomes the subcommand (``run`` without one); everything else is passed as given."""
    if argv[:1] in (["node"], ["ports"]):  # a node's step of a job started by an older script
        return ["-m", "groundcover.serving.cluster.job", *argv]
    before, dash, after = (argv, [], []) if "--" not in argv else _split(argv)
    modes = [MODES[a] for a in before if a in MODES]
    rest = [a for a in before if a not in MODES]
    return ["-m", "groundcover", "cluster", modes[0] if modes else "run", *rest, *dash, *after]


def _split(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    k = argv.index("--")
    return argv[:k], ["--"], argv[k + 1 :]


def main(argv: list[str]) -> None:
    if importlib.util.find_spec("groundcover") is None:  # one line, never Python's traceback
        sys.exit(
            f"launch.py: groundcover is not installed for {sys.executable}: activate the "
            "environment ./setup.sh made (docs/clusters.md, Slurm), then `groundcover cluster`"
        )
    new = translated(argv)
    if new[1] == "groundcover":
        warnings.warn(
            "scripts/slurm/launch.py is deprecated: run `groundcover cluster "
            f"{new[3]} ...` (docs/clusters.md)",
            DeprecationWarning,
            stacklevel=1,
        )
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *new])


if __name__ == "__main__":
    warnings.simplefilter("default", DeprecationWarning)
    main(sys.argv[1:])
