"""What CRUX plugs into the runtime: its studies and commands."""

from groundcover import Command, Flag, flags

FRAMEWORK = "groundcover.pipelines.crux.framework:CRUX"
STUDIES = (
    FRAMEWORK,
    "groundcover.pipelines.crux.build:BUILD",
    "groundcover.pipelines.crux.build:BUILD_STUDY",
    "groundcover.pipelines.crux.reproduce:REPRODUCE_CRUX",
)
COMMANDS = (
    Command(
        "eval crux",
        FRAMEWORK,
        "CRUX: Cov, alpha-nDCG and Den of a run's top-k contexts per topic against the oracle "
        "P** of the ratings.",
        "Unrated pairs are rated on the fly (cached), or counted 0 with --no-rate.",
        flags=(
            Flag("topics", required=True),
            Flag("passages", required=True),
            Flag("input", argument=True, help="TREC run: qid Q0 docid rank score tag"),
            *flags("ratings", "k", "eta", "rate", "tokenizer", "answers", "generate"),
            *flags("answer_tokens", "index", "mode", "depth", "mmr", "reranker"),
        ),
    ),
    Command(
        "crux build",
        "groundcover.pipelines.crux.build:BUILD_STUDY",
        "Build CRUX evaluation data from summarisation records: query, sub-questions, passages, "
        "the full rating matrix, answerable filter, P** and graded qrels for eta 1..5.",
        "Resumable.",
        flags=(Flag("input", argument=True, required=True), *flags("questions", "limit")),
    ),
    Command(
        "reproduce crux",
        "groundcover.pipelines.crux.reproduce:REPRODUCE_CRUX",
        "CRUX Table 1: BM25, dense and hybrid retrieval (each also with MMR and, with --reranker, "
        "a cross-encoder) at every k.",
        "Cov(Z), alpha-nDCG and Den(Z) (with --generate also Cov(y), Den(y) and Kendall's tau), "
        "Cov(Z) by threshold; unrated passages count 0, as in the paper.",
        flags=(
            *flags("data", "topics", "passages", "ratings", "index", "reranker"),
            Flag("ks", comma=True, help="top-k values, e.g. pstar,10,20 (pstar: |P**|)"),
            *flags("generate", "paper"),
        ),
    ),
)
