"""An endpoint's credentials, held in memory for its requests and never in what is kept or shown.

``http://user:password@host/v1`` and ``http://TOKEN@host/v1`` carry a secret in the URL. Where an
endpoint is read (``--endpoint``, ``--role X=MODEL@URL``, the YAML, the Python API: the
configuration's validators; a client built by hand) ``take_credentials`` takes the user-info off:
what the run records, shows, exports and keys its cache by is the URL without it. The credential
stays in this process's memory, keyed by that URL, and every request to it carries it as HTTP
Basic (what curl and browsers send for such a URL: ``TOKEN`` alone is the user with an empty
password); without one, the API key of ``--api-key-env`` is sent as Bearer. Driver processes get
the held credentials in their environment (``held_environment``), as they get API keys. Every
form of the secret (as typed, percent-decoded, the Basic header's) is given to ``redact`` first.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from urllib.parse import unquote

from .redact import remember

ENV = "GROUNDCOVER_ENDPOINT_AUTH"  # driver processes: {URL without user-info: Authorization}

_lock = threading.Lock()
_held: dict[str, str] = {}
_from_env_read = False


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its user-info, and the user-info (None: it has none). The user-info ends
    at the authority's last ``@`` (a password may hold an ``@``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return url, None
    return f"{scheme}://{host}{rest[end:]}", userinfo


def _key(url: str) -> str:
    return url.rstrip("/")


def take_credentials(url: str) -> str:
    """``url`` without its user-info; the credential it carried is held for requests to it."""
    clean, userinfo = split_userinfo(url)
    if userinfo is not None:
        hold(clean, userinfo)
    return clean


def hold(url: str, userinfo: str) -> None:
    """``userinfo`` (``user:password`` or ``TOKEN``, as in a URL) held for requests to ``url``
    (without user-info), every form of its secret given to ``redact``."""
    user, colon, password = userinfo.partition(":")
    user, password = unquote(user), unquote(password)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    for secret in (userinfo, password if colon else user, unquote(userinfo), token):
        remember(secret)
    with _lock:
        _held[_key(url)] = f"Basic {token}"


def _read_environment() -> None:
    """In a driver process: the credentials its command held (``held_environment``)."""
    global _from_env_read
    if _from_env_read:
        return
    _from_env_read = True
    try:
        given = json.loads(os.environ.get(ENV) or "{}")
    except ValueError:
        return
    if isinstance(given, dict):
        for url, header in given.items():
            if isinstance(url, str) and isinstance(header, str):
                remember(header.partition(" ")[2])
                _held.setdefault(url, header)


def authorization(url: str, api_key: str) -> str:
    """The Authorization header of a request to ``url`` (without user-info): its held
    credential, else the API key as Bearer."""
    with _lock:
        _read_environment()
        held = _held.get(_key(url))
    remember(api_key)
    return held if held is not None else f"Bearer {api_key}"


def held_environment() -> dict[str, str]:
    """The held credentials as a driver process's environment (empty: none are held)."""
    with _lock:
        _read_environment()
        return {ENV: json.dumps(_held)} if _held else {}
