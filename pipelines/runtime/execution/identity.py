"""What a run is: the evaluator of each role it uses, and the identity its run directory keeps
(what its answers depend on), shared by the runner and the dry run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..contract.config import EvaluatorConfig, UserError
from ..contract.panels import panel_members, split_member
from ..contract.protocol import Framework, RunPlan, RunRequest, Study
from ..contract.readers import items_digest
from ..contract.roles import model_identity
from ..store.provenance import input_digests, input_records
from ..store.run_dir import fingerprint
from .model_content import known_by_url, role_revision
from .models import model_record


def evaluator_identity(ev: EvaluatorConfig) -> dict[str, Any]:
    """What of the evaluator changes answers: not concurrency, timeouts or the URL."""
    found = {
        "model": ev.model,
        "adapter": ev.adapter,
        "temperature": ev.temperature,
        "max_tokens": ev.max_tokens,
    }
    if ev.seed is not None:  # only when set: runs without a seed keep their identity
        found["seed"] = ev.seed
    if ev.reasoning is not None:  # the effort changes answers; the token budget does not
        found["reasoning"] = ev.reasoning
    if ev.revision is not None:  # declared: only when set, as the seed
        found["revision"] = ev.revision
    return found


def study_root(study: Study[Any], request: RunRequest, items: Sequence[Any]) -> Path:
    """``--run-dir``, else ``runs/<study>-<fingerprint>`` of what the study's answers depend on."""
    if request.run.run_dir:
        return Path(request.run.run_dir)
    identity = {
        "study": study.name,
        "items": items_digest(items),
        "evaluator": evaluator_identity(request.evaluator),
        "options": request.options.model_dump(mode="json"),
    }
    if request.roles:  # a run with other models per role is another run
        identity["roles"] = {  # how calls are bought changes no answer: not the run's root
            r: s.model_dump(mode="json", exclude={"transport", "batch_find"})
            for r, s in sorted(request.roles.items())
        }
    if request.run.repeats > 1:  # K seeded runs under one root: not the single run's root
        identity["repeats"] = request.run.repeats
    if request.run.cascade is not None:  # judged through a calibration: known by its content
        from ..contract.cascade import read_cascade

        identity["cascade"] = read_cascade(Path(request.run.cascade)).sha256
    if request.run.confidence is not None:
        identity["confidence"] = request.run.confidence
    return Path("runs") / f"{study.name}-{fingerprint(identity)}"


def evaluator_key(ev: EvaluatorConfig) -> str:
    """Runs with the same key share one client (and server)."""
    return fingerprint(ev.model_dump(mode="json", exclude={"content"}))


def plan_roles(fw: Framework, plan: RunPlan, request: RunRequest) -> dict[str, EvaluatorConfig]:
    """The evaluator of every role a run uses: the plan's, else ``--role``, else the default;
    a panel's further members (``judge#2``, ...) after their role."""
    out: dict[str, EvaluatorConfig] = {}
    for role in fw.roles_used(plan.options):
        out[role] = plan.roles.get(role) or request.role(role)
        members = [m for m in panel_members(role, list(request.roles)) if m != role]
        for member in members:
            out[member] = request.role(member)
    return out


def members_apart(
    fw: Framework, roles: dict[str, EvaluatorConfig], run: Any = None
) -> dict[str, EvaluatorConfig]:
    """A panel's members told apart, or refused, once each is known by content (before
    anything is written). Members that are one model (equal revisions: the same weights, or
    one URL where nothing identifies them) asked with equal sampling would send the same
    request: at temperature 0 (the run's, or one a panel stage fixes) they cannot differ and
    are refused; a fixed seed makes them answer alike and is refused too; sampled at
    temperature > 0 they are a self-consistency panel, each further member's requests keyed
    by its member index (``EvaluatorConfig.sample``) so the cache keeps every sample. With
    ``--simulated-annotators`` (``run``) they are told apart by their wording instead: every
    panel stage needs one per member (``check_wordings``)."""
    out = dict(roles)
    bases = {split_member(name)[0] for name in roles if split_member(name)[1] > 1}
    if run is not None and getattr(run, "simulated_annotators", False):
        for base in sorted(bases):
            check_wordings(fw, base, wordings_needed(run, len(panel_members(base, list(roles)))))
        return out
    for base in sorted(bases):
        first_of: dict[str, str] = {}
        for member in panel_members(base, list(roles)):
            ev = roles[member]
            key = fingerprint(asked_as(ev))
            if key not in first_of:
                first_of[key] = member
                continue
            refusal = same_request(fw, base, member, first_of[key], ev)
            if refusal:
                raise UserError(refusal)
            out[member] = ev.model_copy(update={"sample": split_member(member)[1]})
    return out


def wordings_needed(run: Any, members: int) -> int:
    """How many wordings of a stage a panel asks with simulated annotators: one per member, or
    under ``--cascade`` one per member of its largest tier (each tier words from its prompt)."""
    if run.cascade is None:
        return members
    from ..contract.cascade import read_cascade

    cascade = read_cascade(Path(run.cascade))
    return max(cascade.sizes[k] for k in cascade.judge_tiers())


def check_wordings(fw: Framework, role: str, needed: int) -> None:
    """Each stage of ``role`` a panel combines has a wording for each of ``needed`` members
    (its prompt and the paraphrases it declares), or one line says which has not."""
    for stage in sorted(fw.panel_rules):
        if fw.role_of(stage.rstrip("*"), "") != role:
            continue
        wordings = 1 + len(fw.paraphrases(stage.rstrip("*")))
        if wordings < needed:
            raise UserError(
                f"--simulated-annotators: stage {stage} of {fw.name} has {wordings} wording(s) "
                f"(its prompt and {wordings - 1} paraphrase(s)), and the {role} panel asks it "
                f"with {needed} members, one wording each: give at most {wordings} member(s) "
                "a tier, or declare more paraphrases (prompt_variants)"
            )


def asked_as(ev: EvaluatorConfig) -> dict[str, Any]:
    """What makes two members' requests the same: the model by content (by name where nothing
    resolved it) and the sampling."""
    revision = role_revision(ev)
    return {
        "model": revision if revision.get("model") else model_identity(ev),
        "adapter": ev.adapter,
        "sampling": {k: getattr(ev, k) for k in SAMPLING_FIELDS},
    }


SAMPLING_FIELDS = ("temperature", "seed", "max_tokens", "reasoning", "reasoning_tokens")


def same_request(
    fw: Framework, base: str, member: str, twin: str, ev: EvaluatorConfig
) -> str | None:
    """Why ``member``, one model with ``twin`` asked the same way, is refused (None: sampled
    apart, a self-consistency panel)."""
    how = (
        "give it another model, or tell the models apart (--role-revision "
        f"{member}=REVISION, or revision: in the YAML roles), or sample a self-consistency "
        "panel (--temperature above 0, no --seed)"
    )
    what = f"--role {member}: the same model as {twin} ({describe_model(ev)})"
    if ev.temperature == 0:
        return f"{what} asked at temperature 0 answers the same; {how}"
    if ev.seed is not None:
        return f"{what} with --seed {ev.seed} answers the same; {how}"
    fixed = [
        stage
        for stage, role in fw.stage_roles.items()
        if role == base
        and fw.panel_rule(stage) is not None
        and fw.sampling_of(stage).get("temperature", ev.temperature) == 0
    ]
    if fixed:
        return (
            f"{what}: {fw.name} asks {', '.join(sorted(fixed))} at temperature 0 whatever the "
            "run's (the paper's protocol), so its samples cannot differ; give it another model"
        )
    return None


def describe_model(ev: EvaluatorConfig) -> str:
    """A model as a refusal names it: where it is served, and how it is known."""
    where = f"{ev.model} at {ev.endpoint}" if ev.endpoint else ev.model
    revision = role_revision(ev).get("model")
    return f"{where}, revision {revision}" if revision else where


def lead_evaluator(roles: dict[str, EvaluatorConfig], default: EvaluatorConfig) -> EvaluatorConfig:
    """The first role's evaluator (the default when a run asks no model)."""
    return next(iter(roles.values()), default)


def run_identity(
    fw: Framework[Any, Any],
    options: BaseModel,
    roles: dict[str, EvaluatorConfig],
    default: EvaluatorConfig,
    items: Sequence[Any],
    inputs: dict[str, dict[str, Any]] | None = None,
    legacy: bool = False,
    before_urls: bool = False,
) -> dict[str, Any]:
    """What a run's answers depend on. The first role's evaluator is written flat (so a run with
    one model keeps the identity it always had); every other role whose model differs is
    listed under ``roles``. ``content``: every input by digest (``inputs``, default: read from
    ``options``) and every role's model and adapter by revision (``served``), input paths
    left out of the options. ``legacy``: the identity as run directories made before that kept
    it (paths, no content), which ``RunStore`` accepts as the same run; ``before_urls``: the
    identity as it was before an endpoint that nothing identifies was known by its URL, which
    ``RunStore`` accepts too (``earlier_identity``)."""
    lead = evaluator_identity(lead_evaluator(roles, default))
    others = {  # a panel member is listed even when it is the lead's model (it judges too)
        role: evaluator_identity(ev)
        for role, ev in roles.items()
        if evaluator_identity(ev) != lead or split_member(role)[1] > 1
    }
    found = {
        "items_sha256": items_digest(items),
        "items": len(items),
        **lead,
        **({"roles": others} if others else {}),
        "prompts": fw.prompt_ids(options),
        "options": fw.identity(options, paths=legacy),
    }
    source = getattr(fw, "source", None)
    if source:  # a framework run from its file: its code is part of what the answers rest on
        found["framework_sha256"] = source["sha256"]
    if legacy:  # the identity a run directory made before content identities kept
        return found
    records = input_records(options) if inputs is None else inputs
    found["content"] = {
        "inputs": input_digests(records),
        "models": {role: role_revision(ev, before_urls) for role, ev in sorted(roles.items())},
    }
    return found


def judging_identity(run: Any) -> dict[str, Any]:
    """What of the run's configuration changes how its judgements are made and recorded, for
    its identity (empty for a run with neither): the cascade's calibration by content
    (``--cascade``), the confidence recorded with each label (``--confidence``) and panel
    members asking their own paraphrase (``--simulated-annotators``)."""
    from ..contract.cascade import read_cascade

    found: dict[str, Any] = {}
    if run.cascade is not None:
        found["cascade"] = read_cascade(Path(run.cascade)).identity()
    if run.confidence is not None:
        found["confidence"] = run.confidence
    if run.simulated_annotators:  # each panel member asks its own wording
        found["simulated_annotators"] = True
    return found


def earlier_identity(
    fw: Framework[Any, Any],
    options: BaseModel,
    roles: dict[str, EvaluatorConfig],
    default: EvaluatorConfig,
    items: Sequence[Any],
    inputs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """``run_identity`` as it was before endpoints were known by their URL, where that differs
    (None: no role's model is known by its URL)."""
    if not any(known_by_url(ev) for ev in roles.values()):
        return None
    return run_identity(fw, options, roles, default, items, inputs, before_urls=True)


def role_records(fw: Framework, roles: dict[str, EvaluatorConfig]) -> dict[str, dict[str, Any]]:
    """Per role: the model record and the stages it answers (for the manifest and reports)."""
    stages = {role: sorted(s for s, r in fw.stage_roles.items() if r == role) for role in roles}
    return {role: model_record(ev) | {"stages": stages[role]} for role, ev in roles.items()}
