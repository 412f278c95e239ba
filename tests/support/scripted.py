"""The scripted judge the tests use: ``groundcover.testing``'s, the one framework authors get
(``ScriptedClient``, its replies and prompt helpers), named here for the tests' imports."""

from groundcover.serving.scripted import (
    Call,
    Reply,
    Sampled,
    Script,
    ScriptedClient,
    by_text,
    field_of,
    label,
    marked,
    rated,
    tool_call,
)

__all__ = [
    "Call",
    "Reply",
    "Sampled",
    "Script",
    "ScriptedClient",
    "by_text",
    "field_of",
    "label",
    "marked",
    "rated",
    "tool_call",
]
