"""What ICAT plugs into the runtime: its studies and commands."""

from groundcover import Command, Flag, flags
from groundcover.nli import NLI_PLACEMENT

FRAMEWORK = "groundcover.pipelines.icat.framework:ICAT"
REPRODUCE = "groundcover.pipelines.icat.reproduce:REPRODUCE_ICAT"
STUDIES = (FRAMEWORK, REPRODUCE)
COMMANDS = (
    Command(
        "eval icat",
        FRAMEWORK,
        "ICAT: factuality (claims grounded by retrieval + NLI) and aspect coverage of each "
        "response, ICAT-M / ICAT-S / ICAT-A and ICAT_beta.",
        "Writes icat.json (paper Table 3 layout).",
        flags=(
            Flag("input", argument=True, required=True),
            Flag("queries", required=True),
            Flag("nli_model", required=True),
            *flags("index", "snippets", "qrels"),
            Flag("variants", name="variant", comma=True),
            Flag("betas", name="beta", comma=True),
            *flags("k", "retrieval"),
            Flag(
                "roles.extract",
                name="extractor",
                help="claim-extractor adapter on --model (= --role extract=:NAME)",
            ),
            Flag("limit"),
            *NLI_PLACEMENT,
        ),
    ),
    Command(
        "reproduce icat",
        REPRODUCE,
        "ICAT Table 3: S_fact, and S_cov and ICAT_1 of ICAT-M / -S / -A, per system and "
        "knowledge source, the paper's values beside ours.",
        "Resumes source by source.",
        flags=(
            Flag("input", argument=True, required=True),
            Flag("nli_model", required=True),
            *flags("index", "snippets", "queries", "qrels", "retrieval", "limit"),
        ),
    ),
)
