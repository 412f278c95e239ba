"""What GaRAGe plugs into the runtime: its studies and commands."""

from groundcover import Command, Flag

FRAMEWORK = "groundcover.pipelines.garage.framework:GARAGE"
REPRODUCE = "groundcover.pipelines.garage.reproduce:REPRODUCE_GARAGE"
STUDIES = (FRAMEWORK, REPRODUCE)
COMMANDS = (
    Command(
        "eval garage",
        FRAMEWORK,
        "GaRAGe: cited answers judged for eligibility, (relevance-aware) factuality, deflection "
        "and attribution.",
        "Writes tables.json with Tables 2-4 and their breakdowns. With --answers no model "
        "answers: the given answers (with the benchmark's numbered citation markers) are judged.",
        flags=(Flag("input", argument=True), Flag("limit"), Flag("answers")),
    ),
    Command(
        "reproduce garage",
        REPRODUCE,
        "GaRAGe Tables 2-4: every answering model's answers judged, the paper's values beside "
        "ours.",
        "Eligibility, factuality, relevance-aware factuality, deflection and attribution (the "
        "judge: --role judge=MODEL@URL). Resumes model by model.",
        flags=(
            Flag(
                "models",
                required=True,
                help="answering MODEL or MODEL@URL (repeat: a table row each)",
            ),
            Flag("garage.input", name="data"),
            Flag("garage.limit"),
        ),
    ),
)
