"""The ``groundcover`` command line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Column, Table

from pipelines.cli import options
from pipelines.cli.data import data_app
from pipelines.cli.options import clean_errors, parse_loras
from pipelines.datasets.catalog import is_name
from pipelines.runtime import nli_placement
from pipelines.runtime.config import UserError, describe_validation
from pipelines.runtime.registry import commands
from pipelines.runtime.runner import sigterm_as_interrupt
from serving.launcher import ServerSpec, ServerStartError, VLLMServer
from serving.registry import ADAPTER_PRESETS, PRESETS, lora_adapter, resolve
from serving.templates import REASK, load_dir

app = typer.Typer(
    help="groundcover: grounding and coverage evaluation on a self-hosted vLLM stack.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
eval_app = typer.Typer(help="Evaluate responses with one of the frameworks.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
reproduce_app = typer.Typer(
    help="Reproduce a paper's tables (a grid of runs).", no_args_is_help=True
)
app.add_typer(reproduce_app, name="reproduce")
meta_eval_app = typer.Typer(
    help="Meta-evaluate a metric against labels or human judgements.", no_args_is_help=True
)
app.add_typer(meta_eval_app, name="meta-eval")
finetune_app = typer.Typer(help="Fine-tune models for the stack's stages.", no_args_is_help=True)
claims_app = typer.Typer(
    help="Claim extractors (ICAT's AC): data, training, evaluation.", no_args_is_help=True
)
finetune_app.add_typer(claims_app, name="claims")
app.add_typer(finetune_app, name="finetune")
app.add_typer(data_app, name="data")
crux_app = typer.Typer(help="CRUX evaluation data.", no_args_is_help=True)
app.add_typer(crux_app, name="crux")
GROUPS = {
    "eval": eval_app,
    "reproduce": reproduce_app,
    "meta-eval": meta_eval_app,
    "finetune claims": claims_app,
    "crux": crux_app,
}
console = Console(stderr=True)
NLI_APP = "groundcover-nli"

# ---- serve -----------------------------------------------------------------------------------


@app.command()
@clean_errors
def serve(
    model: Annotated[
        str | None, typer.Argument(help="preset name (see `models`), directory or hub id")
    ] = None,
    lora: Annotated[list[str] | None, typer.Option(help="NAME=PATH of a LoRA adapter")] = None,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    run_dir: Annotated[Path, typer.Option(help="where serve.log goes")] = Path("runs/serve"),
    max_model_len: Annotated[int | None, typer.Option()] = None,
    engine_arg: Annotated[list[str] | None, typer.Option(help="extra vLLM flag")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for health")] = 900.0,
    api_key_env: Annotated[
        str | None, typer.Option(help="variable holding the API key (needed off loopback)")
    ] = None,
    replicas: Annotated[int, typer.Option(help="replicas behind one URL (Ray Serve LLM)")] = 1,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster for the replicas (default: local)")
    ] = None,
    nli: Annotated[
        str | None, typer.Option(help="deploy an NLI app of this cross-encoder instead")
    ] = None,
    nli_app: Annotated[str, typer.Option(help="the NLI app's name")] = NLI_APP,
    nli_replicas: Annotated[int, typer.Option(help="NLI replicas")] = 1,
    nli_device: Annotated[str, typer.Option(help="cpu | cuda (one GPU per replica)")] = "cpu",
    nli_batch: Annotated[int, typer.Option(help="pairs per forward pass")] = 32,
    nli_resources: options.NliResourcesOpt = None,
    stop: Annotated[bool, typer.Option("--stop", help="delete the NLI app --nli-app")] = False,
) -> None:
    """Start the vLLM OpenAI-compatible server for MODEL (plus adapters) and wait. It binds
    127.0.0.1 unless --host says otherwise; another address needs an API key, which clients
    send as a Bearer token (evaluator option api_key_env, OPENAI_API_KEY by default).

    With --nli CHECKPOINT: deploy a named NLI app on the Ray cluster at --ray-address and
    return; it stays warm for every run that says --nli-app NAME (--stop deletes it)."""
    if nli or stop:
        serve_nli(
            nli,
            nli_app,
            stop,
            ray_address,
            timeout,
            nli_replicas=nli_replicas,
            nli_device=nli_device,
            nli_batch=nli_batch,
            nli_resources=nli_resources,
        )
        return
    if model is None:
        raise UserError("serve: give MODEL (or --nli CHECKPOINT for an NLI app)")
    preset = resolve(model)
    adapters = parse_loras(lora)
    for name, path in adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise UserError(f"--lora {name}: no adapter_config.json in {path}")
    try:
        loras = [lora_adapter(n, p, preset.name, model) for n, p in adapters.items()]
    except ValueError as exc:  # wrong base model, rank above the limit, unreadable config
        raise UserError(str(exc)) from exc
    spec = ServerSpec(
        model=model,
        loras=loras,
        host=host,
        port=port,
        max_model_len=max_model_len,
        extra_args=list(engine_arg or []),
        api_key=api_key_from(api_key_env),
    )
    try:
        spec.check_exposure()
    except ServerStartError as exc:
        raise UserError(str(exc)) from exc
    if replicas > 1 or ray_address:
        serve_replicas(spec, replicas, ray_address, timeout)
        return
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


def serve_nli(
    model: str | None, name: str, stop: bool, address: str | None, timeout: float, **placement: Any
) -> None:
    """``serve --nli``: a named NLI app that outlives this command, on a running cluster."""
    from retrieval import nli_serve

    if not address:
        raise UserError(
            "serve --nli: an app that stays needs a running cluster (`ray start "
            "--head`); give --ray-address (auto, or HOST:PORT)"
        )
    if stop:
        found = nli_serve.stop_named(name, address)
        console.print(f"deleted the NLI app {name}" if found else f"no NLI app {name} to delete")
        return
    assert model is not None
    try:
        resources = nli_placement.parse_resources(placement["nli_resources"])
        settings = nli_serve.app_settings(
            model,
            replicas=placement["nli_replicas"],
            device=placement["nli_device"],
            batch_size=placement["nli_batch"],
            resources=resources,
        )
    except ValueError as exc:
        raise UserError(f"serve --nli: {exc}") from exc
    console.print(f"deploying {settings['replicas']} replicas of {model} as {name}")
    try:
        replicas = nli_serve.start_named(name, settings, address, timeout)
    except nli_serve.NliAppError as exc:
        raise UserError(str(exc)) from exc
    for replica in replicas:
        console.print(f"  replica pid {replica['pid']} on node {replica['node'][:12]}")
    console.print(
        f"NLI app {name} is running; runs use it with --nli-app {name} --ray-address "
        f"{address}; `groundcover serve --nli-app {name} --stop --ray-address "
        f"{address}` deletes it"
    )


def serve_replicas(spec: ServerSpec, replicas: int, address: str | None, timeout: float) -> None:
    from serving.ray_serve import RayReplicas

    if replicas < 1:
        raise UserError("--replicas must be at least 1")
    try:
        app = RayReplicas(spec, replicas, address=address, port=spec.port or None)
    except ServerStartError as exc:
        raise UserError(str(exc)) from exc
    sigterm_as_interrupt()
    console.print(f"starting {replicas} replicas of {spec.preset.name} on Ray Serve")
    try:
        app.start(timeout)
        names = ", ".join([app.served_name, *(app.adapter_prefix + a.name for a in spec.loras)])
        console.print(f"serving {names} at {app.base_url}  (Ctrl-C stops)")
        if spec.loras:
            console.print(
                f"evaluations reach the adapters with --endpoint {app.base_url} "
                f"--adapter-prefix {app.adapter_prefix}"
            )
        while app.alive():
            time.sleep(1.0)
        raise ServerStartError(f"the Ray Serve app ended: {app.gone()}")
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        app.stop()


def authorised(header: str | None, key: str) -> bool:
    """``Bearer KEY``, or HTTP Basic with KEY as the password (what a browser sends)."""
    import base64
    import binascii
    import hmac

    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), key.encode())


def api_key_from(variable: str | None) -> str | None:
    if variable is None:
        return None
    key = os.environ.get(variable, "")
    if not key:
        raise UserError(f"--api-key-env {variable}: the variable is not set or empty")
    return key


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
    from serving.adapters import listing

    for entry in listing():  # trained and registered with `finetune claims register`
        name = entry["name"]
        Console().print(
            f"registered adapter {name}: base {entry['base']}, rank {entry['rank']} "
            f"at {entry['path']} (serve with --lora {name})"
        )


def all_templates() -> dict[str, Any]:
    templates = {REASK.name: REASK}
    for folder in sorted(Path(__file__).parents[1].rglob("prompts")):
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


# ---- index -----------------------------------------------------------------------------------

index_app = typer.Typer(help="Build and search BM25 / FAISS indexes.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("build")
@clean_errors
def index_build_command(
    corpus: Annotated[
        Path, typer.Argument(help="JSONL (id+contents or title+text), TSV, TREC; or a dataset name")
    ],
    out: Annotated[Path, typer.Argument(help="new index directory")],
    chunk_by: Annotated[str, typer.Option(help="words | chars")] = "words",
    chunk_size: Annotated[int, typer.Option(help="words (128) or characters (1024)")] = 128,
    chunk_overlap: Annotated[int, typer.Option(help="overlap in words")] = 32,
    chunk_trailing: Annotated[
        bool, typer.Option(help="keep the short windows at a document's end (ICAT's snippets)")
    ] = False,
    dense_model: Annotated[
        str, typer.Option(help="sentence-transformers name/path, 'default' or 'none'")
    ] = "default",
    faiss: Annotated[
        str,
        typer.Option(
            help="flat | hnsw | ivf-hnsw | ivf-pq | auto (ICAT: flat below 50k chunks, else "
            "ivf-hnsw; ivf-pq when that exceeds --memory-budget)"
        ),
    ] = "flat",
    nlist: Annotated[int | None, typer.Option(help="IVF lists (default ~4*sqrt(chunks))")] = None,
    nprobe: Annotated[int, typer.Option(help="IVF lists probed per query")] = 16,
    pq_m: Annotated[
        int | None, typer.Option(help="ivf-pq: sub-vectors = bytes per code (default dim/8)")
    ] = None,
    pq_bits: Annotated[int, typer.Option(help="ivf-pq: bits per sub-vector code")] = 8,
    opq: Annotated[bool, typer.Option("--opq", help="ivf-pq: learn an OPQ rotation")] = False,
    refine: Annotated[
        int | None,
        typer.Option(
            help="ivf-pq: re-rank refine*k candidates exactly from the stored vectors (4)"
        ),
    ] = None,
    vectors: Annotated[str, typer.Option(help="stored embeddings: float32 | float16")] = "float32",
    memory_budget: Annotated[
        float | None, typer.Option(help="GB the FAISS index may take; refuse a larger one")
    ] = None,
    no_bm25: Annotated[bool, typer.Option("--no-bm25", help="skip the BM25 index")] = False,
    shards: Annotated[
        int | None, typer.Option(help="embedding and IVF shards (default one per 100k chunks)")
    ] = None,
    ray: Annotated[bool, typer.Option("--ray", help="build shards as Ray tasks")] = False,
    device: Annotated[str, typer.Option(help="embedding device: cpu | cuda")] = "cpu",
) -> None:
    """Chunk a corpus and build BM25, embeddings and a FAISS index with a manifest. An
    interrupted build resumes when the same command is run again."""
    from index_build.ann import BudgetError
    from index_build.build import BuildError, IndexSpec, build_index
    from index_build.corpus import CorpusError
    from pipelines.datasets.names import dataset_file

    if not corpus.exists() and is_name(str(corpus)):  # e.g. clueweb09-b, registered with data add
        corpus = dataset_file(str(corpus))
    try:
        spec = IndexSpec(
            chunk_by=chunk_by,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            chunk_trailing=chunk_trailing,
            faiss=faiss,
            bm25=not no_bm25,
            shards=shards,
            ray=ray,
            dense_model=None if dense_model == "none" else dense_model,
            ivf_nlist=nlist,
            ivf_nprobe=nprobe,
            pq_m=pq_m,
            pq_bits=pq_bits,
            opq=opq,
            refine=refine,
            vectors=vectors,
            memory_budget=memory_budget,
            device=device,
        )
    except ValidationError as exc:
        raise UserError(f"index options: {describe_validation(exc)}") from exc
    try:
        manifest = build_index(corpus, out, spec)
    except (BuildError, BudgetError, CorpusError, FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from exc
    counts = manifest["counts"]
    console.print(
        f"built {out}: {counts['documents']} documents, {counts['chunks']} chunks, "
        f"{manifest['build_seconds']} s"
    )


@index_app.command("tune")
@clean_errors
def index_tune_command(
    index: Annotated[Path, typer.Argument(help="index directory")],
    queries: Annotated[
        Path, typer.Option(help="held-out queries: text lines, or JSONL with query/text")
    ],
    recall: Annotated[float, typer.Option(help="recall@k target against exact search")] = 0.95,
    k: Annotated[int, typer.Option(help="the k of recall@k")] = 10,
    sample: Annotated[int, typer.Option(help="queries used at most (a seeded sample)")] = 1000,
) -> None:
    """Choose efSearch / nprobe / refine depth reaching a recall target; written to the
    index's manifest and used by default from then on."""
    from retrieval.index import IndexError_
    from retrieval.tune import TuneError, read_queries, tune

    if not queries.is_file():
        raise UserError(f"{queries}: no such file")
    try:
        record = tune(index, read_queries(queries, sample), target=recall, k=k)
    except (IndexError_, TuneError) as exc:
        raise UserError(str(exc)) from exc
    console.print(
        f"tuned {index}: {record['chosen'] or 'exact search'} -> recall@{k} {record['recall']:.3f} "
        f"at {record['qps']:,.0f} queries/s ({record['speedup_vs_exact']}x exact) "
        f"over {record['queries']} queries"
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
        results = searcher.search(query, k=k, mode=mode, mmr=mmr, reranker=reranker)  # type: ignore[arg-type]
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
def report(
    run_dir: Annotated[list[Path], typer.Argument(help="run directories (or a study's root)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per run")] = False,
    html: Annotated[
        Path | None, typer.Option(help="also write one self-contained HTML page")
    ] = None,
    export: Annotated[
        Path | None, typer.Option(help="also write per-item scores to a file")
    ] = None,
    format: Annotated[str, typer.Option(help="export format: csv | parquet")] = "csv",
    prices: Annotated[
        Path | None, typer.Option(help="YAML: model -> $ per million tokens or GPU-hour")
    ] = None,
) -> None:
    """Rebuild and print the summary and tables of runs from what is on disk (no model calls;
    partial runs too); optionally an HTML page (--html) and per-item scores (--export)."""
    from pipelines.reports.report import report as rebuild

    if format not in ("csv", "parquet"):
        raise UserError(f"--format must be csv or parquet, got {format!r}")
    from pipelines.runtime.costs import load_prices

    priced = load_prices(prices)
    rebuild(run_dir, as_json, Console(), priced)
    if html is not None:
        from pipelines.reports.report_html import write_html

        Console(stderr=True).print(f"html: {write_html(run_dir, html, prices=priced)}")
    if export is not None:
        from pipelines.reports.report_html import export_scores

        Console(stderr=True).print(f"export: {export_scores(run_dir, export, format)}")


@app.command()
@clean_errors
def compare(
    run_dir: Annotated[list[Path], typer.Argument(help="two or more runs over the same items")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    html: Annotated[
        Path | None, typer.Option(help="also write an HTML page: this comparison, then each run")
    ] = None,
    top: Annotated[int, typer.Option(help="largest per-item differences printed per pair")] = 10,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 10_000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
) -> None:
    """Compare runs item by item: each run's mean with a 95% BCa interval; per pair the paired
    mean difference with a paired BCa interval, win/tie/loss, sign and Wilcoxon p-values, the
    largest per-item differences, and items only one run has. Runs of different frameworks or
    protocols are refused. No model is called."""
    from pipelines.reports.compare import compare_runs, print_comparison, run_dirs

    if resamples < 100:
        raise UserError(f"--resamples {resamples}: use at least 100")
    result = compare_runs(run_dir, resamples, seed)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_comparison(result, Console(), top)
    if html is not None:
        from pipelines.reports.report_html import write_html

        pages = [page for run in result["runs"] for page in run_dirs(Path(run["run"]))]
        Console(stderr=True).print(f"html: {write_html(pages, html, result)}")


@app.command()
@clean_errors
def view(
    run_dir: Annotated[list[Path], typer.Argument(help="run directories")],
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8765,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    api_key_env: Annotated[
        str | None, typer.Option(help="variable holding the key (needed off loopback)")
    ] = None,
) -> None:
    """Serve the HTML report of the runs at http://127.0.0.1:PORT/ until Ctrl-C (rebuilt on
    every request, so a running evaluation shows its progress). Opens nothing else. Another
    --host needs a key, as `serve` does: a browser gives it as the password of the login it
    is asked for (any user name), a client as a Bearer token."""
    import http.server

    from pipelines.reports.report_html import render
    from serving.launcher import is_loopback

    key = api_key_from(api_key_env)
    if key is None and not is_loopback(host):
        raise UserError(
            f"--host {host} shows the runs beyond this machine: give it a key "
            "(--api-key-env NAME, the key in that variable)"
        )

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if key is not None and not authorised(self.headers.get("Authorization"), key):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="groundcover"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = render(run_dir).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    render(run_dir)  # bad run directories stop here, with one line
    server = http.server.ThreadingHTTPServer((host, port), Page)
    console.print(f"report at http://{host}:{server.server_address[1]}/  (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# Every framework's commands, from the registry: `eval <framework>`, `reproduce <paper>` and
# its studies.
for path, command in commands().items():
    group, _, name = path.rpartition(" ")
    GROUPS.get(group, app).command(name)(command)


def main() -> None:  # pragma: no cover - console entry
    app()
