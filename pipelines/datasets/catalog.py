"""The datasets groundcover knows by name: one declarative entry each (home, revision, files,
license, size, what converts the published files to the shape our readers take).

A home is ``hf:OWNER/REPO`` (a Hugging Face dataset repository), ``package:NAME`` (files an
installed package ships), ``irds:PREFIX`` (datasets ``PREFIX/FILE`` of the ``ir_datasets``
library, which fetches and checks their files) or ``licensed`` (not downloadable: obtained by the
user, then registered with ``groundcover data add``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime.contract.errors import UserError
from . import convert

# sources in (published files; for an ir_datasets home, its dataset objects), directory out
Converter = Callable[[list[Any], Path], None]
CARD = "per the dataset card"  # read from the Hub and printed before a download
CRUX_SUBSETS = ("duc04", "multi_news")  # the paper's CRUX-MDS subsets
LISTED = "listed at download"  # the Hub lists each file's size; the total is printed


@dataclass(frozen=True)
class Dataset:
    name: str
    summary: str
    home: str
    license: str
    size: str  # as published, for the notice printed before a download
    files: tuple[str, ...] = ()  # file names or glob patterns in the home
    revision: str = "main"  # a branch, tag or commit (hub); a label for other homes
    main: str = ""  # the file a --data NAME means, in the converted directory
    convert: Converter | None = None  # None: the published files are used as they are
    used_by: str = ""  # the command that reads it
    obtain: str = ""  # licensed: how to get a copy
    check: Callable[[Path], None] | None = None  # licensed: shape check for `data add`
    # published fingerprints: file -> (bytes, sha256), as the authors state them or as verified
    # here; a download that differs is refused before anything is cached
    fingerprints: dict[str, tuple[int, str]] = field(default_factory=dict)
    notice: str = ""  # printed before a download (terms the authors point to)
    counts: str = ""  # what a reader of the main file should see, for the README and `data list`

    @property
    def kind(self) -> str:
        return self.home.split(":", 1)[0]

    @property
    def repo(self) -> str:
        return self.home.split(":", 1)[1]


CATALOG: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            name="wikicontradict-humaneval",
            summary="WikiContradict human evaluation: 48 questions x 5 LLMs, responses with "
            "human labels (the comprehensiveness paper's meta-evaluation set)",
            home="hf:ibm-research/Wikipedia_contradict_benchmark",
            files=("HumanEval/WikiContradict_HumanEval_adjudication.json",),
            license="MIT (text from Wikipedia, CC BY-SA)",
            size="about 1.3 MB",
            main="humaneval.jsonl",
            convert=convert.wikicontradict_humaneval,
            used_by="groundcover meta-eval wikicontradict",
        ),
        Dataset(
            name="conflictbank",
            summary="ConflictBank QA pairs (CB_qa_v2, train split), sampled with seed 42 at "
            "read time as the comprehensiveness authors did",
            home="hf:Warrieryes/CB_qa_v2",
            files=("*.parquet", "*.jsonl", "*.json"),
            license="CC BY-SA 4.0",
            size="about 1.3 GB (QA_dataset.json: JSON Lines despite the extension)",
            main="train.jsonl",
            convert=convert.conflictbank_train,
            used_by="groundcover meta-eval conflictbank",
        ),
        Dataset(
            name="fanoutqa-dev",
            summary="FanOutQA dev questions with decompositions and answers",
            home="package:fanoutqa",
            files=("data/fanout-final-dev.json",),
            license="CC BY-SA 4.0",
            size="1.2 MB (shipped with the fanoutqa package)",
            main="fanout-final-dev.json",
            used_by="groundcover eval fanoutqa",
        ),
        Dataset(
            name="fanoutqa-test",
            summary="FanOutQA test questions (answers withheld by the authors)",
            home="package:fanoutqa",
            files=("data/fanout-final-test.json",),
            license="CC BY-SA 4.0",
            size="1.1 MB (shipped with the fanoutqa package)",
            main="fanout-final-test.json",
            used_by="groundcover eval fanoutqa --answers FILE",
        ),
        Dataset(
            name="fanoutqa-wiki",
            summary="the English Wikipedia pages of every FanOutQA dev and test question at the "
            "dataset's epoch (Nov 2023), as articles JSONL {pageid, title, text}",
            home="package:fanoutqa",
            files=("data/fanout-final-dev.json", "data/fanout-final-test.json"),
            license="CC BY-SA 4.0 (Wikipedia text)",
            size="about 4,000 pages; from the fanoutqa package's page cache, else fetched once",
            main="articles.jsonl",
            convert=convert.fanoutqa_wiki,
            used_by="groundcover eval fanoutqa --setting evidence --articles fanoutqa-wiki",
        ),
        Dataset(
            name="garage",
            summary="GaRAGe benchmark: questions, grounding passages with relevance and "
            "citation annotations, human answers",
            home="hf:AmazonScience/GaRAGe",
            files=("data/GaRAGe_benchmark.jsonl",),
            license="CC BY-NC 4.0 (NON-COMMERCIAL use only)",
            size="28,426,483 bytes",
            main="GaRAGe_benchmark.jsonl",
            used_by="groundcover eval garage",
            fingerprints={
                "data/GaRAGe_benchmark.jsonl": (
                    28_426_483,
                    "419e3941f6e8eb4082a74ca2140c1f9337f8b467ff76656a6b8b0290ca3f3a72",
                )
            },
            counts="2,366 questions, 35,351 passages, 427 expect a deflection; time-sensitivity "
            "Fast-Changing 17.5%, Slow-Changing 49.6%, Static 33.0%; source Web 86.6%",
        ),
        Dataset(
            name="trec-icat",
            summary="ICAT's TREC data in the authors' formats: queries with subtopics, "
            "subtopic qrels, corpus",
            home="hf:algoprog/TREC-ICAT",
            files=("*.jsonl",),
            license=CARD,
            size="corpus.jsonl 324 MB, qrels.jsonl 9.9 MB, queries.jsonl 350 kB",
            main="queries.jsonl",
            used_by="groundcover eval icat --queries trec-icat; index build trec-icat/corpus.jsonl",
        ),
        Dataset(
            name="trec-web-topics",
            summary="TREC Web Track 2009-2012: 200 topics with subtopics and the diversity "
            "(subtopic) qrels, in ICAT's query and qrels formats, read through ir_datasets",
            # ir_datasets' clueweb09/en/trec-web-20XX/diversity: NIST's files, fetched by it
            # and checked against its published md5 and size
            home="irds:clueweb09/en",
            files=tuple(f"trec-web-{year}/diversity" for year in (2009, 2010, 2011, 2012)),
            revision="ir_datasets",  # locked as the ir_datasets version that read the files
            license="NIST TREC data (research use)",
            size="about 5 MB (topics XML and diversity qrels; ir_datasets caches them in "
            "$IR_DATASETS_HOME, default ~/.ir_datasets)",
            main="topics.jsonl",
            convert=convert.trec_web_diversity,
            used_by="groundcover eval icat --queries trec-web-topics --qrels "
            "trec-web-topics/qrels.jsonl",
        ),
        Dataset(
            name="crux-mds",
            summary="CRUX-MDS (Multi-News, DUC 2004): topics with sub-questions as our topics "
            "exchange files, the published passage ratings as our ratings exchange files; "
            "qrels and judgements kept as published",
            home="hf:DylanJHJ/crux",
            # the paper's two subsets only (the repository also holds crux-neuclir, ranking_*,
            # shard_data/, sources/), at a commit that holds both
            files=tuple(
                f"crux-mds-{subset}/{folder}/*"
                for subset in CRUX_SUBSETS
                for folder in ("topic", "subtopics", "qrels", "judge")
            ),
            revision="7581b8a657c88557b7ed2ce046bb7e6f4529d6c8",
            license=CARD,
            size=LISTED,
            main="topics-multi_news.jsonl",
            convert=convert.crux_mds,
            notice="CRUX-MDS is generated from Multi-News and DUC 2004; see the original datasets' "
            "terms of use (Multi-News: its authors' licence; DUC 2004: the NIST agreement)",
            used_by="groundcover crux build / eval crux --topics crux-mds/topics-SUBSET.jsonl "
            "--ratings crux-mds/ratings-SUBSET.jsonl",
        ),
        Dataset(
            name="crux-sources",
            summary="the DUC 2004 and Multi-News source documents the CRUX authors publish "
            "(saved with datasets.save_to_disk), as they are",
            home="hf:DylanJHJ/crux",
            files=("sources/duc04/*", "sources/multi_news/*"),
            revision="7581b8a657c88557b7ed2ce046bb7e6f4529d6c8",
            license="the source datasets' terms (Multi-News; DUC 2004: NIST agreement)",
            size=LISTED,
            notice="DUC 2004 documents are distributed by NIST under its data agreement; "
            "Multi-News under its authors' licence: accept those terms before use",
            used_by="crux build (after export to a JSONL corpus)",
        ),
        Dataset(
            name="clueweb09-b",
            summary="ClueWeb09 Category B (ICAT's knowledge source): the WARC files of "
            "ClueWeb09_English_1 as CMU ships them, streamed; or a JSONL export {id, contents}",
            home="licensed",
            license="ClueWeb09 licence (Carnegie Mellon University)",
            size="50,220,423 pages (ClueWeb09_English_1: en0000-en0011, enwp00-enwp03)",
            obtain="ClueWeb09 is licensed: apply at https://lemurproject.org/clueweb09/, then run "
            "`groundcover data add clueweb09-b DIR` with the directory that holds "
            "ClueWeb09_English_1/ (the one ir_datasets links as ~/.ir_datasets/clueweb09/corpus), "
            'or with a JSONL export of lines {"id", "contents"}',
            check=convert.check_clueweb09,
            used_by="groundcover index build / eval icat --index",
        ),
        Dataset(
            name="duc2004",
            summary="DUC 2004 multi-document summarisation topics and documents (CRUX's DUC split)",
            home="licensed",
            license="NIST DUC data agreement",
            size="50 clusters of 10 news documents",
            obtain="DUC 2004 data are distributed by NIST on request "
            "(https://duc.nist.gov/data.html); convert the documents to JSONL lines "
            '{"id", "contents"}, then run `groundcover data add duc2004 FILE`',
            check=convert.check_corpus,
            used_by="groundcover crux build",
        ),
    )
}


def split_spec(spec: str) -> tuple[str, str | None]:
    """NAME[@REVISION][/FILE] -> (NAME[@REVISION], FILE). A Hub ref revision keeps its slashes
    (``conflictbank@refs/convert/parquet``, ``NAME@refs/pr/3``)."""
    name, sep, rest = spec.partition("@")
    if sep and rest.startswith("refs/"):
        parts = rest.split("/")
        return f"{name}@{'/'.join(parts[:3])}", "/".join(parts[3:]) or None
    head, _, file = spec.partition("/")
    return head, file or None


def parse_spec(spec: str) -> tuple[str, str | None]:
    """NAME or NAME@REVISION (a trailing /FILE, which picks a file, is not part of it)."""
    name, sep, revision = split_spec(spec)[0].partition("@")
    if sep and not revision:
        raise UserError(f"dataset {spec!r}: empty revision after '@'")
    return name, revision or None


def lookup(name: str) -> Dataset:
    found = CATALOG.get(name)
    if found is None:
        raise UserError(f"unknown dataset {name!r}; known: {', '.join(CATALOG)}")
    return found


def is_name(value: str) -> bool:
    """Whether ``value`` names a catalogued dataset: NAME[@REVISION][/FILE]."""
    return split_spec(value)[0].partition("@")[0] in CATALOG
