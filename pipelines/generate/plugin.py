"""What generation plugs into the runtime: its study and its command."""

from groundcover import Command, Flag

STUDIES = ("groundcover.pipelines.shared.answering:GENERATE",)
COMMANDS = (
    Command(
        "generate",
        "groundcover.pipelines.shared.answering:GENERATE",
        "Generate an answer per question (from its background texts only, when given).",
        flags=(Flag("input", argument=True),),
    ),
)
