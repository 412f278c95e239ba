r"""CRUX's retrieval experiments (Table 1 layout): a wrapper over `groundcover reproduce crux`.

    python scripts/reproduce_crux.py --data runs/crux-data [--index indexes/crux] \
        [--reranker /models/ms-marco-MiniLM-L-6-v2] [--ks pstar,10,20] [--generate \
        --model Llama-3.1-70B-Instruct --endpoint http://gpu:8000/v1] [--paper duc] \
        [--run-dir runs/crux-table1]

Same arguments as the command; see `groundcover reproduce crux --help`.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """The command's exit code (0: the table was printed)."""
    from groundcover.pipelines.cli import app

    try:
        app(["reproduce", "crux", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
