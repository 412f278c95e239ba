"""The error every layer raises for bad input or configuration (imported by the CLI at start,
so it depends on nothing)."""


class UserError(ValueError):
    """Bad configuration or input: printed as one line, exit code 2, nothing written."""
