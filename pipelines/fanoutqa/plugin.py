"""What FanOutQA plugs into the runtime: its studies and commands."""

from groundcover import Command, Flag, flags

FRAMEWORK = "groundcover.pipelines.fanoutqa.framework:FANOUTQA"
REPRODUCE = "groundcover.pipelines.fanoutqa.reproduce:REPRODUCE_FANOUTQA"
STUDIES = (FRAMEWORK, REPRODUCE)
COMMANDS = (
    Command(
        "eval fanoutqa",
        FRAMEWORK,
        "FanOutQA closed-book / evidence-provided / open-book answers scored with loose, strict, "
        "ROUGE, BLEURT and the optional A-F model judge.",
        "Open-book answers use search and read tools (a server with tool calling). The string "
        "metrics equal the original scorer; prints the paper's Table 1 columns. With --answers "
        "(the official submission format) no model answers: the given answers are scored.",
        flags=(
            Flag("input", name="data"),
            Flag("settings", name="setting"),
            *flags("articles", "index", "context_tokens", "judge", "bleurt", "limit", "answers"),
        ),
    ),
    Command(
        "reproduce fanoutqa",
        REPRODUCE,
        "FanOutQA Table 1: loose, strict, ROUGE, BLEURT and the model judge for every answering "
        "model x setting, the paper's values beside ours.",
        "Resumes cell by cell.",
        flags=(
            Flag(
                "models",
                required=True,
                help="answering MODEL or MODEL@URL (repeat: a table row each)",
            ),
            Flag("fanoutqa.settings", name="setting"),
            Flag("fanoutqa.input", name="data"),
            *flags(*(f"fanoutqa.{f}" for f in ("articles", "index", "judge", "bleurt", "limit"))),
        ),
    ),
)
