"""Deprecated: what a cluster job reads is fetched by ``groundcover cluster prefetch`` and
checked by ``groundcover cluster check-offline`` now (docs/clusters.md), from the command's own
request: its datasets by name (defaults included), its roles' and options' models, the judge,
the NLI checkpoint, the adapters and gpt-oss's tokenizer files.

``prefetch.py --fetch ARGS -- CMD`` is ``groundcover cluster prefetch ARGS -- CMD``, ``--check``
is ``cluster check-offline``; this script says so on stderr and hands its arguments over.
"""

from __future__ import annotations

import os
import sys
import warnings

MODES = {"--fetch": "prefetch", "--check": "check-offline"}


def translated(argv: list[str]) -> list[str]:
    k = argv.index("--") if "--" in argv else len(argv)
    before, after = argv[:k], argv[k:]
    modes = [MODES[a] for a in before if a in MODES]
    rest = [a for a in before if a not in MODES]
    return ["-m", "groundcover", "cluster", modes[0] if modes else "prefetch", *rest, *after]


if __name__ == "__main__":
    warnings.simplefilter("default", DeprecationWarning)
    new = translated(sys.argv[1:])
    warnings.warn(
        f"scripts/prefetch.py is deprecated: run `groundcover cluster {new[3]} ...` "
        "(docs/clusters.md)",
        DeprecationWarning,
        stacklevel=1,
    )
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *new])
