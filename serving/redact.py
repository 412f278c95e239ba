"""Secrets never stored or printed: every key value the process was configured with
(``remember``, called where a key enters: the transports and servers), every bearer or basic
credential and every password in a URL are replaced by ``[redacted]`` (``redact``) in what
is kept or shown: request failures (a server's error body may echo the key it was sent),
failures in records, the one-line errors, the command a manifest records. Text that is cut
short is redacted first (``clipped``): a key across the cut would leave its head behind."""

from __future__ import annotations

import re
import threading

REDACTED = "[redacted]"
NOT_A_SECRET = {"", "EMPTY", "none", "None"}  # vLLM's and OpenAI clients' placeholder keys
SHORTEST = 6  # a shorter "key" would redact ordinary words

_lock = threading.Lock()
_known: set[str] = set()
_pattern: re.Pattern[str] | None = None

# an Authorization header's credential however it is written
CREDENTIAL = re.compile(r"(?i)\b(bearer|basic|token)(\s+|=|:\s*)[A-Za-z0-9._~+/=-]{8,}")
# a URL's user-info: user:password@ (a password may hold '@': up to the authority's last one)
# or TOKEN@ alone; the authority ends at '/', '?', '#', white space or a quote
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s\"'<>\\]*)@")
# a key or token named in a query string or a JSON / YAML pair: api_key=..., "api-key": "..."
NAMED = re.compile(
    r"(?i)(\b(?:api[_-]?key|access[_-]?token|secret|password|auth[_-]?token)[\"']?\s*[=:]\s*"
    r"[\"']?)[^\s\"'&,;}]{6,}"
)


def remember(value: str | None) -> None:
    """``value`` is a key: from now on it is redacted wherever ``redact`` runs."""
    global _pattern
    if value is None or value.strip() in NOT_A_SECRET or len(value) < SHORTEST:
        return
    with _lock:
        if value not in _known:
            _known.add(value)
            ordered = sorted(_known, key=len, reverse=True)  # a key inside a longer one
            _pattern = re.compile("|".join(re.escape(k) for k in ordered))


def redact(text: str) -> str:
    """``text`` without any key value, credential or URL password in it."""
    if not text:
        return text
    found = _pattern
    if found is not None:
        text = found.sub(REDACTED, text)
    text = CREDENTIAL.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", text)
    text = URL_USERINFO.sub(_without_userinfo, text)
    return NAMED.sub(lambda m: f"{m[1]}{REDACTED}", text)


def _without_userinfo(found: re.Match[str]) -> str:
    """``user:[redacted]@`` (the user name kept: it says whose), ``[redacted]@`` for a token."""
    user, colon, _ = found[2].partition(":")
    return f"{found[1]}{user}:{REDACTED}@" if colon else f"{found[1]}{REDACTED}@"


def clipped(text: str, limit: int) -> str:
    """``text`` on one line, redacted, then cut to ``limit`` characters: redaction first, so no
    head of a key across the cut is left unrecognised."""
    return redact(" ".join(str(text).split()))[:limit]
