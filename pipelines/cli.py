"""The ``groundcover`` command line."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import Field, ValidationError
from rich.console import Console
from rich.table import Column, Table

from pipelines import generate as generate_task
from pipelines.comprehensiveness import ComprehensivenessConfig, evaluate_item
from pipelines.comprehensiveness import Item as ComprehensivenessItem
from pipelines.comprehensiveness.common import PROMPTS
from pipelines.comprehensiveness.meta import (
    bca_interval,
    conflictbank_items,
    lmr_conflictbank,
    lmr_wikicontradict,
    wikicontradict_items,
)
from pipelines.comprehensiveness.nli_method import make_judge
from pipelines.config import (
    EvaluatorConfig,
    RunConfig,
    Strict,
    UserError,
    describe_validation,
    load_config,
    read_jsonl,
)
from pipelines.evaluator import model_record, open_evaluator
from pipelines.runner import run_items
from pipelines.runstore import (
    RunStore,
    RunStoreError,
    atomic_write_json,
    fingerprint,
    status_counts,
)
from serving.client import EndpointError
from serving.embedded import EmbeddedModelMissing
from serving.launcher import ServerSpec, ServerStartError, VLLMServer
from serving.registry import ADAPTER_PRESETS, PRESETS, UnknownModelError, lora_adapter, resolve
from serving.templates import REASK, load_dir

app = typer.Typer(
    help="groundcover: grounding and coverage evaluation on a self-hosted vLLM stack.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)

USER_ERRORS = (UserError, RunStoreError, UnknownModelError, EmbeddedModelMissing)
RUNTIME_ERRORS = (ServerStartError, EndpointError)


def clean_errors(command):
    """One line on stderr and a non-zero exit instead of a traceback for expected failures."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except USER_ERRORS as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except RUNTIME_ERRORS as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            console.print("finished items are saved; rerun the same command to resume")
            raise typer.Exit(1) from None

    return wrapper


def parse_loras(values: list[str] | None) -> dict[str, str]:
    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--lora expects NAME=PATH, got {value!r}")
        out[name] = path
    return out


def sigterm_as_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so servers we started are stopped on the way out."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# ---- serve -----------------------------------------------------------------------------------


@app.command()
@clean_errors
def serve(
    model: Annotated[str, typer.Argument(help="preset name (see `models`), directory or hub id")],
    lora: Annotated[list[str] | None, typer.Option(help="NAME=PATH of a LoRA adapter")] = None,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    run_dir: Annotated[Path, typer.Option(help="where serve.log goes")] = Path("runs/serve"),
    max_model_len: Annotated[int | None, typer.Option()] = None,
    engine_arg: Annotated[list[str] | None, typer.Option(help="extra vLLM flag")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for health")] = 900.0,
) -> None:
    """Start the vLLM OpenAI-compatible server for MODEL (plus adapters) and wait."""
    preset = resolve(model)
    adapters = parse_loras(lora)
    for name, path in adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise UserError(f"--lora {name}: no adapter_config.json in {path}")
    loras = [lora_adapter(n, p, preset.name) for n, p in adapters.items()]
    spec = ServerSpec(
        model=model,
        loras=loras,
        host=host,
        port=port,
        max_model_len=max_model_len,
        extra_args=list(engine_arg or []),
    )
    server = VLLMServer(spec, run_dir / "serve.log")
    sigterm_as_interrupt()
    console.print(f"starting {preset.name} ({server.device}); log: {server.log_path}")
    try:
        server.start(timeout)
        names = ", ".join([preset.name, *adapters])
        console.print(f"serving {names} at {server.base_url}  (Ctrl-C stops)")
        while server.process is not None and server.process.poll() is None:
            time.sleep(1.0)
        raise ServerStartError(f"vLLM exited unexpectedly; see {server.log_path}")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        server.stop()


# ---- registry and prompts --------------------------------------------------------------------


@app.command()
def models() -> None:
    """List model presets and registered LoRA adapters."""
    table = Table("max len", "dtype", "TP", "reasoning", "notes")
    table.columns.insert(0, Column("hub id", no_wrap=True))
    table.columns.insert(0, Column("name", no_wrap=True))
    for p in PRESETS.values():
        table.add_row(
            p.name,
            p.hub_id,
            str(p.max_model_len),
            p.dtype,
            str(p.tensor_parallel_size),
            p.reasoning_effort or "-",
            p.notes,
        )
    Console().print(table)
    for preset in ADAPTER_PRESETS.values():
        Console().print(
            f"adapter {preset.name}: base {preset.base}, rank {preset.rank} "
            f"(serve with --lora {preset.name}=PATH)"
        )


def all_templates() -> dict[str, Any]:
    templates = {REASK.name: REASK}
    for folder in sorted(Path(__file__).parent.rglob("prompts")):
        templates |= load_dir(folder)
    return templates


@app.command()
def prompts(name: Annotated[str | None, typer.Argument(help="print this template")] = None) -> None:
    """List the versioned prompt templates, or print one."""
    templates = all_templates()
    if name is None:
        for template in templates.values():
            typer.echo(f"{template.id}\t{template.path}")
        return
    if name not in templates:
        console.print(f"[red]error:[/red] no template {name!r}; have {', '.join(templates)}")
        raise typer.Exit(2)
    typer.echo(templates[name].text())


# ---- shared option types and the task runner ------------------------------------------------

ConfigOpt = Annotated[Path | None, typer.Option(help="YAML config file")]
ModelOpt = Annotated[str | None, typer.Option(help="preset, directory or hub id")]
EndpointOpt = Annotated[str | None, typer.Option(help="OpenAI-compatible URL; none: start vLLM")]
AdapterOpt = Annotated[str | None, typer.Option(help="LoRA adapter to query")]
LoraOpt = Annotated[list[str] | None, typer.Option(help="NAME=PATH to serve")]
RunDirOpt = Annotated[Path | None, typer.Option(help="default: runs/<task>-<fingerprint>")]
IntOpt = Annotated[int | None, typer.Option()]
FloatOpt = Annotated[float | None, typer.Option()]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="skip the response cache")]
QuietOpt = Annotated[bool, typer.Option(help="no progress bar")]


def evaluator_overrides(
    model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
) -> dict[str, Any]:
    return {
        "evaluator.model": model,
        "evaluator.endpoint": endpoint,
        "evaluator.adapter": adapter,
        "evaluator.adapters": parse_loras(lora) or None,
        "evaluator.concurrency": concurrency,
        "evaluator.max_tokens": max_tokens,
        "evaluator.temperature": temperature,
        "run.run_dir": run_dir and str(run_dir),
    }


def items_digest(items) -> str:
    """Content hash of the items themselves (not the file): resumes only on the same inputs."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps(item.model_dump(), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def run_identity(cfg, items, prompt_ids: dict[str, str], **task: Any) -> dict[str, Any]:
    """What makes two runs the same run (so a rerun resumes): not concurrency, timeouts, URL."""
    ev = cfg.evaluator
    return {
        "items_sha256": items_digest(items),
        "items": len(items),
        "model": ev.model,
        "adapter": ev.adapter,
        "temperature": ev.temperature,
        "max_tokens": ev.max_tokens,
        "prompts": prompt_ids,
        **task,
    }


def execute(task: str, cfg, items, prompt_ids, identity, make_solver, no_cache, quiet) -> Path:
    """Open (or resume) the run, solve what is missing, write and print the summary."""
    store = RunStore(cfg.run.run_dir or Path("runs") / f"{task}-{fingerprint(identity)}")
    store.open(task=task, config=identity, models=model_record(cfg.evaluator), prompts=prompt_ids)
    console.print(f"run directory: {store.dir}")
    todo = len(items) - len(store.completed_ids() & {i.id for i in items})
    started = time.time()
    usage: dict[str, Any] = {}
    if todo:  # nothing missing: no model is started at all
        sigterm_as_interrupt()
        usage = asyncio.run(
            _solve_all(cfg, items, store, None if no_cache else cfg.run.cache, make_solver, quiet)
        )
    finish(store, task, items, usage, time.time() - started)
    return store.dir


async def _solve_all(cfg, items, store, cache_path, make_solver, quiet) -> dict[str, Any]:
    async with open_evaluator(cfg.evaluator, store.dir, cache_path) as client:
        solve = make_solver(client, store)
        await run_items(
            items, solve, store, concurrency=cfg.evaluator.concurrency, show_progress=not quiet
        )
        return client.usage_report()


# ---- generate --------------------------------------------------------------------------------


class GenerateConfig(Strict):
    input: Path
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    run: RunConfig = Field(default_factory=RunConfig)


@app.command()
@clean_errors
def generate(
    input: Annotated[Path, typer.Argument(help="JSONL: id, question, optional contexts")],
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    adapter: AdapterOpt = None,
    lora: LoraOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    temperature: FloatOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Generate an answer per question (from its background texts only, when given)."""
    overrides = {"input": str(input)} | evaluator_overrides(
        model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
    )
    cfg = load_config(GenerateConfig, config, overrides)
    items = read_jsonl(cfg.input, generate_task.GenerateItem)
    prompt_ids = {"answer": generate_task.TEMPLATE.id, "reask": REASK.id}

    def make_solver(client, store):
        async def solve(item):
            return await generate_task.generate_one(client, item)

        return solve

    identity = run_identity(cfg, items, prompt_ids)
    execute("generate", cfg, items, prompt_ids, identity, make_solver, no_cache, quiet)


def finish(store: RunStore, task: str, items, usage: dict[str, Any], seconds: float) -> None:
    ids = {i.id for i in items}
    records = [r for r in store.results() if r["id"] in ids]
    summary = {
        "task": task,
        "items": len(items),
        "recorded": len(records),
        "statuses": status_counts(records),
        "usage_this_invocation": usage,
        "seconds_this_invocation": round(seconds, 3),
    }
    scores = [r["score"] for r in records if r.get("status") == "ok" and "score" in r]
    if scores:  # over items with a defined score; the other statuses are counted above
        summary["mean_score"] = sum(scores) / len(scores)
        summary["scored_items"] = len(scores)
    store.write_summary(summary)
    print_summary(summary)


def print_summary(summary: dict[str, Any]) -> None:
    table = Table(title=f"{summary['task']}: {summary['recorded']}/{summary['items']} recorded")
    table.add_column("status")
    table.add_column("items", justify="right")
    for status, count in summary["statuses"].items():
        if count:
            table.add_row(status, str(count))
    Console().print(table)
    if "mean_score" in summary:
        Console().print(
            f"mean score {summary['mean_score']:.4f} over {summary['scored_items']} scored items"
        )
    usage = summary.get("usage_this_invocation") or {}
    if usage:
        stages = Table(
            "stage",
            "calls",
            "requests",
            "cache hits",
            "retries",
            "prompt tok",
            "completion tok",
            title="model usage (this invocation)",
        )
        for stage, u in usage.items():
            stages.add_row(
                stage,
                *(
                    str(u[k])
                    for k in (
                        "calls",
                        "requests",
                        "cache_hits",
                        "retries",
                        "prompt_tokens",
                        "completion_tokens",
                    )
                ),
            )
        Console().print(stages)


# ---- eval ------------------------------------------------------------------------------------

eval_app = typer.Typer(help="Evaluate responses with one of the frameworks.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


class ComprehensivenessRun(Strict):
    input: Path
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    metric: ComprehensivenessConfig = Field(default_factory=ComprehensivenessConfig)


@eval_app.command("comprehensiveness")
@clean_errors
def eval_comprehensiveness(
    input: Annotated[Path, typer.Argument(help="JSONL: id, query, response, contexts")],
    method: Annotated[str | None, typer.Option(help="nli | qa | e2e (default qa)")] = None,
    t_rel: Annotated[float | None, typer.Option(help="relevance threshold (3.5)")] = None,
    t_conf: Annotated[float | None, typer.Option(help="confidence threshold (2)")] = None,
    summarise: Annotated[bool | None, typer.Option(help="condense contexts first")] = None,
    nli_backend: Annotated[str | None, typer.Option(help="llm | cross-encoder")] = None,
    nli_model: Annotated[str | None, typer.Option(help="cross-encoder checkpoint")] = None,
    tools: Annotated[bool | None, typer.Option(help="comparator may call the units tool")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    adapter: AdapterOpt = None,
    lora: LoraOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    temperature: FloatOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Comprehensiveness of each response against its contexts (NLI, Q&A or end-to-end)."""
    overrides = {
        "input": str(input), "metric.method": method, "metric.t_rel": t_rel,
        "metric.t_conf": t_conf, "metric.summarise": summarise,
        "metric.nli_backend": nli_backend, "metric.nli_model": nli_model, "metric.tools": tools,
    } | evaluator_overrides(
        model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
    )  # fmt: skip
    cfg = load_config(ComprehensivenessRun, config, overrides)
    items = read_jsonl(cfg.input, ComprehensivenessItem)
    run_comprehensiveness(cfg, items, "comprehensiveness", no_cache, quiet)


def run_comprehensiveness(cfg: ComprehensivenessRun, items, task: str, no_cache, quiet) -> Path:
    metric = cfg.metric
    judge = make_judge(metric) if metric.method == "nli" else None  # loads a cross-encoder once
    prompt_ids = {name: t.id for name, t in PROMPTS.items()} | {"reask": REASK.id}

    def make_solver(client, store):
        async def solve(item):
            return await evaluate_item(
                client, item, metric, nli_judge=judge, graph_dir=store.dir / "graphs"
            )

        return solve

    identity = run_identity(cfg, items, prompt_ids, metric=metric.model_dump())
    task = f"{task}-{metric.method}"
    return execute(task, cfg, items, prompt_ids, identity, make_solver, no_cache, quiet)


# ---- meta-eval -------------------------------------------------------------------------------

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WC_DEFAULT = SHARED_DATA / "wikicontradict" / "humaneval-dev.jsonl"
META_DATASETS = {
    "wikicontradict": (wikicontradict_items, lmr_wikicontradict),
    "conflictbank": (lambda path, n: conflictbank_items(path, limit=n), lmr_conflictbank),
}


def print_lmr(result: dict[str, Any]) -> None:
    ci = result["ci95"]
    title = f"LMR on {result['dataset']} ({result['method']}, {result['model']})"
    table = Table("measure", "value", title=title)
    table.add_row(
        "LMR", f"{result['lmr']:.4f}  [{ci['low']:.4f}, {ci['high']:.4f}] ({ci['method']})"
    )
    for key in ("strict", "lax"):
        if key in result:
            table.add_row(f"LMR {key}", f"{result[key]:.4f}")
    for label, entry in result.get("by_label", {}).items():
        table.add_row(f"label {label}", f"{entry['lmr']:.4f} (n={entry['n']})")
    table.add_row("not scored", json.dumps(result["not_scored"]))
    Console().print(table)


@app.command("meta-eval")
@clean_errors
def meta_eval(
    dataset: Annotated[str, typer.Argument(help="wikicontradict | conflictbank")],
    data: Annotated[
        Path | None, typer.Option(help="data file (default for wikicontradict: ../shared)")
    ] = None,
    method: Annotated[str | None, typer.Option(help="nli | qa | e2e (default qa)")] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N data rows")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    adapter: AdapterOpt = None,
    lora: LoraOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    temperature: FloatOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 10_000,
) -> None:
    """Meta-evaluate comprehensiveness: LMR_WC per label (wikicontradict) or strict / lax / mean
    LMR (conflictbank, paper Figure 7), each with a 95% BCa interval; writes lmr.json."""
    if dataset not in META_DATASETS:
        raise UserError(f"unknown dataset {dataset!r}: use {' or '.join(META_DATASETS)}")
    if data is None:
        if dataset != "wikicontradict":
            raise UserError(f"{dataset} needs --data (the file is not shipped)")
        data = WC_DEFAULT
    loader, stats_fn = META_DATASETS[dataset]
    overrides = {"input": str(data), "metric.method": method} | evaluator_overrides(
        model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
    )
    cfg = load_config(ComprehensivenessRun, config, overrides)
    items = loader(cfg.input, limit)
    run = run_comprehensiveness(cfg, items, f"meta-{dataset}", no_cache, quiet)
    ids = {i.id for i in items}
    records = [r for r in RunStore(run).results() if r["id"] in ids]
    result = {"dataset": dataset, "method": cfg.metric.method, "model": cfg.evaluator.model}
    result |= stats_fn(records, resamples)
    atomic_write_json(run / "lmr.json", result)
    print_lmr(result)


# ---- ELI5 study ------------------------------------------------------------------------------


class Eli5Run(Strict):
    input: Path
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    metric: ComprehensivenessConfig = Field(default_factory=ComprehensivenessConfig)
    responders: list[str] = Field(default_factory=lambda: ["embedded"], min_length=1)
    methods: list[str] = Field(default_factory=lambda: ["qa", "e2e"], min_length=1)


def responder_config(spec: str, base: EvaluatorConfig) -> tuple[str, EvaluatorConfig]:
    """'MODEL' (started here) or 'MODEL@URL' (a running endpoint)."""
    model, _, url = spec.partition("@")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    update = {"model": model, "endpoint": url or None, "adapter": None, "adapters": {}}
    return name, EvaluatorConfig.model_validate(base.model_dump() | update)


@app.command()
@clean_errors
def eli5(
    input: Annotated[Path, typer.Argument(help="JSONL: id, query, contexts (background texts)")],
    responder: Annotated[
        list[str] | None, typer.Option(help="answering model: MODEL or MODEL@URL (repeat)")
    ] = None,
    method: Annotated[list[str] | None, typer.Option(help="qa / e2e / nli (repeat)")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """ELI5-style study: each responder answers from the background texts only, then the
    evaluator scores every answer's comprehensiveness (paper Figure 6 table)."""
    overrides = {"input": str(input), "responders": responder, "methods": method} | (
        evaluator_overrides(model, endpoint, None, None, concurrency, max_tokens, None, run_dir)
    )
    cfg = load_config(Eli5Run, config, overrides)
    for m in cfg.methods:
        if m not in ("nli", "qa", "e2e"):
            raise UserError(f"--method {m!r}: use nli, qa or e2e")
    questions = read_jsonl(cfg.input, generate_task.GenerateItem)
    for q in questions:
        if not q.contexts:
            raise UserError(
                f"{cfg.input}: record {q.id!r}: field contexts: background texts needed"
            )
    root = cfg.run.run_dir or Path("runs") / f"eli5-{items_digest(questions)}"
    template = PROMPTS["answer_from_texts"]
    table: dict[str, dict[str, Any]] = {}
    for spec in cfg.responders:
        name, responder_cfg = responder_config(spec, cfg.evaluator)
        gen_cfg = GenerateConfig(
            input=cfg.input,
            evaluator=responder_cfg,
            run=RunConfig(run_dir=root / f"answers-{name}", cache=cfg.run.cache),
        )

        def make_solver(client, store):
            async def solve(item):
                return await generate_task.generate_one(client, item, template)

            return solve

        prompt_ids = {"answer_from_texts": template.id, "reask": REASK.id}
        identity = run_identity(gen_cfg, questions, prompt_ids)
        answers_dir = execute(
            "eli5-answers", gen_cfg, questions, prompt_ids, identity, make_solver, no_cache, quiet
        )
        answers = {r["id"]: r for r in RunStore(answers_dir).results()}
        items = [
            ComprehensivenessItem(id=q.id, query=q.question, contexts=q.contexts,
                                  response=answers[q.id]["response"], responder=name)
            for q in questions if answers[q.id]["status"] == "ok"
        ]  # fmt: skip
        table[name] = {"answered": len(items), "questions": len(questions)}
        for m in cfg.methods:
            comp_cfg = ComprehensivenessRun(
                input=cfg.input, evaluator=cfg.evaluator, metric=cfg.metric.model_copy(
                    update={"method": m}), run=RunConfig(run_dir=root / f"{m}-{name}",
                                                         cache=cfg.run.cache),
            )  # fmt: skip
            run = run_comprehensiveness(comp_cfg, items, "eli5", no_cache, quiet)
            scores = [r["score"] for r in RunStore(run).results() if r["score"] is not None]
            entry: dict[str, Any] = {"n": len(scores), "not_scored": len(items) - len(scores)}
            if scores:
                entry["mean"] = sum(scores) / len(scores)
                entry["ci95"] = bca_interval(scores).as_dict()
            table[name][m] = entry
    atomic_write_json(root / "eli5.json", table)
    print_eli5(table, cfg.methods)


def print_eli5(table: dict[str, dict[str, Any]], methods: list[str]) -> None:
    out = Table("responder", "answered", *methods, title="ELI5 comprehensiveness (mean S, 95% CI)")
    for name, row in table.items():
        cells = []
        for m in methods:
            entry = row[m]
            if "mean" in entry:
                ci = entry["ci95"]
                cells.append(
                    f"{entry['mean']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}] n={entry['n']}"
                )
            else:
                cells.append(f"undefined (n={entry['not_scored']})")
        out.add_row(name, f"{row['answered']}/{row['questions']}", *cells)
    Console().print(out)


# ---- FanOutQA --------------------------------------------------------------------------------

FOQA_DEFAULT = SHARED_DATA / "fanoutqa" / "fanout-final-dev.json"


class FanoutRun(Strict):
    input: Path
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    settings: list[str] = Field(default_factory=lambda: ["closed-book"], min_length=1)
    articles: Path | None = None
    context_tokens: int | None = Field(None, ge=256, description="evidence budget in tokens")
    judge: bool = False
    bleurt: Path | None = Field(None, description="BLEURT PyTorch checkpoint (absent if unset)")


@eval_app.command("fanoutqa")
@clean_errors
def eval_fanoutqa(
    data: Annotated[Path, typer.Option(help="FanOutQA dev/test JSON")] = FOQA_DEFAULT,
    setting: Annotated[
        list[str] | None, typer.Option(help="closed-book | evidence | open-book (repeat)")
    ] = None,
    articles: Annotated[Path | None, typer.Option(help="JSONL {pageid, title, text}")] = None,
    context_tokens: Annotated[int | None, typer.Option(help="evidence budget (tokens)")] = None,
    judge: Annotated[bool | None, typer.Option(help="also run the A-F model judge")] = None,
    bleurt: Annotated[Path | None, typer.Option(help="BLEURT PyTorch checkpoint path")] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N questions")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    adapter: AdapterOpt = None,
    lora: LoraOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    temperature: FloatOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """FanOutQA closed-book / evidence-provided / open-book (search + read tools; needs a server
    with tool calling) answers with loose, strict, ROUGE (equal to the original scorer) and the
    optional A-F model judge; prints the paper's Table 1 columns."""
    from pipelines.fanoutqa import task as foqa

    overrides = {
        "input": str(data), "settings": setting, "articles": articles and str(articles),
        "context_tokens": context_tokens, "judge": judge, "bleurt": bleurt and str(bleurt),
    } | evaluator_overrides(
        model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
    )  # fmt: skip
    cfg = load_config(FanoutRun, config, overrides)
    for name in cfg.settings:
        if name not in ("closed-book", "evidence", "open-book"):
            raise UserError(f"--setting {name!r}: use closed-book, evidence or open-book")
        if name != "closed-book" and cfg.articles is None:
            raise UserError(f"the {name} setting needs --articles (JSONL of pageid, title, text)")
    questions = foqa.load_questions(cfg.input, limit)
    collection = foqa.Articles(cfg.articles) if cfg.articles else None
    budget = cfg.context_tokens or max(512, resolve_len(cfg.evaluator) - 1024)
    if cfg.bleurt is not None and not (cfg.bleurt / "config.json").is_file():
        raise UserError(f"--bleurt {cfg.bleurt}: no checkpoint (config.json) there")
    scorer = None
    if cfg.bleurt is not None:
        from pipelines.fanoutqa.bleurt import Bleurt

        scorer = Bleurt(str(cfg.bleurt))
    table = {}
    for name in cfg.settings:
        prompt_ids = {k: t.id for k, t in foqa.PROMPTS.items()} | {"reask": REASK.id}

        def make_solver(client, store, name=name):
            async def solve(question):
                return await foqa.answer_question(
                    client, question, name, collection, budget, cfg.judge
                )

            return solve

        identity = run_identity(cfg, questions, prompt_ids, setting=name, judge=cfg.judge,
                                budget=budget if name == "evidence" else None)  # fmt: skip
        run_cfg = cfg.model_copy(
            update={
                "run": RunConfig(
                    run_dir=cfg.run.run_dir / name if cfg.run.run_dir else None, cache=cfg.run.cache
                )
            }
        )
        run = execute(f"fanoutqa-{name}", run_cfg, questions, prompt_ids, identity, make_solver,
                      no_cache, quiet)  # fmt: skip
        ids = {item.id for item in questions}
        records = [r for r in RunStore(run).results() if r["id"] in ids]
        table[name] = foqa.table_row(records, questions, scorer)
        atomic_write_json(run / "table1.json", {"model": cfg.evaluator.model, **table[name]})
    print_fanout_table(cfg.evaluator.model, table)


def resolve_len(ev: EvaluatorConfig) -> int:
    try:
        return ev.max_model_len or resolve(ev.model).max_model_len
    except UnknownModelError:
        return 4096


def print_fanout_table(model: str, table: dict[str, dict[str, Any]]) -> None:
    cols = ["loose", "strict", "rouge1", "rouge2", "rougeL", "bleurt", "gpt_judge"]
    out = Table("setting", "model", *cols, title="FanOutQA (paper Table 1 columns)")
    for name, row in table.items():
        cells = ["absent" if row[c] is None else f"{row[c]:.3f}" for c in cols]
        out.add_row(name, model, *cells)
    Console().print(out)


# ---- GaRAGe ----------------------------------------------------------------------------------


class GarageRun(Strict):
    input: Path
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    run: RunConfig = Field(default_factory=RunConfig)


@eval_app.command("garage")
@clean_errors
def eval_garage(
    input: Annotated[Path, typer.Argument(help="GaRAGe JSONL (published schema)")],
    limit: Annotated[int | None, typer.Option(help="only the first N records")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    endpoint: EndpointOpt = None,
    adapter: AdapterOpt = None,
    lora: LoraOpt = None,
    run_dir: RunDirOpt = None,
    concurrency: IntOpt = None,
    max_tokens: IntOpt = None,
    temperature: FloatOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """GaRAGe: cited answers judged for eligibility, (relevance-aware) factuality, deflection and
    attribution; writes tables.json with Tables 2-4 and their breakdowns."""
    from pipelines.garage import task as garage
    from pipelines.garage.data import load_records

    overrides = {"input": str(input)} | evaluator_overrides(
        model, endpoint, adapter, lora, concurrency, max_tokens, temperature, run_dir
    )
    cfg = load_config(GarageRun, config, overrides)
    records = load_records(cfg.input, limit)
    prompt_ids = {k: t.id for k, t in garage.PROMPTS.items()} | {"reask": REASK.id}

    def make_solver(client, store):
        async def solve(record):
            return await garage.evaluate_record(client, record)

        return solve

    identity = run_identity(cfg, records, prompt_ids)
    run = execute("garage", cfg, records, prompt_ids, identity, make_solver, no_cache, quiet)
    ids = {r.id for r in records}
    results = [r for r in RunStore(run).results() if r["id"] in ids]
    tables = garage.summarise(results) | {"breakdowns": garage.breakdowns(results)}
    atomic_write_json(run / "tables.json", tables)
    print_garage(cfg.evaluator.model, tables)


def print_garage(model: str, tables: dict[str, Any]) -> None:
    def fmt(value):
        return "-" if value is None else f"{100 * value:.2f}"

    t2, t3, t4 = tables["table2"], tables["table3"], tables["table4"]
    out = Table("model", "Eligibility", "Unadj. Factuality", "Factuality", "uRAF", "RAF",
                title=f"GaRAGe Table 2 (n={t2['n']})")  # fmt: skip
    out.add_row(
        model,
        *(
            fmt(t2[k])
            for k in ("eligibility", "unadjusted_factuality", "factuality", "uRAF", "RAF")
        ),
    )
    Console().print(out)
    out = Table("model", "deflection TP", "deflection FP", "attr. P", "attr. R", "attr. F1",
                title="GaRAGe Tables 3-4")  # fmt: skip
    out.add_row(model, fmt(t3["true_positive_rate"]), fmt(t3["false_positive_rate"]),
                fmt(t4["precision"]), fmt(t4["recall"]), fmt(t4["f1"]))  # fmt: skip
    Console().print(out)
    Console().print(f"not scored: {tables['not_scored']}")


# ---- index -----------------------------------------------------------------------------------

index_app = typer.Typer(help="Build and search BM25 / FAISS indexes.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("build")
@clean_errors
def index_build_command(
    corpus: Annotated[Path, typer.Argument(help="JSONL (id+contents or title+text), TSV, TREC")],
    out: Annotated[Path, typer.Argument(help="new index directory")],
    chunk_by: Annotated[str, typer.Option(help="words | chars")] = "words",
    chunk_size: Annotated[int, typer.Option(help="words (128) or characters (1024)")] = 128,
    chunk_overlap: Annotated[int, typer.Option(help="overlap in words")] = 32,
    dense_model: Annotated[
        str, typer.Option(help="sentence-transformers name/path, 'default' or 'none'")
    ] = "default",
    faiss: Annotated[str, typer.Option(help="flat | hnsw | ivf-hnsw")] = "flat",
    no_bm25: Annotated[bool, typer.Option("--no-bm25", help="skip the BM25 index")] = False,
    shards: Annotated[int, typer.Option(help="embedding shards")] = 1,
    ray: Annotated[bool, typer.Option("--ray", help="embed shards as Ray tasks")] = False,
) -> None:
    """Chunk a corpus and build BM25, embeddings and a FAISS index with a manifest."""
    from index_build.build import BuildError, IndexSpec, build_index
    from index_build.corpus import CorpusError

    try:
        spec = IndexSpec(
            chunk_by=chunk_by, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
            dense_model=None if dense_model == "none" else dense_model, faiss=faiss,
            bm25=not no_bm25, shards=shards, ray=ray,
        )  # fmt: skip
    except ValidationError as exc:
        raise UserError(f"index options: {describe_validation(exc)}") from exc
    try:
        manifest = build_index(corpus, out, spec)
    except (BuildError, CorpusError, FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from exc
    counts = manifest["counts"]
    console.print(
        f"built {out}: {counts['documents']} documents, {counts['chunks']} chunks, "
        f"{manifest['build_seconds']} s"
    )


@index_app.command("search")
@clean_errors
def index_search_command(
    index: Annotated[Path, typer.Argument(help="index directory")],
    query: Annotated[list[str], typer.Argument(help="one or more queries")],
    k: Annotated[int, typer.Option(help="results per query")] = 10,
    mode: Annotated[str, typer.Option(help="bm25 | dense | hybrid")] = "hybrid",
    mmr: Annotated[float | None, typer.Option(help="MMR lambda (0..1)")] = None,
    rerank_model: Annotated[str | None, typer.Option(help="cross-encoder name/path")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines output")] = False,
) -> None:
    """Search an index; prints rank, score, chunk id and text."""
    from retrieval.index import CrossEncoderReranker, IndexError_, SearchIndex

    if mode not in ("bm25", "dense", "hybrid"):
        raise UserError(f"--mode {mode!r}: use bm25, dense or hybrid")
    try:
        searcher = SearchIndex.load(index)
        reranker = CrossEncoderReranker(rerank_model) if rerank_model else None
        results = searcher.search(query, k=k, mode=mode, mmr=mmr, reranker=reranker)
    except IndexError_ as exc:
        raise UserError(str(exc)) from exc
    for q, hits in zip(query, results, strict=True):
        for rank, hit in enumerate(hits, 1):
            if as_json:
                typer.echo(json.dumps({"query": q, "rank": rank, **hit.__dict__}))
            else:
                typer.echo(f"{rank:3d} {hit.score:9.4f} {hit.chunk_id}  {hit.text[:100]!r}")


@app.command()
@clean_errors
def report(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Print the summary of a finished (or partly finished) run."""
    store = RunStore(run_dir)
    if not store.manifest_path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no manifest.json)")
    if store.summary_path.is_file():
        print_summary(json.loads(store.summary_path.read_text()))
    else:
        records = store.results()
        print_summary(
            {
                "task": store.manifest()["task"],
                "items": len(records),
                "recorded": len(records),
                "statuses": status_counts(records),
            }
        )


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
