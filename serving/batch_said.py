"""What a batch provider says, and what it means: its words on one line (redacted before they
are cut), the table of documented provider messages by meaning (``PROVIDER_MESSAGES``: wait,
split, reject, stop; each with where it is documented, each tested), a batch's ``errors`` in any
shape, and ``BatchState``, where a batch stands as the provider says."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .redact import redact

WORDS_KEPT = 300  # characters of a provider's words kept per failure


def words(text: Any, limit: int = WORDS_KEPT) -> str:
    """A provider's words on one line, secrets redacted *before* anything is cut (a key cut in
    half would no longer be recognised)."""
    return " ".join(redact(str(text)).split())[:limit]


# ---- what a provider's words mean -------------------------------------------------------------

WAIT = "wait"  # a queue, rate or capacity limit of the account: the same batch, later
SPLIT = "split"  # this batch is too big for the provider: two halves
REJECT = "reject"  # this line is wrong: its item fails
STOP = "stop"  # the account or the key cannot buy: the run stops


@dataclass(frozen=True)
class Said:
    """One documented provider message: what it means, the words that identify it, the text
    as documented (tested: each example is read as its meaning) and where it is documented."""

    meaning: str
    words: str  # a regular expression, searched case-insensitively
    example: str
    source: str
    code: str = ""  # the error code the provider sends with it, where it sends one


# Ordered: the first entry whose words match decides. The limits of the account come first, so
# "Enqueued token limit reached" is never read as a batch too big for its tokens.
PROVIDER_MESSAGES: tuple[Said, ...] = (
    Said(
        WAIT,
        r"enqueued token limit reached",
        "Enqueued token limit reached for gpt-4o-mini in organization org-abc. Limit: "
        "2,000,000 enqueued tokens. Please try again once some in_progress batches have been "
        "completed.",
        "OpenAI, a failed batch's errors.data (quoted in github.com/openai/openai-python "
        "issue 2084)",
        "token_limit_exceeded",
    ),
    Said(
        WAIT,
        r"number of enqueued tokens has surpassed",
        "The number of enqueued tokens has surpassed the configured limit of 30K for the "
        "deployment 'gpt-4.1-batch'. Please either increase the limit or try again once the "
        "current jobs have finished.",
        "Azure OpenAI global batch, a failed batch's errors.data (learn.microsoft.com/en-us/"
        "answers/questions/2285577)",
        "token_limit_exceeded",
    ),
    Said(
        WAIT,
        r"batch rate limit exceeded",
        "Batch rate limit exceeded",
        "LiteLLM proxy, a 429 to POST /batches under batch_enqueued_token_limit, quoted as far "
        "as its pull request gives it (github.com/BerriAI/litellm pull 37539)",
    ),
    Said(
        WAIT,
        r"batches in a non-terminal state",
        "Returns 429 (batch_limit_exceeded) if the owner already has 10 or more batches in a "
        "non-terminal state.",
        "Mesh API, the documented 429 of POST /v1/batches (developers.meshapi.ai, Create Batch)",
        "batch_limit_exceeded",
    ),
    Said(
        WAIT,
        r"exceeded token rate limit|rate limit (reached|exceeded)",
        "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
        "2024-10-01-preview have exceeded token rate limit of your current AIServices S0 "
        "pricing tier. Please retry after 37 seconds.",
        "Azure OpenAI, a 429 (learn.microsoft.com/en-us/answers/questions/2140040)",
        "rate_limit_exceeded",
    ),
    Said(
        WAIT,
        r"resource_exhausted|gemini-api/docs/rate-limits",
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits",
        "Gemini Batch API, a 429 RESOURCE_EXHAUSTED that passes (quoted in "
        "github.com/googleapis/js-genai issue 1264): the same first words as OpenAI's below",
        "RESOURCE_EXHAUSTED",
    ),
    Said(
        WAIT,
        r"in '(pending|uploaded|running)' state\. only files with status 'processed'",
        "The input file 'file-0a27a5cd4d94440789971497e6d80391' is in 'pending' state. Only "
        "files with status 'Processed' are accepted for batch inferencing. Please check the "
        "file status and try again",
        "Azure OpenAI, a 400 to POST /batches made just after the file's upload, before Azure "
        "has processed it (Microsoft Q&A, learn.microsoft.com/en-us/answers/questions/2203029)",
    ),
    Said(
        STOP,
        r"exceeded your current quota|insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        "OpenAI's insufficient_quota, a 429 that waiting does not end (the code as listed in "
        "docs.zerogpu.ai/api-reference/batch/errors, which mirrors OpenAI's)",
        "insufficient_quota",
    ),
    Said(
        SPLIT,
        r"max allowed tokens per submitted batch",
        "The max allowed tokens per submitted batch is 120000. Your batch has 147910 tokens "
        "after truncation. TOO_MANY_TOKENS_IN_BATCH",
        "Voyage AI, a 400 for a batch's tokens (quoted in github.com/kenn-io/agentsview "
        "issue 1356)",
    ),
    Said(
        SPLIT,
        r"^file is too large",
        "File is too large.",
        "OpenAI, a 400 to POST /files past 200 MB (quoted in github.com/bespokelabsai/curator "
        "issue 111)",
    ),
    Said(
        SPLIT,
        r"exceeds the configured max_batch_file_size_mb",
        "Batch input file is 12.0 MB, which exceeds the configured max_batch_file_size_mb of "
        "10 MB. The file was not forwarded to the provider.",
        "LiteLLM proxy, a 413 to POST /files (github.com/BerriAI/litellm pull 37527)",
    ),
    Said(
        REJECT,
        r"maximum context length is",
        "This model's maximum context length is 128000 tokens. However, you requested 1000024 "
        "tokens (24 in the messages, 1000000 in the completion). Please reduce the length of "
        "the messages or completion.",
        "OpenAI, a line's 400 in the error file (quoted in github.com/openai/openai-openapi "
        "issue 302); vLLM words it the same (vllm/renderers/params.py)",
        "context_length_exceeded",
    ),
    Said(
        REJECT,
        r"must not be sent in stream mode",
        "Request must not be sent in stream mode",
        "vLLM run-batch, a line's 400 (vllm/entrypoints/launchers/run_batch.py, 0.32)",
    ),
    Said(
        REJECT,
        r"model does not support endpoint",
        "Model does not support endpoint: /v1/chat/completions",
        "vLLM run-batch, a line's 400 (vllm/entrypoints/launchers/run_batch.py, 0.32)",
    ),
    Said(
        REJECT,
        r"url \S+ was used\. supported endpoints",
        "URL /v1/completion was used. Supported endpoints: /v1/chat/completions, "
        "/v1/embeddings, /v1/audio/transcriptions, /v1/audio/translations, /score,  /rerank.",
        "vLLM run-batch, a line's 400 (vllm/entrypoints/launchers/run_batch.py, 0.32)",
    ),
)
_PATTERNS = [(said, re.compile(said.words, re.IGNORECASE)) for said in PROVIDER_MESSAGES]
# undocumented wordings of a batch too big for the provider: a batch or file named, a size
# exceeded, and nothing said about a queue (an account's limit waits; see WAIT above)
_SIZE_WORDS = re.compile(
    r"(?i)\b(batch|file)\b.*\b(too (large|big|many)|exceed(s|ed)? (the )?(max|limit|size))"
)
_QUEUE_WORDS = re.compile(r"(?i)enqueued|in.progress|try again|retry after|rate.limit")


def meaning_of(message: str, code: str = "") -> str | None:
    """What a provider's words mean (``WAIT``, ``SPLIT``, ``REJECT``, ``STOP``; None: not known):
    the table first, by words, then by code; then an undocumented size wording."""
    for said, pattern in _PATTERNS:
        if pattern.search(message):
            return said.meaning
    for said, _ in _PATTERNS:
        if said.code and code == said.code:
            return said.meaning
    if _SIZE_WORDS.search(message) and not _QUEUE_WORDS.search(message):
        return SPLIT
    return None


def batch_errors(value: Any) -> list[dict[str, Any]]:
    """A batch's ``errors`` in any shape (OpenAI's ``{"data": [...]}``, a bare list, one object,
    a string) as entries of ``code``, ``message`` and ``line`` (None: the whole batch)."""
    if isinstance(value, dict) and "data" in value:
        value = value["data"]
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    found = []
    for entry in entries:
        if entry is None:
            continue
        line = entry.get("line") if isinstance(entry, dict) else None
        code = entry.get("code") if isinstance(entry, dict) else None
        found.append(
            {
                "code": str(code) if isinstance(code, str | int) else "",
                "message": words(error_text(entry)) or "no message",
                "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
            }
        )
    return found


def error_text(error: Any) -> str:
    """A line's or a batch's error as words: OpenAI's ``{"message"}``, vLLM's ``{"error":
    {"message"}}``, a list of them, or a string (never a dict's repr)."""
    if isinstance(error, dict):
        inner = error.get("error")
        if isinstance(inner, dict | str | list):
            return error_text(inner)
        if error.get("message"):
            return str(error["message"])
        return json.dumps(error, ensure_ascii=False, default=str)
    if isinstance(error, list):
        return "; ".join(filter(None, (error_text(e) for e in error)))
    return "" if error is None else str(error)


@dataclass
class BatchState:
    """Where a submitted batch stands; at a terminal status, its output and error files (bytes:
    read line by line, a line that is not UTF-8 fails alone) and what the provider said."""

    status: str
    output: bytes = b""  # JSONL: {"custom_id", "response": {"status_code", "body"}, "error"}
    errors: bytes = b""  # JSONL of the lines the provider failed
    message: str = ""  # why a batch failed as a whole
    said: list[dict[str, Any]] = field(default_factory=list)  # ``batch_errors``
    counts: dict[str, int] = field(default_factory=dict)  # the batch's request_counts
    expires_at: float | None = None  # unix seconds, as the provider says
    note: str = ""  # why the output is incomplete after its downloads ("" whole, or none)
    lost: str = ""  # the cause of the lines an incomplete output lacks (``ONCE``, unreadable)
