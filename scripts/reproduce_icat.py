r"""ICAT's Table 3: a thin wrapper over `groundcover reproduce icat` (same arguments).

    python scripts/reproduce_icat.py responses.jsonl --index indexes/clueweb09-icat \
        [--snippets web-snippets.jsonl] --nli-model /models/deberta-v3-large-mnli-fever-anli \
        --model Llama-3.1-70B-Instruct --endpoint http://gpu:8000/v1 [--run-dir runs/icat-table3]

The queries and qrels default to the dataset `trec-web-topics` (--queries / --qrels for others).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from groundcover.pipelines.cli import app

    app(["reproduce", "icat", *sys.argv[1:]])
