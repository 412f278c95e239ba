"""The error every layer raises for bad input or configuration (imported by the CLI at start,
so it depends on nothing)."""


class UserError(ValueError):
    """Bad configuration or input: printed as one line, exit code 2, nothing written."""


class ItemsFailed(Exception):
    """A run ended with failed items (``error``, ``cut_in_reasoning``) past what
    ``--allow-failures`` accepts: exit code 4; the same command retries just those."""
