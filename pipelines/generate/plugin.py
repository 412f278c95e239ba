"""What generation plugs into the runtime: its study and its command."""

from groundcover import Command, Flag

STUDIES = ("groundcover.pipelines.generate.framework:GENERATE",)
COMMANDS = (
    Command(
        "generate",
        "groundcover.pipelines.generate.framework:GENERATE",
        "Generate an answer per question (from its background texts only, when given).",
        flags=(Flag("input", argument=True),),
    ),
)
