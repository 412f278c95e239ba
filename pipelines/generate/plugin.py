"""What generation plugs into the runtime: its study and its command."""

from pipelines.runtime.commands import Command, Flag

STUDIES = ("pipelines.generate.framework:GENERATE",)
COMMANDS = (
    Command(
        "generate",
        "pipelines.generate.framework:GENERATE",
        "Generate an answer per question (from its background texts only, when given).",
        flags=(Flag("input", argument=True),),
    ),
)
