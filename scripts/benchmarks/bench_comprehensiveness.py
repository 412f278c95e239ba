"""Cost and speed of the three comprehensiveness methods, measured side by side in one run.

Per method, three runs on the same server and items: the paper protocol with items concurrent
(our runtime), the spec protocol with items concurrent, and the paper protocol one item at a time
(the reference's pattern: the next sample starts when the last is done). Printed: model calls and
tokens per item, items per minute, and the ratios spec/paper (calls, tokens) and
concurrent/one-at-a-time (items/min); for the NLI method also the pairs SPEC's formula
2|A_R||A_C| + |A_C|(|A_C|-1) asks for against the pairs judged after de-duplication. Default: the
embedded model started here on the example items plus the first WikiContradict rows (response
"answer3", both contexts) when ../shared is present. No response cache.

    python scripts/benchmarks/bench_comprehensiveness.py --rows 2
    python scripts/benchmarks/bench_comprehensiveness.py --endpoint http://gpu:8000/v1 \
        --model gpt-oss-20b
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from groundcover.pipelines.comprehensiveness.common import ComprehensivenessOptions, Item
from groundcover.pipelines.comprehensiveness.framework import evaluate_item
from groundcover.serving.client import EvalClient
from groundcover.serving.launch.server import endpoint_or_local

ROOT = Path(__file__).resolve().parents[2]
WC = ROOT.parent / "shared" / "data" / "wikicontradict" / "humaneval-dev.jsonl"


def load_items(rows: int) -> list[Item]:
    items = [
        Item(**json.loads(line)) for line in (ROOT / "examples/comprehensiveness.jsonl").open()
    ]
    if WC.is_file():
        for n, line in enumerate(WC.open()):
            if n >= rows:
                break
            row = json.loads(line)
            items.append(
                Item(
                    id=f"wc{n}",
                    query=row["question"],
                    response=row["answer3"],
                    contexts=[row["context1_self_contained"], row["context2_self_contained"]],
                )
            )
    return items


MODES = {  # name -> (protocol, items concurrently?)
    "paper": ("paper", True),
    "spec": ("spec", True),
    "paper, one item at a time": ("paper", False),
}


async def bench_method(url, model, items: list[Item], method: str, mode: str, args):
    protocol, concurrent = MODES[mode]
    options = ComprehensivenessOptions(
        method=method, protocol=protocol, t_rel=args.t_rel, export_graphs=False
    )
    client = EvalClient(
        url, model, concurrency=args.concurrency, default_params={"temperature": 0.0}
    )
    async with client:
        started = time.perf_counter()
        if concurrent:
            records = await asyncio.gather(*(evaluate_item(client, it, options) for it in items))
        else:
            records = [await evaluate_item(client, it, options) for it in items]
        elapsed = time.perf_counter() - started
    calls = [sum(u["calls"] for u in r.usage.values()) for r in records]
    prompt = [sum(u["prompt_tokens"] for u in r.usage.values()) for r in records]
    completion = [sum(u["completion_tokens"] for u in r.usage.values()) for r in records]
    row = {
        "method": method,
        "mode": mode,
        "items": len(items),
        "statuses": {s: sum(r.status == s for r in records) for s in {r.status for r in records}},
        "calls/item": statistics.mean(calls),
        "prompt tok/item": statistics.mean(prompt),
        "completion tok/item": statistics.mean(completion),
        "items/min": 60 * len(items) / elapsed,
    }
    if method == "nli":
        pairs = [r.details["pairs"] for r in records if "pairs" in r.details]
        row["nli pairs (formula)"] = sum(p["formula"] for p in pairs)
        row["nli pairs judged"] = sum(p["judged"] for p in pairs)
    return row


async def bench(url: str, model: str, args) -> None:
    items = load_items(args.rows)
    rows = [
        await bench_method(url, model, items, method, mode, args)
        for method in args.methods
        for mode in MODES
    ]
    print(
        f"{len(items)} items, model {model}, concurrency {args.concurrency}, no cache, "
        f"t_rel {args.t_rel}"
    )
    for row in rows:
        print(json.dumps(row))
    for row in rows:
        extra = ""
        if "nli pairs judged" in row:
            formula, judged = row["nli pairs (formula)"], row["nli pairs judged"]
            saved = 1 - judged / formula if formula else 0.0
            extra = f"  NLI pairs: formula {formula}, judged {judged} (de-dup saves {saved:.0%})"
        print(
            f"{row['method']:4s} {row['mode']:26s} calls/item {row['calls/item']:7.1f}  prompt "
            f"tok/item {row['prompt tok/item']:8.0f}  completion tok/item "
            f"{row['completion tok/item']:7.0f}  items/min {row['items/min']:6.2f}  "
            f"statuses {row['statuses']}{extra}"
        )
    for method in args.methods:
        by_mode = {r["mode"]: r for r in rows if r["method"] == method}
        paper, spec = by_mode["paper"], by_mode["spec"]
        alone = by_mode["paper, one item at a time"]
        tokens = {m: r["prompt tok/item"] + r["completion tok/item"] for m, r in by_mode.items()}
        print(
            f"{method:4s} spec/paper: calls {_ratio(spec['calls/item'], paper['calls/item'])}, "
            f"tokens {_ratio(tokens['spec'], tokens['paper'])};  items/min concurrent / one "
            f"at a time (paper): {_ratio(paper['items/min'], alone['items/min'])}"
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="WikiContradict rows to add")
    parser.add_argument("--methods", nargs="+", default=["e2e", "qa", "nli"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--t-rel", type=float, default=3.5, help="1 keeps every atom (NLI pairs)")
    parser.add_argument("--endpoint")
    parser.add_argument("--model", default="embedded")
    args = parser.parse_args()
    with endpoint_or_local(args.model, args.endpoint) as (url, name):
        asyncio.run(bench(url, name, args))


if __name__ == "__main__":
    main()
