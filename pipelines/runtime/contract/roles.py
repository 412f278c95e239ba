"""Model roles: which model plays which part of a framework.

A framework declares its roles and the role of each stage that asks a model
(``Framework.roles``, ``Framework.stage_roles``). ``--model/--endpoint/--adapter`` are every
role's default; ``--role ROLE=MODEL[@URL][:ADAPTER]`` (repeatable) and the YAML ``roles:``
section replace the model of one role. The system under evaluation (``answer``, ``generate``)
and its judges are different roles: a run whose judge resolves to the answering model says so.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ....serving.credentials import hold, split_userinfo
from ....serving.redact import clipped, redact
from ..store.provenance import NotContent
from .config import EvaluatorConfig, Strict, UserError, endpoint_url
from .panels import member_name

# Roles that write the output under evaluation; every other role judges or extracts.
SYSTEM_ROLES = ("answer", "generate")


class RoleSpec(Strict):
    """One role's model. Without ``model`` the role keeps the default model (``adapter``
    alone: an adapter on it, as ``--extractor NAME``); with ``model`` and no ``endpoint`` the
    run starts that model itself."""

    model: Annotated[
        str | None, NotContent("known by the revision the run resolves (served.py)")
    ] = None
    endpoint: str | None = None
    adapter: str | None = None
    revision: str | None = None  # the role's model's revision (YAML): hub commit or a label
    api_key_env: str | None = None
    reasoning: Literal["off", "low", "medium", "high"] | None = None  # this role's, in YAML
    reasoning_tokens: int | None = Field(None, ge=1)
    transport: Literal["online", "batch"] | None = None  # this role's, in YAML

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        return parse_spec(value) if isinstance(value, str) else value

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return endpoint_url(value)


def parse_spec(text: str) -> dict[str, str | None]:
    """``MODEL``, ``MODEL@URL``, ``MODEL:ADAPTER@URL``, ``MODEL@URL:ADAPTER`` or ``:ADAPTER``.

    After a URL, ``:NAME`` is an adapter unless it is a port (digits) or part of the path.
    Before the URL, ``MODEL:TAG`` stays whole here: it names an adapter only if that adapter
    is served or registered (``ModelRef.parse``), so ``llama3:8b`` at an endpoint is a model.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty model spec")
    model, at, url = text.partition("@")
    adapter = None
    if at:
        url, userinfo = split_userinfo(url)  # before ':ADAPTER' is looked for (a password's ':')
        head, colon, tail = url.rpartition(":")
        if colon and tail and "/" not in tail and not tail.isdigit() and "//" in head:
            url, adapter = head, tail
        if userinfo is not None:
            hold(url, userinfo)  # in memory for the requests; the spec keeps the URL without
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{redact(text)!r}: after @ comes an http(s) URL")
    if model.startswith(":"):  # ':ADAPTER': an adapter on the default model
        return {"adapter": model[1:] or None, "endpoint": url or None}
    return {"model": model or None, "endpoint": url or None, "adapter": adapter}


def parse_role_options(values: list[str] | None) -> dict[str, str]:
    """``--role ROLE=SPEC`` (repeatable) -> {role: spec}; the spec is checked with the config.
    A role given again is a judge panel: its further models are the roles ``ROLE#2``, ..."""
    out: dict[str, str] = {}
    for value in values or []:
        role, sep, spec = value.partition("=")
        role = role.strip()
        if not sep or not role or not spec.strip():
            raise UserError(f"--role expects ROLE=MODEL[@URL][:ADAPTER], got {value!r}")
        name, k = role, 1
        while name in out:
            k += 1
            name = member_name(role, k)
        out[name] = spec.strip()
    return out


def with_revisions(overrides: dict[str, Any], values: list[str] | None) -> dict[str, Any]:
    """``--role-revision ROLE=REVISION`` (repeatable) joined to the ``roles.ROLE`` the same
    command line gave (a panel member is ``judge#2``, ...)."""
    out = dict(overrides)
    for value in values or []:
        role, sep, revision = value.partition("=")
        role, revision = role.strip(), revision.strip()
        if not sep or not role or not revision:
            raise UserError(f"--role-revision expects ROLE=REVISION, got {value!r}")
        spec = out.get(f"roles.{role}")
        if spec is None:
            raise UserError(
                f"--role-revision {role}: no --role {role} on the command line (a panel's "
                "members are judge, judge#2, ... in the order given; in YAML, give revision: "
                "in the role's entry)"
            )
        out[f"roles.{role}"] = (parse_spec(spec) if isinstance(spec, str) else dict(spec)) | {
            "revision": revision
        }
    return out


def expand_panels(roles: Any) -> Any:
    """The YAML ``roles:`` section with a list for a role (a judge panel) as the member roles
    ``ROLE``, ``ROLE#2``, ...; a list of one is the role itself."""
    if not isinstance(roles, dict):
        return roles
    out: dict[str, Any] = {}
    for role, spec in roles.items():
        if isinstance(spec, list):
            if not spec:
                raise ValueError(f"roles.{role}: an empty panel")
            out |= {member_name(role, k): s for k, s in enumerate(spec, 1)}
        else:
            out[role] = spec
    return out


def role_evaluator(default: EvaluatorConfig, spec: RoleSpec | None) -> EvaluatorConfig:
    """The evaluator of one role: the default one, with the spec's model (and where it is
    served) in place of the default's. Sampling, concurrency and timeouts stay shared."""
    if spec is None:
        return default
    base = default.model_dump()
    if spec.model is None:  # an adapter (or endpoint) for the default model
        update: dict[str, Any] = {"adapter": spec.adapter}
        if spec.endpoint:
            update |= {"endpoint": spec.endpoint, "replicas": 1, "adapter_prefix": ""}
    else:
        # Another model: served at its URL, or started here with only the adapter it asks for
        # among the --lora adapters (the default's other adapters belong to the default base).
        adapters = {k: v for k, v in default.adapters.items() if spec.model.endswith(f":{k}")}
        if spec.adapter and spec.adapter in default.adapters:
            adapters[spec.adapter] = default.adapters[spec.adapter]
        update = {
            "model": spec.model,
            "endpoint": spec.endpoint,
            "adapter": spec.adapter,
            "adapters": {} if spec.endpoint else adapters,
            "adapter_prefix": "",
            "replicas": 1 if spec.endpoint else default.replicas,
            "revision": spec.revision,  # another model: the default's revision is not its own
        }
    if spec.revision is not None:  # the role's own (--role-revision, YAML revision:)
        update["revision"] = spec.revision
    if spec.api_key_env:
        update["api_key_env"] = spec.api_key_env
    update["content"] = None  # resolved again for this role (execution.model_content)
    for name in ("reasoning", "reasoning_tokens", "transport"):  # the role's, else the default's
        if getattr(spec, name) is not None:
            update[name] = getattr(spec, name)
    return EvaluatorConfig.model_validate(base | update)


def same_model(a: EvaluatorConfig, b: EvaluatorConfig) -> bool:
    """Whether two roles resolve to the same model (base and adapter; where it is served
    does not make it another model)."""
    return model_identity(a) == model_identity(b)


def model_identity(ev: EvaluatorConfig) -> tuple[str, str | None]:
    preset = ev.ref().preset
    return (preset.hub_id if preset is not None else ev.model), ev.adapter


def judges_without_reasoning(roles: dict[str, EvaluatorConfig]) -> dict[str, EvaluatorConfig]:
    """A paper's protocol where its judges did not reason: each judging role whose model can
    turn reasoning off (Qwen3's thinking) runs with it off, unless its reasoning was set. The
    systems under evaluation, and models that cannot turn it off, keep theirs."""
    out = {}
    for role, ev in roles.items():
        preset = ev.ref().preset
        toggles = preset is not None and preset.reasoning == "toggle"
        if role not in SYSTEM_ROLES and toggles and ev.reasoning is None:
            ev = ev.model_copy(update={"reasoning": "off"})
        out[role] = ev
    return out


def self_judging(roles: dict[str, EvaluatorConfig]) -> list[dict[str, str]]:
    """Pairs (system role, judging role) that resolve to the same model."""
    found = []
    for system in SYSTEM_ROLES:
        if system not in roles:
            continue
        for role, ev in roles.items():
            if role not in SYSTEM_ROLES and same_model(roles[system], ev):
                found.append({"system": system, "judge": role, "model": ev.ref().request_name})
    return found


def responder_config(spec: str, base: EvaluatorConfig) -> tuple[str, EvaluatorConfig]:
    """'MODEL', 'MODEL@URL' or any role spec: the responder's evaluator, and its name as a
    directory name."""
    try:
        evaluator = role_evaluator(base, RoleSpec.model_validate(spec))
    except ValueError as exc:
        raise UserError(f"model {redact(spec)!r}: {clipped(str(exc), 300)}") from exc
    return model_name(evaluator), evaluator


def model_name(ev: EvaluatorConfig) -> str:
    """A model (and adapter) as a directory name."""
    name = f"{ev.model}:{ev.adapter}" if ev.adapter else ev.model
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
