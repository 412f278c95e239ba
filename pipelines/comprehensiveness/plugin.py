"""What comprehensiveness plugs into the runtime: its studies and commands."""

from groundcover import Command, Flag, flags
from groundcover.nli import NLI_PLACEMENT

FRAMEWORK = "groundcover.pipelines.comprehensiveness.framework:COMPREHENSIVENESS"
STUDIES = (
    FRAMEWORK,
    "groundcover.pipelines.comprehensiveness.framework:ELI5",
    "groundcover.pipelines.comprehensiveness.reproduce:REPRODUCE",
)
META_EVAL = flags("method", "limit", "resamples", "protocol")
COMMANDS = (
    Command(
        "eval comprehensiveness",
        FRAMEWORK,
        "Comprehensiveness of each response against its contexts (NLI, Q&A or end-to-end).",
        flags=(
            Flag(
                "input", argument=True, required=True, help="JSONL: id, query, response, contexts"
            ),
            *flags(
                "method", "t_rel", "t_conf", "protocol", "summarise", "nli_backend", "nli_model"
            ),
            *NLI_PLACEMENT,
            *flags("prune_below", "prune_model", "tools", "limit", "answers"),
        ),
    ),
    Command(
        "meta-eval wikicontradict",
        FRAMEWORK,
        "LMR_WC of comprehensiveness on WikiContradict, per label, with a 95% BCa interval.",
        "Writes lmr.json (paper Figure 3).",
        flags=(
            Flag(
                "input",
                name="data",
                help="human-evaluation JSONL or dataset name (default: wikicontradict-humaneval)",
            ),
            *META_EVAL,
        ),
        fixed={"dataset": "wikicontradict"},
    ),
    Command(
        "meta-eval conflictbank",
        FRAMEWORK,
        "Strict / lax / mean LMR of comprehensiveness on ConflictBank, each with a 95% BCa "
        "interval.",
        "Writes lmr.json (paper Figures 4 and 7). --limit is the sample size (500).",
        flags=(
            Flag(
                "input",
                name="data",
                help="CB_qa_v2 train split (JSONL, Parquet) or dataset "
                "name (default: conflictbank)",
            ),
            *META_EVAL,
        ),
        fixed={"dataset": "conflictbank"},
    ),
    Command(
        "eli5",
        "groundcover.pipelines.comprehensiveness.framework:ELI5",
        "ELI5-style study: each responder answers from the background texts only, then the "
        "evaluator scores every answer's comprehensiveness (paper Figure 6 table).",
        flags=(
            Flag("input", argument=True, required=True),
            Flag("responders", name="responder"),
            Flag("methods", name="method"),
        ),
    ),
    Command(
        "reproduce comprehensiveness",
        "groundcover.pipelines.comprehensiveness.reproduce:REPRODUCE",
        "Figures 3-5 of the comprehensiveness paper: LMR on WikiContradict and ConflictBank for "
        "every evaluator model x method.",
        "The average with an unpaired BCa interval, and the published values beside ours. "
        "Resumes cell by cell.",
        flags=(
            Flag(
                "models",
                name="evaluators",
                required=True,
                help="evaluator MODEL or MODEL@URL (repeat: a grid row each)",
            ),
            Flag("methods", name="method"),
            *flags("wikicontradict", "conflictbank", "metric.protocol"),
            Flag("metric.limit", help="rows per dataset (ConflictBank: the sample size)"),
        ),
    ),
)
