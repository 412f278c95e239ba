"""What an OpenAI-compatible endpoint serves, asked once before a run writes anything.

``GET /models`` lists every model and adapter a server answers for. vLLM adds to each entry what
the model is: ``root`` (the weights it loaded: a hub id or a path; an adapter's path),
``parent`` (an adapter's base model) and ``max_model_len``. The probe has a short limit: a
refused connection is said at once, an unreachable host within ``timeout`` seconds, instead of
after a run's retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from .credentials import authorization, take_credentials

PROBE_SECONDS = 3.0


class EndpointDown(RuntimeError):
    """The endpoint did not answer its model listing (refused, unreachable, timed out)."""


class EndpointRefusedKey(RuntimeError):
    """The endpoint answered 401/403: the API key is missing or wrong."""


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    owned_by: str | None = None

    def record(self) -> dict[str, Any]:
        """What the server says the model is (for a manifest: no None fields)."""
        fields = {
            "id": self.id,
            "root": self.root,
            "parent": self.parent,
            "max_model_len": self.max_model_len,
        }
        return {k: v for k, v in fields.items() if v is not None}


def served_models(
    base_url: str, api_key: str = "EMPTY", timeout: float = PROBE_SECONDS
) -> list[ServedModel] | None:
    """The models ``base_url`` serves; None when it has no listing (404, not JSON)."""
    base_url = take_credentials(base_url)
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": authorization(base_url, api_key)}
    try:
        response = httpx.get(url, headers=headers, timeout=httpx.Timeout(timeout))
    except httpx.TimeoutException:
        raise EndpointDown(f"{base_url}: no answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:  # refused, no route, DNS
        raise EndpointDown(f"{base_url}: {_reason(exc)}") from None
    if response.status_code in (401, 403):
        raise EndpointRefusedKey(
            f"{base_url}: the server refused the API key (HTTP {response.status_code})"
        )
    if response.status_code >= 500:
        raise EndpointDown(f"{base_url}: the model listing failed (HTTP {response.status_code})")
    if response.status_code != 200:
        return None
    try:
        entries = response.json()["data"]
        return [_entry(e) for e in entries]
    except (ValueError, KeyError, TypeError):
        return None


def _entry(raw: dict[str, Any]) -> ServedModel:
    length = raw.get("max_model_len")
    return ServedModel(
        id=str(raw["id"]),
        root=str(raw["root"]) if raw.get("root") is not None else None,
        parent=str(raw["parent"]) if raw.get("parent") is not None else None,
        max_model_len=int(length) if isinstance(length, int) else None,
        owned_by=str(raw["owned_by"]) if raw.get("owned_by") is not None else None,
    )


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if "refused" in text.lower():
        return "connection refused"
    return text[:200] or type(exc).__name__
