"""`groundcover index`: build, tune and search BM25 / FAISS indexes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..runtime.contract.errors import UserError
from ..runtime.terminal import terminal
from .frameworks import lazy_group
from .options import clean_errors

console = terminal(stderr=True)
index_app = typer.Typer(
    cls=lazy_group("index"), help="Build and search BM25 / FAISS indexes.", no_args_is_help=True
)


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
    opq: Annotated[
        bool,
        typer.Option("--opq", help="ivf-pq: learn an OPQ rotation, fitted to --pq-bits codebooks"),
    ] = False,
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
    from pydantic import ValidationError

    from ...index_build.ann import BudgetError
    from ...index_build.build import BuildError, IndexSpec, build_index
    from ...index_build.corpus import CorpusError
    from ..datasets.catalog import is_name
    from ..datasets.names import dataset_file
    from ..runtime.contract.readers import describe_validation

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
    from ...retrieval.index import IndexError_
    from ...retrieval.tune import TuneError, read_queries, tune

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
    from ...retrieval.index import CrossEncoderReranker, IndexError_, SearchIndex

    if mode not in ("bm25", "dense", "hybrid"):
        raise UserError(f"--mode {mode!r}: use bm25, dense or hybrid")
    try:
        searcher = SearchIndex.load(index)
        reranker = CrossEncoderReranker(rerank_model) if rerank_model else None
        results = searcher.search(query, k=k, mode=mode, mmr=mmr, reranker=reranker)  # type: ignore[arg-type]
    except IndexError_ as exc:
        raise UserError(str(exc)) from exc
    out = terminal()  # a corpus's ids and text are data: escapes shown, never acted on
    for q, hits in zip(query, results, strict=True):
        for rank, hit in enumerate(hits, 1):
            if as_json:
                typer.echo(json.dumps({"query": q, "rank": rank, **hit.__dict__}))
            else:
                line = f"{rank:3d} {hit.score:9.4f} {hit.chunk_id}  {hit.text[:100]!r}"
                out.print(line, highlight=False, soft_wrap=True)
