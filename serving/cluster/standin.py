"""A local model folder standing in for a model the cluster job names: for tests only.

The tests run the documented jobs word for word (docs/clusters.md: ``--judge gpt-oss-120b``)
on a two-node Slurm without GPUs, where only a tiny model on vLLM's CPU engine can serve. The
test says so through one variable of the job's environment, never through the command or
anything a run reads::

    GROUNDCOVER_TEST_STANDIN='{"models": {"gpt-oss-120b": "/tmp/tiny-llama"}, "replicas": "1"}'

``models`` maps a name the job is given (``--judge``, ``--nli``) to a local folder, served in
its place; ``replicas`` replaces ``--replicas auto`` (which counts GPUs) for a stood-in judge;
``limit`` N gives the command ``--limit N`` (its first N items: a walkthrough's whole dataset,
answered by a tiny model on two cores, would take hours), where the command takes it and does
not give its own.
Every use is said on the job's log. Only ``groundcover cluster`` reads it, from its own
process's environment: a run directory, a config file or an items file cannot set it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ENV = "GROUNDCOVER_TEST_STANDIN"


class StandInError(ValueError):
    """The variable is set but says something this module cannot honour."""


@dataclass(frozen=True)
class StandIn:
    models: dict[str, str] = field(default_factory=dict)
    replicas: str | None = None
    limit: int | None = None

    def model(self, name: str) -> str:
        return self.models.get(name, name)


def from_environment(env: dict[str, str] | None = None) -> StandIn | None:
    """The stand-ins the environment names, or None where the variable is unset; a value that
    is not the documented object, or a folder that is not there, is refused."""
    text = (os.environ if env is None else env).get(ENV)
    if not text:
        return None
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise StandInError(f"{ENV}: not JSON: {exc}") from None
    if not isinstance(given, dict) or set(given) - {"models", "replicas", "limit"}:
        raise StandInError(f'{ENV}: an object with "models", "replicas" and "limit" only')
    models = given.get("models") or {}
    if not isinstance(models, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in models.items()
    ):
        raise StandInError(f'{ENV}: "models" maps names to folders')
    for name, folder in models.items():
        if not (Path(folder) / "config.json").is_file():
            raise StandInError(f"{ENV}: {name} -> {folder}: no model folder (config.json) there")
    replicas = given.get("replicas")
    if replicas is not None and not str(replicas).isdigit():
        raise StandInError(f'{ENV}: "replicas" is a whole number')
    limit = given.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise StandInError(f'{ENV}: "limit" is a whole number of items, at least 1')
    return StandIn(
        models=dict(models), replicas=None if replicas is None else str(replicas), limit=limit
    )
