"""The typed records of a run directory besides its per-item results (``results.ItemResult``):
``manifest.json`` (what the run is: ``RunManifest``), ``summary.json`` (how the last invocation
went: ``RunSummary``) and a study root's ``study.json`` (its runs and combined tables:
``StudyRecord``).

Each carries the run-directory format version it was written in. A record keeps fields a later
version adds (``extra="allow"``), and one written without ``format_version`` (summaries and
study files before they were typed) is of the version its manifest states.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FORMAT_VERSION = 2  # of a run directory; a change that old readers would misread raises it

# usage counters of one stage or role: calls, requests, cache_hits, retries, tokens, seconds
Usage = dict[str, float]


class RunDirRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        """What is written: the fields that were given (an absent mean stays absent); values
        JSON does not know are written as text, as before the records were typed."""
        return self.model_dump(exclude_unset=True) | {"format_version": self.format_version}


class RunManifest(RunDirRecord):
    """Written when a run is created; ``resumed_at`` grows with each resume."""

    framework: str
    task: str  # e.g. "fanoutqa-evidence"
    command: list[str] = Field(default_factory=list)
    config: dict[str, Any]  # the run's identity (what its answers depend on)
    config_fingerprint: str
    options: dict[str, Any] = Field(default_factory=dict)  # all of them, report-only ones too
    models: dict[str, Any] | None = None  # the lead role's model record
    roles: dict[str, dict[str, Any]] = Field(default_factory=dict)  # role -> model + stages
    self_judging: list[dict[str, Any]] = Field(default_factory=list)
    prompts: dict[str, str] = Field(default_factory=dict)
    items: int = 0
    data: Any = None  # the catalogued datasets the inputs are (``data_provenance``)
    # a framework run from its file (not installed): the file, the object, its SHA-256
    source: dict[str, Any] | None = None
    # every input the run rests on: name -> path, sha256, size, files, kind
    # (``provenance.input_records``); absent in a run made before inputs were fingerprinted
    inputs: dict[str, dict[str, Any]] | None = None
    # False: made before inputs and models were known by content (then resumed: since when)
    inputs_fingerprinted: bool | None = None
    fingerprinted_since: float | None = None
    package_version: str = "unknown"
    git_revision: str | None = None
    python: str = ""
    host: str = ""
    created_at: float = 0.0
    resumed_at: list[float] = Field(default_factory=list)


class RunSummary(RunDirRecord):
    """Status counts and the mean over the scored items; an invocation adds its usage, cost,
    concurrency and placement (``*_this_invocation``), ``report`` the recorded usage and cost."""

    framework: str
    task: str
    items: int
    recorded: int
    partial: bool
    statuses: dict[str, int]
    mean_score: float | None = None  # absent when no item has a score
    scored_items: int | None = None
    usage_this_invocation: dict[str, Usage] = Field(default_factory=dict)
    usage_by_role_this_invocation: dict[str, dict[str, Any]] = Field(default_factory=dict)
    usage_recorded: dict[str, Usage] = Field(default_factory=dict)
    usage_by_role: dict[str, dict[str, Any]] = Field(default_factory=dict)
    self_judging: list[dict[str, Any]] = Field(default_factory=list)
    concurrency_this_invocation: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seconds_this_invocation: float | None = None
    nli_placement_this_invocation: dict[str, Any] | None = None
    replicas_this_invocation: dict[str, list[dict[str, Any]]] | None = None
    # per role of a batch transport: rounds, each batch's id, lines and wait, requeued lines
    batches_this_invocation: dict[str, dict[str, Any]] | None = None
    drivers_this_invocation: list[dict[str, Any]] | None = None  # --drivers N: each driver
    cost_this_invocation: dict[str, Any] | None = None
    cost_recorded: dict[str, Any] | None = None
    budget_stop: str | None = None
    # items that ended in a status a rerun retries (error, cut_in_reasoning): how many, which
    failed: dict[str, Any] | None = None
    estimate_of_the_rest: dict[str, Any] | None = None

    def add(self, **fields: Any) -> None:
        """Set fields; a field set is written (``to_json``), as a dict's keys would be."""
        for name, value in fields.items():
            setattr(self, name, value)  # pydantic marks it set


class StudyRecord(RunDirRecord):
    """A study root: its runs (sub-directories) and the combined tables."""

    study: str
    options: dict[str, Any] = Field(default_factory=dict)
    runs: list[str] = Field(default_factory=list)
    combined: Any = None
    repeats: int | None = None
    source: dict[str, Any] | None = None  # a study run from its file (``RunManifest.source``)
