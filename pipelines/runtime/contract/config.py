"""Typed configuration from an optional YAML file plus command-line flags: the evaluator and run
settings, the options every framework command shares (declared once), and the one builder of a
command's configuration. Every problem is one line, before any model starts; the input readers
are ``readers``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ....serving.launch.embedded import cache_root
from ....serving.launch.registry import ModelRef, UnknownModelError
from ..store.provenance import NotContent
from .errors import (
    UserError as UserError,  # raised by the readers here
)
from .readers import describe_validation, read_text

M = TypeVar("M", bound=BaseModel)


def _number_as_id(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# A record id: a string, or an integer taken as its decimal string (many datasets number their
# records). Text fields stay strict: a number where a question or response belongs is an error.
RecordId = Annotated[str, BeforeValidator(_number_as_id)]


class Strict(BaseModel):
    """A pydantic model that refuses fields it does not declare (a misspelt option is one line,
    never silently ignored)."""

    model_config = ConfigDict(extra="forbid")


def endpoint_url(value: str | None) -> str | None:
    """An endpoint as read (``--endpoint``, a role's ``@URL``, the YAML, the Python API): an
    http(s) URL, its user-info taken off and held in memory for its requests
    (``serving.credentials``), so that nothing recorded, shown, exported or keyed holds it."""
    if value is None:
        return None
    from ....serving.credentials import take_credentials
    from ....serving.redact import redact

    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, got {redact(value)!r}")
    return take_credentials(value)


class EvaluatorConfig(Strict):
    """One evaluator: the model (a preset, a directory, a hub id, ``MODEL:ADAPTER``), where it
    is served (an ``endpoint``, else vLLM started here, with ``adapters`` and ``replicas``), how
    it is asked (concurrency, timeouts, retries, sampling, reasoning) and, set by the run, what
    it is by content (``content``) and a self-consistency member's sample (``sample``). Each
    field's description is its flag's help (``--model``, ``--endpoint``, ...)."""

    model: Annotated[str, NotContent("known by the revision the run resolves: ``content``")] = (
        Field(
            "embedded",
            description="the evaluator: a preset, a model directory, a hub id, or MODEL:ADAPTER",
        )
    )
    revision: str | None = Field(
        None,
        description="the model's revision: a hub commit or branch to serve, or a label for what "
        "an endpoint serves (recorded; part of the run's identity)",
    )
    endpoint: str | None = Field(
        None, description="OpenAI-compatible base URL; none: start vLLM here"
    )
    adapter: str | None = Field(None, description="LoRA adapter every request is sent to")
    adapters: Annotated[dict[str, str], NotContent("each known by its digest, in ``content``")] = (
        Field(default_factory=dict, description="NAME=PATH of an adapter to serve (repeat)")
    )
    adapter_prefix: str = Field(
        "",
        description="what an endpoint puts before adapter names "
        "('BASE:' for a Ray Serve LLM app, which routes BASE:ADAPTER)",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="the variable holding the endpoint's API key (sent as Bearer)",
    )
    replicas: int = Field(
        1, ge=1, le=1024, description="model replicas behind one URL (Ray Serve LLM), if started"
    )
    ray_address: str | None = Field(
        None, description="Ray cluster for replicas and NLI actors (default: a local one)"
    )
    concurrency: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = Field(
        16,
        description="requests (and items) in flight: N, or auto (found by AIMD, up to "
        "concurrency_max)",
    )
    concurrency_max: int = Field(256, ge=1, le=4096, description="the ceiling of auto")
    timeout: float = Field(300.0, gt=0)
    max_retries: int = Field(8, ge=0)
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="sampling temperature")
    seed: int | None = Field(None, ge=0, description="sampling seed sent with every request")
    max_tokens: int = Field(512, ge=1, description="default completion budget of a request")
    reasoning: Literal["off", "low", "medium", "high"] | None = Field(
        None,
        description="off | low | medium | high: how much a reasoning model reasons "
        "(default: its preset's)",
    )
    reasoning_tokens: int | None = Field(
        None, ge=1, description="reasoning tokens on top of each answer budget (default per effort)"
    )
    vllm_extensions: bool = Field(True, description="server accepts vLLM's structured_outputs")
    transport: Literal["online", "batch"] = Field(
        "online",
        description="online: requests one by one; batch: the calls of the items in flight "
        "bought in rounds of batch jobs (the endpoint's /batches, or vllm run-batch for a model "
        "served here; docs/batch.md). Answers are keyed alike: the run's identity is the same",
    )
    batch_size: int = Field(
        10_000, ge=1, le=50_000, description="the most lines of one batch (a round's cap)"
    )
    batch_settle: float = Field(
        1.0, gt=0, description="seconds without a new request before a round is submitted"
    )
    batch_poll: float = Field(10.0, gt=0, description="seconds between polls of a batch")
    batch_find: float = Field(
        30.0,
        ge=0,
        description="seconds a create whose answer was lost is looked for in the provider's "
        "batch listing (which lags its creates) before it is asked again",
    )
    batch_retry: Literal["batch", "online"] = Field(
        "batch",
        description="where a failed or expired batch line is asked again: in the next round, "
        "or online at once (at an endpoint only)",
    )
    max_model_len: int | None = Field(None, ge=256)
    # set by the run for the members of a self-consistency panel (one model sampled k times):
    # the member's index, part of its cache keys so each sample is kept (identity.plan_roles)
    sample: int | None = Field(None, ge=2, description="set by the run: do not set")
    # set by the run before anything is written (execution.model_content), never by hand:
    # what the base model and each adapter are by content; cache keys and the run identity use it
    content: dict[str, Any] | None = Field(None, description="resolved by the run: do not set")

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return endpoint_url(value)

    @field_validator("adapters")
    @classmethod
    def _adapter_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not (Path(path) / "adapter_config.json").is_file():
                raise ValueError(f"adapter {name!r}: no adapter_config.json in {path}")
        return value

    @model_validator(mode="after")
    def _address(self) -> EvaluatorConfig:
        """Resolve MODEL:ADAPTER once; an adapter we serve ourselves must be given a path."""
        try:
            ref = ModelRef.parse(self.model, self.endpoint, self.adapter, served=self.adapters)
        except UnknownModelError as exc:
            raise ValueError(str(exc)) from exc
        self.model, self.adapter = ref.model, ref.adapter
        if self.adapter and not self.endpoint and self.adapter not in self.adapters:
            raise ValueError(
                f"adapter {self.adapter!r} is not served by this run: add --lora "
                f"{self.adapter}=PATH (or use --endpoint of a server that has it)"
            )
        if self.replicas > 1 and self.endpoint:
            raise ValueError("replicas: the run starts replicas only without --endpoint")
        if self.batch_retry == "online" and self.transport == "batch" and not self.endpoint:
            raise ValueError(
                "batch_retry: online needs an --endpoint (vllm run-batch has no server to ask)"
            )
        if self.adapter_prefix and not self.endpoint:
            raise ValueError("adapter_prefix: only for an --endpoint (a server we start knows)")
        if not self.endpoint:  # we start the server: its adapters must fit the base model
            from ....serving.launch.registry import lora_adapter, resolve

            base = resolve(self.model).name
            for name, path in self.adapters.items():
                lora_adapter(name, path, base, self.model)
        return self

    def ref(self) -> ModelRef:
        return ModelRef(self.model, self.endpoint, self.adapter)

    def api_key(self) -> str:
        from ....serving.redact import remember

        key = os.environ.get(self.api_key_env, "EMPTY")
        remember(key)  # never printed or stored from here on
        return key


class RunConfig(Strict):
    run_dir: Annotated[Path | None, NotContent("where the run is written")] = Field(
        None, description="where the run is written (default: runs/<task>-<run fingerprint>)"
    )
    cache: Annotated[Path | None, NotContent("derived answers, keyed by content themselves")] = (
        Field(default_factory=lambda: cache_root() / "responses.sqlite")
    )
    # what a run costs, and caps on it (not part of a run's identity: a raised cap resumes it)
    prices: Annotated[Path | None, NotContent("prices change costs, never scores")] = Field(
        None, description="YAML: model -> $ per million tokens, or per GPU-hour"
    )
    supersede: bool = Field(
        False,
        description="a run directory whose inputs or models changed: move its records aside "
        "(superseded/<time>/) and solve it again in place (unchanged: resume as usual)",
    )
    max_cost: float | None = Field(None, gt=0, description="admit no item past this many dollars")
    max_run_tokens: int | None = Field(None, ge=1, description="admit no item past these tokens")
    repeats: int = Field(
        1, ge=1, le=100, description="K judgements per item, one seed each (temperature > 0)"
    )
    keep_reasoning: bool = Field(
        False, description="keep each request's reasoning in the item's record (it is large)"
    )
    confidence: Literal["logprobs"] | None = Field(
        None,
        description="record each label a lone judge gives with the probability it gave it "
        "(its answer tokens' logprobs, after any reasoning): a cascade tier's confidence for "
        "`cascade calibrate` (a panel's is the share of its members, recorded always)",
    )
    simulated_annotators: bool = Field(
        False,
        description="a judge panel's members word their question apart (Trust or Escalate's "
        "simulated annotators): member 1 asks a label or rating stage with its prompt, member k "
        "with the framework's (k-1)-th declared paraphrase of it (prompt_variants); one model "
        "at temperature 0 then makes a panel whose agreement is a confidence",
    )
    # known by its content: the calibration's SHA-256 enters the run's identity (identity.py)
    cascade: Annotated[Path | None, NotContent("known by the SHA-256 it holds")] = Field(
        None,
        description="a calibration from `groundcover cascade calibrate`: ask the judging "
        "role's members tier by tier, cheapest first, keeping a label at the first tier "
        "confident enough; abstain after the last (docs/judges.md)",
    )
    allow_failures: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)?%?$",
        description="failed items a run may end with and still exit 0: N, or a share P%",
    )
    # where people already look (reports.exports.tracking); off by default, never a failure
    track: Literal["mlflow", "wandb"] | None = Field(
        None,
        description="also log the run to mlflow (a local file store by default) or wandb "
        "(offline by default): identity, headline, tables, the HTML page",
    )
    track_uri: Annotated[
        str | None, NotContent("where tracking writes, never what a run computes")
    ] = Field(
        None,
        description="an MLflow tracking URI (default: ./mlruns) or the directory W&B writes "
        "under (default: .)",
    )
    track_project: str = Field("groundcover", description="the MLflow experiment or W&B project")
    # several processes of one run (execution.drivers); not part of its identity either
    drivers: int = Field(
        1,
        ge=1,
        le=1024,
        description="driver actors on the Ray cluster (--ray-address) sharing the run",
    )
    driver_resources: dict[str, float] | list[dict[str, float]] | None = Field(
        None, description="Ray resources per driver (JSON): one object for all, or one each"
    )

    def failures_allowed(self, items: int) -> int:
        """How many failed items ``allow_failures`` accepts in a run of ``items`` (0 unset)."""
        given = self.allow_failures
        if given is None:
            return 0
        if given.endswith("%"):
            return int(items * float(given[:-1]) / 100)
        return int(float(given))

    @field_validator("driver_resources", mode="before")
    @classmethod
    def _json_resources(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc.msg} (column {exc.colno})") from None
        return value


@dataclass(frozen=True)
class SharedOption:
    """An option every framework command shares, declared once. With ``field`` (a dotted path
    into ``EvaluatorConfig`` or ``RunConfig``), its type, help text and default are the field's,
    as a framework option's are; without one it says how this invocation runs, not what it
    computes, and carries its own ``help`` and ``kind``."""

    name: str  # the flag's Python name: --model-revision is model_revision
    field: str | None = None  # "evaluator.revision"; "roles" for --role
    help: str = ""
    kind: Any = None

    @property
    def model(self) -> type[Strict] | None:
        section = (self.field or "").partition(".")[0]
        models: dict[str, type[Strict]] = {"evaluator": EvaluatorConfig, "run": RunConfig}
        return models.get(section)


# The order is --help's; the CLI builds the flags (pipelines.cli.options), the API takes the same
# fields as keywords, a YAML file as sections.
SHARED_OPTIONS = (
    SharedOption("config", help="YAML config file (flags win)", kind=Path | None),
    SharedOption("model", "evaluator.model"),
    SharedOption("endpoint", "evaluator.endpoint"),
    SharedOption("adapter", "evaluator.adapter"),
    SharedOption(
        "role",
        "roles",
        "ROLE=MODEL, ROLE=MODEL@URL, ROLE=MODEL:ADAPTER or ROLE=:ADAPTER: another model for one "
        "role (repeat; a judging role given again is a judge panel, docs/judges.md)",
        list[str] | None,
    ),
    SharedOption(
        "role_revision",
        "roles.revision",
        "ROLE=REVISION: the revision of one role's model, a hub commit or a label for what an "
        "endpoint serves (repeat; a panel's members are judge, judge#2, judge#3, ...)",
        list[str] | None,
    ),
    SharedOption("lora", "evaluator.adapters", kind=list[str] | None),
    SharedOption("model_revision", "evaluator.revision"),
    SharedOption("adapter_prefix", "evaluator.adapter_prefix"),
    SharedOption("api_key_env", "evaluator.api_key_env"),
    SharedOption("run_dir", "run.run_dir"),
    SharedOption("replicas", "evaluator.replicas"),
    SharedOption("ray_address", "evaluator.ray_address"),
    SharedOption("concurrency", "evaluator.concurrency"),
    SharedOption("transport", "evaluator.transport"),
    SharedOption("batch_size", "evaluator.batch_size"),
    SharedOption("batch_retry", "evaluator.batch_retry"),
    SharedOption("max_tokens", "evaluator.max_tokens"),
    SharedOption("temperature", "evaluator.temperature"),
    SharedOption("reasoning", "evaluator.reasoning"),
    SharedOption("reasoning_tokens", "evaluator.reasoning_tokens"),
    SharedOption("prices", "run.prices"),
    SharedOption("max_cost", "run.max_cost"),
    SharedOption("max_run_tokens", "run.max_run_tokens"),
    SharedOption("repeats", "run.repeats"),
    SharedOption("drivers", "run.drivers"),
    SharedOption("driver_resources", "run.driver_resources"),
    SharedOption("allow_failures", "run.allow_failures"),
    SharedOption("keep_reasoning", "run.keep_reasoning"),
    SharedOption("cascade", "run.cascade"),
    SharedOption("confidence", "run.confidence"),
    SharedOption("simulated_annotators", "run.simulated_annotators"),
    SharedOption("supersede", "run.supersede"),
    SharedOption("track", "run.track"),
    SharedOption("track_uri", "run.track_uri"),
    SharedOption("track_project", "run.track_project"),
    SharedOption(
        "dry_run",
        help="check inputs, print what each run would still ask; start nothing",
        kind=bool,
    ),
    SharedOption(
        "pilot",
        help="solve K missing items for real (kept), then estimate the rest",
        kind=int | None,
    ),
    SharedOption("no_cache", help="skip the response cache", kind=bool),
    SharedOption("quiet", help="no progress bar", kind=bool),
)


def load_config(
    model: type[M],
    yaml_path: Path | None,
    overrides: dict[str, Any],
    sections: tuple[str, ...] = (),
) -> M:
    """YAML file first, then flags that were given (None means 'not given'); ``sections`` that
    neither gave are empty (their required fields are then named, not the section).
    Configuration that only lacks required fields raises ``MissingFields``."""
    data: dict[str, Any] = {}
    source = str(yaml_path) if yaml_path else "command line"
    if yaml_path is not None:
        if not yaml_path.is_file():
            raise UserError(f"config file not found: {yaml_path}")
        try:
            data = yaml.safe_load(read_text(yaml_path)) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{yaml_path}: not valid YAML: {' '.join(str(exc).split())}") from exc
        except RecursionError:
            raise UserError(f"{yaml_path}: YAML nested too deeply") from None
        if not isinstance(data, dict):
            raise UserError(f"{yaml_path}: top level must be a mapping")
    for dotted, value in overrides.items():
        if value is None:
            continue
        target = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    for section in sections:  # a section no flag or file gave: its own fields are reported
        data.setdefault(section, {})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        missing = missing_fields(exc)
        if missing:
            raise MissingFields(f"{source}: missing {', '.join(missing)}", missing) from exc
        raise UserError(f"{source}: {describe_validation(exc)}") from exc


class MissingFields(UserError):
    """Configuration without required fields (dotted, ``garage.input``); the command line names
    the flags that give them (``pipelines.cli.frameworks``)."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.fields = fields


def missing_fields(exc: ValidationError) -> list[str]:
    """The dotted fields a validation found missing, when that is all it found."""
    errors = exc.errors()
    if not errors or any(e["type"] != "missing" for e in errors):
        return []
    return [".".join(str(p) for p in e["loc"]) for e in errors]
