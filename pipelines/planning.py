"""Before a run, and after its pilot: what each run would still ask (``--dry-run``, ``--pilot``),
from what its directory holds, the items and the response cache. Nothing here starts a model or
writes a file; the numbers come from ``pipelines.estimate``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.console import Console

from pipelines.identity import lead_evaluator, role_records, run_identity
from pipelines.lines import item_ids, select
from pipelines.protocol import RunPlan, RunRequest
from pipelines.roles import self_judging
from pipelines.runstore import RunStore, fingerprint


def estimate_from_disk(fw, options, run_dir: Path, items, ids, records, prices, derived_total=None,
              replay=None):  # fmt: skip
    """The estimate of one run from what its directory holds (nothing is written); with
    ``replay(missing items)``, the items the response cache answers wholly are exact."""
    from pipelines.estimate import estimate_run
    from pipelines.runstore import RESULTS, index_results

    reader = RunStore(run_dir)  # read only: never opened for writing
    reader.index = index_results(run_dir / RESULTS)
    pending = reader.pending(ids)
    done = [i for i in ids if i not in pending]
    missing = [k for k, i in enumerate(ids) if i in pending]
    recorded = list(reader.results(done))
    n_missing = len(missing)
    if derived_total is not None:  # its items come from an earlier run: about one per item
        n_missing = max(n_missing, derived_total - len(done))
    seconds, solved = throughput(run_dir)
    position = {i: k for k, i in enumerate(ids)}
    cached = replay(select(items, missing)) if replay and items and missing else None
    return estimate_run(
        fw, options, select(items, missing) if items else [], n_missing, recorded,
        select(items, [position[i] for i in done]) if items else None,
        roles=records, prices=prices, throughput=solved / seconds if seconds and solved else None,
        cached=cached,
    )  # fmt: skip


def throughput(run_dir: Path) -> tuple[float, int]:
    from pipelines.runstore import INVOCATIONS

    path = run_dir / INVOCATIONS
    seconds, solved = 0.0, 0
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                seconds, solved = seconds + float(entry["seconds"]), solved + int(entry["solved"])
            except (ValueError, KeyError, TypeError):
                continue
    return seconds, solved


def cache_replay(fw, plan: RunPlan, found, request: RunRequest, root: Path, cache_path, out):
    """``replay(items)`` against the response cache, or None (no cache, or a framework whose
    setup loads models: a dry run starts none)."""
    from pipelines.estimate import replay_cached
    from pipelines.evaluator import CacheReplay
    from serving.cache import ResponseCache

    if cache_path is None or not Path(cache_path).is_file() or not found:
        return None
    if not fw.light_setup(plan.options):
        out.print(f"{fw.name}: its setup loads models, so the response cache is not consulted")
        return None

    def replay(items):
        cache = ResponseCache(cache_path)
        try:
            clients = {role: CacheReplay(ev, cache) for role, ev in found.items()}
            lead = RunRequest(lead_evaluator(found, request.evaluator), request.run,
                              plan.options, request.roles)  # fmt: skip
            resources = fw.setup(lead, root)
            return asyncio.run(replay_cached(fw, items, plan.options, clients, resources,
                                             plan.options.max_reasks))  # fmt: skip
        finally:
            cache.close()

    return replay


def dry_run_estimates(study, request, items, plans, roles, root, prices, out: Console,
                      cache_path=None):  # fmt: skip
    """Per run: (run directory, estimate of what it would still ask). No model, no file; the
    roles, self-judging and a run directory that holds another run are said on ``out``."""
    from pipelines.runstore import MANIFEST, read_manifest

    estimates = []
    for plan, found in zip(plans, roles, strict=True):
        fw = plan.framework or study
        run_dir = root / plan.key if plan.key else root
        derived = plan.items is not None
        if not derived and (run_dir / MANIFEST).is_file():
            config = run_identity(fw, plan.options, found, request.evaluator, items)
            held = read_manifest(run_dir / MANIFEST).get("config_fingerprint")
            if held != fingerprint({"task": plan.task, "config": config}):
                out.print(f"{run_dir}: holds a different run; the real run will refuse it "
                          "(use a new --run-dir)", style="red", soft_wrap=True)  # fmt: skip
                continue
        for role, ev in found.items():
            out.print(f"{run_dir}: role {role}: {ev.ref().request_name}")
        for pair in self_judging(plan.systems | found):
            out.print(f"note: the {pair['judge']} role uses the {pair['system']} model "
                      f"{pair['model']} (self-judging)")  # fmt: skip
        ids = [] if derived else item_ids(items)
        replay = cache_replay(fw, plan, found, request, root, cache_path, out)
        estimate = estimate_from_disk(fw, plan.options, run_dir, [] if derived else items, ids,
                             role_records(fw, found), prices,
                             len(items) if derived else None, replay)  # fmt: skip
        estimates.append((run_dir, estimate | {"derived": derived}))
    return estimates


def print_dry_run(study, request, items, plans, roles, root, prices,
                  cache_path) -> list[tuple[Path, dict]]:  # fmt: skip
    from pipelines.estimate import print_estimate

    out = Console()
    out.print("dry run: inputs checked; no model is started and nothing is written")
    estimates = dry_run_estimates(study, request, items, plans, roles, root, prices, out,
                                  cache_path)  # fmt: skip
    for run_dir, estimate in estimates:
        note = " (items made by an earlier run: about one each)" if estimate["derived"] else ""
        print_estimate(f"{run_dir}{note}", estimate, out)
    return estimates
