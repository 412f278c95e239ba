"""What each role's model is, found before a run writes anything.

Every endpoint a run names is asked for its models first (``serving.endpoints``): a dead one is
one line within seconds, a model or adapter it does not serve is one line listing what it does.
Then each role's model and adapter are resolved to what they are by content
(``EvaluatorConfig.content``):

- a model directory or adapter this run serves: the SHA-256 digest of its files;
- the embedded model: the digest of the GGUF file it is converted from;
- a hub id: the commit it resolves to (``--model-revision`` pins a branch, tag or commit);
- a model at an endpoint: what the server reports (``root``, ``max_model_len``, an adapter's
  ``parent``), with the weights' digest where the endpoint is on this machine and its ``root`` a
  path here, plus the declared ``--model-revision``. When none of these identifies the weights
  (no declared revision, no digest, no ``root`` naming weights: most hosted APIs, proxies and
  stubs list a bare name), the endpoint's URL joins them: two servers that answer under one name
  are two models, never one answer in the cache. ``keyed_before`` keeps the revision the rules
  before gave, so a cache and a run directory made before still answer (bound to the first
  endpoint that claims them).

The run identity (``identity.run_identity``) and every cache key (``EvalClient.revisions``) use
these revisions, so a retrained adapter or a replaced model is another model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

from ....serving.client import EndpointError
from ....serving.content import digest_path, hub_revision, local_path, model_content
from ....serving.endpoints import (
    EndpointDown,
    EndpointRefusedKey,
    ServedModel,
    served_models,
)
from ....serving.launch.registry import resolve
from ....serving.launch.server import is_loopback
from ..contract.config import EvaluatorConfig, UserError

Listing = list[ServedModel] | None


class EndpointUnreachable(EndpointError):
    """An endpoint that did not list its models before the run: nothing was written."""

    nothing_written = True


class Endpoints:
    """The model listings of a run's endpoints, each asked once."""

    def __init__(self, tolerate: bool = False, probe: bool = True):
        self.tolerate = tolerate  # a dry run: a dead endpoint is noted, not fatal
        self.asks = probe  # False: a client given by the caller answers; nothing is asked
        self.listings: dict[tuple[str, str], Listing] = {}
        self.down: dict[str, str] = {}  # url -> why (tolerated)

    def notes(self) -> list[str]:
        return [
            f"{why}: its models are not checked (a dry run goes on)" for why in self.down.values()
        ]

    def listing(self, ev: EvaluatorConfig) -> Listing:
        assert ev.endpoint is not None
        key = (ev.endpoint, ev.api_key_env)
        if not self.asks:
            return None
        if key not in self.listings:
            try:
                self.listings[key] = served_models(ev.endpoint, ev.api_key())
            except EndpointDown as exc:
                if not self.tolerate:
                    raise EndpointUnreachable(
                        f"{exc}; nothing was written (start the server, or check --endpoint)"
                    ) from None
                self.down[ev.endpoint] = str(exc)
                self.listings[key] = None
            except EndpointRefusedKey as exc:
                raise UserError(f"{exc}: set the key in ${ev.api_key_env}") from None
        return self.listings[key]

    def probe(self, evaluators: Iterable[EvaluatorConfig]) -> None:
        """Ask every endpoint among ``evaluators`` now (before anything is written)."""
        for ev in evaluators:
            if ev.endpoint is not None:
                self.listing(ev)


def resolve_roles(
    found: list[dict[str, EvaluatorConfig]], endpoints: Endpoints
) -> list[dict[str, EvaluatorConfig]]:
    """Each plan's roles with ``content`` resolved; one resolution per distinct evaluator."""
    done: dict[str, EvaluatorConfig] = {}
    out = []
    for roles in found:
        resolved = {}
        for role, ev in roles.items():
            key = json.dumps(ev.model_dump(mode="json", exclude={"content"}), sort_keys=True)
            if key not in done:
                done[key] = ev.model_copy(update={"content": model_content_of(ev, endpoints)})
            resolved[role] = done[key]
        out.append(resolved)
    return out


def ask_endpoints(
    roles: list[dict[str, EvaluatorConfig]], *, probe: bool, tolerate: bool
) -> tuple[list[dict[str, EvaluatorConfig]], list[str]]:
    """Every endpoint the roles use asked for its models before a run directory is written (a
    test's or a notebook's own client is not: ``probe``), each role then known by content; with
    the notes to say (``tolerate``: a dry run, where an endpoint that does not answer is one)."""
    endpoints = Endpoints(tolerate=tolerate, probe=probe)
    endpoints.probe([ev for found in roles for ev in found.values()])
    roles = resolve_roles(roles, endpoints)
    unknown = unresolved_notes(roles) if endpoints.asks else []  # a given client: not asked
    return roles, [*endpoints.notes(), *unknown]


def model_content_of(ev: EvaluatorConfig, endpoints: Endpoints) -> dict[str, Any]:
    """``{"base": {...}, "adapters": {name: {...}}}``, each with its ``revision``."""
    if ev.endpoint is not None:
        return _at_endpoint(ev, endpoints.listing(ev))
    preset = resolve(ev.model)
    if preset.name == "embedded":
        from ....serving.launch.embedded import gguf_path

        gguf = gguf_path()
        sha = digest_path(gguf).sha256
        base: dict[str, Any] = {
            "revision": f"sha256:{sha}",
            "source": "package file",
            "path": str(gguf),
        }
    elif local_path(preset.hub_id) is not None:
        base = model_content(preset.hub_id)
    else:  # the Hub is asked only on the real path (a given client starts no server)
        commit = hub_revision(preset.hub_id, ev.revision, online=endpoints.asks)
        base = {"revision": commit or ev.revision, "hub_id": preset.hub_id}
        base["source"] = "hub" if commit else "unresolved"
    adapters = {name: _adapter(path) for name, path in sorted(ev.adapters.items())}
    return {"base": base, "adapters": adapters}


def _adapter(path: str) -> dict[str, Any]:
    found = digest_path(path)
    return {
        "revision": f"sha256:{found.sha256}",
        "source": "directory",
        "path": str(path),
        "size": found.size,
    }


def _at_endpoint(ev: EvaluatorConfig, listing: Listing) -> dict[str, Any]:
    ref = ev.ref()
    by_id = {m.id: m for m in listing or []}
    model, adapter = ref.base_name, ref.adapter
    if listing is not None and ":" in model and not adapter and model not in by_id:
        split = ref.split_at(list(by_id))  # NAME:TAG the server lists as TAG: an adapter
        model, adapter = split.model, split.adapter
    local = is_loopback(urlparse(ev.endpoint or "").hostname or "")
    if listing is not None and model not in by_id and not (adapter and ev.adapter_prefix):
        raise UserError(
            f"--model {model}: {ev.endpoint} does not serve it (it serves: "
            f"{', '.join(sorted(by_id)) or 'nothing'})"
        )
    adapters: dict[str, Any] = {}
    if adapter:
        served_as = ev.adapter_prefix + adapter
        entry = by_id.get(served_as)
        if listing is not None and entry is None and not ev.adapter_prefix:
            raise UserError(
                f"adapter {adapter!r} is not served at {ev.endpoint} (it serves: "
                f"{', '.join(sorted(by_id)) or 'nothing'})"
            )
        adapters[adapter] = _served(entry, None, local, ev.endpoint or "", served_as)
    base = _served(by_id.get(model), ev.revision, local, ev.endpoint or "", model)
    return {"base": base, "adapters": adapters, "listed": listing is not None}


def _served(
    entry: ServedModel | None, declared: str | None, local: bool, url: str, name: str
) -> dict[str, Any]:
    """What the server says a model is, and a revision over it; where nothing of that
    identifies the weights, the endpoint's URL and the name served there are part of it
    (``known_by``)."""
    record: dict[str, Any] = {"source": "endpoint"}
    if entry is not None:
        record |= entry.record()
        root = local_path(entry.root) if local and entry.root else None
        if root is not None:  # the server is on this machine: its weights are readable here
            record["sha256"] = digest_path(root).sha256
    if declared is not None:
        record["declared_revision"] = declared
    said = {k: v for k, v in record.items() if k not in ("source", "id")}
    identified = declared is not None or "sha256" in record or names_weights(entry)
    if identified:
        record["revision"] = _endpoint_revision(said)
        return record
    # the rules before keyed this model by what it said alone (None: it said nothing)
    record["keyed_before"] = _endpoint_revision(said) if said else None
    record["known_by"] = "url"
    record["url"] = location(url)
    record["revision"] = _endpoint_revision(said | {"url": record["url"], "name": name})
    return record


def _endpoint_revision(said: dict[str, Any]) -> str:
    canonical = json.dumps(said, sort_keys=True)
    return "endpoint:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def names_weights(entry: ServedModel | None) -> bool:
    """Whether a listing's ``root`` names the weights the server loaded: a path or a hub id, or
    a name other than the one the model is served under (vLLM's ``--served-model-name``). A
    root that only repeats a bare served name (``judge``) names nothing."""
    if entry is None or not entry.root:
        return False
    return entry.root != entry.id or "/" in entry.root


def location(url: str) -> str:
    """An endpoint's URL as one spelling: scheme and host in lower case, the default port
    written out, no credentials, no trailing slash, no query."""
    parts = urlparse(url.strip())
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    port = parts.port or (443 if scheme == "https" else 80)
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def keyed_before(ev: EvaluatorConfig) -> dict[str, str | None]:
    """Request name -> the revision its cache keys carried before its URL counted (only the
    models known by their URL)."""
    content = ev.content or {}
    out: dict[str, str | None] = {}
    base = content.get("base") or {}
    if "keyed_before" in base:
        out[ev.ref().base_name] = base["keyed_before"]
    for name, record in (content.get("adapters") or {}).items():
        if "keyed_before" in record:
            out[name] = record["keyed_before"]
    return out


def revisions(ev: EvaluatorConfig) -> dict[str, str]:
    """Request name -> revision, for the client's cache keys (empty: not resolved)."""
    content = ev.content or {}
    out: dict[str, str] = {}
    base = (content.get("base") or {}).get("revision")
    if base:
        out[ev.ref().base_name] = base
    for name, record in (content.get("adapters") or {}).items():
        if record.get("revision"):
            out[name] = record["revision"]
    return out


def role_revision(ev: EvaluatorConfig, before: bool = False) -> dict[str, Any]:
    """One role's model in the run identity: the base's revision, the adapter's when it asks
    one (``None`` where nothing says what it is). ``before``: as the rules before an
    endpoint's URL counted gave it."""
    content = ev.content or {}

    def revision(record: dict[str, Any]) -> Any:
        return (
            record["keyed_before"]
            if before and "keyed_before" in record
            else record.get("revision")
        )

    found: dict[str, Any] = {"model": revision(content.get("base") or {})}
    if ev.adapter:
        found["adapter"] = revision((content.get("adapters") or {}).get(ev.adapter) or {})
    return found


def known_by_url(ev: EvaluatorConfig) -> bool:
    """Whether the role's model (or adapter) is known by its endpoint's URL."""
    content = ev.content or {}
    records = [content.get("base") or {}, *(content.get("adapters") or {}).values()]
    return any(r.get("known_by") == "url" for r in records)


def unresolved_notes(roles: Iterable[dict[str, EvaluatorConfig]]) -> list[str]:
    """One note per model whose revision nothing could tell (a hub id offline and not cached)
    or that is known only by where it is served (an endpoint that says nothing of its weights)."""
    notes: dict[str, str] = {}
    for found in roles:
        for ev in found.values():
            base = (ev.content or {}).get("base") or {}
            where = f" at {ev.endpoint}" if ev.endpoint else ""
            if base and base.get("revision") is None:
                notes[f"{ev.model}{where}"] = (
                    f"{ev.model}{where}: its revision is unknown (give --model-revision to "
                    "record one); a replaced model there would not be told apart"
                )
            elif known_by_url(ev):
                notes[f"{ev.model}{where}"] = (
                    f"{ev.model}{where}: the server says nothing that identifies its weights, "
                    "so the model is known by its URL (another URL is another model; a model "
                    "replaced there is not told apart: give --model-revision to record one)"
                )
    return list(notes.values())
