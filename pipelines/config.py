"""Typed configuration from an optional YAML file plus command-line flags, and input readers.

Every problem is reported as one line naming the file, record and field, before any model starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.embedded import cache_root

M = TypeVar("M", bound=BaseModel)


class UserError(ValueError):
    """Bad configuration or input: printed as one line, exit code 2, nothing written."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvaluatorConfig(Strict):
    model: str = Field("embedded", description="preset name, model directory or hub id")
    endpoint: str | None = Field(None, description="OpenAI-compatible base URL; none: start vLLM")
    adapter: str | None = Field(None, description="LoRA adapter name to send requests to")
    adapters: dict[str, str] = Field(default_factory=dict, description="NAME: PATH to serve")
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = Field(16, ge=1, le=4096)
    timeout: float = Field(300.0, gt=0)
    max_retries: int = Field(8, ge=0)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(512, ge=1)
    vllm_extensions: bool = Field(True, description="server accepts vLLM's structured_outputs")
    max_model_len: int | None = Field(None, ge=256)

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value

    @field_validator("adapters")
    @classmethod
    def _adapter_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not (Path(path) / "adapter_config.json").is_file():
                raise ValueError(f"adapter {name!r}: no adapter_config.json in {path}")
        return value

    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "EMPTY")


class RunConfig(Strict):
    run_dir: Path | None = Field(None, description="default: runs/<task>-<run fingerprint>")
    cache: Path | None = Field(default_factory=lambda: cache_root() / "responses.sqlite")


def load_config(model: type[M], yaml_path: Path | None, overrides: dict[str, Any]) -> M:
    """YAML file first, then flags that were given (None means 'not given')."""
    data: dict[str, Any] = {}
    source = str(yaml_path) if yaml_path else "command line"
    if yaml_path is not None:
        if not yaml_path.is_file():
            raise UserError(f"config file not found: {yaml_path}")
        try:
            data = yaml.safe_load(yaml_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{yaml_path}: not valid YAML: {' '.join(str(exc).split())}") from exc
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
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{source}: {describe_validation(exc)}") from exc


def describe_validation(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(record)"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {field}: {first['msg']}{more}"


def iter_jsonl(path: Path, limit: int | None = None):
    """(line number, object) for each non-empty line; a bad line stops with one clear error."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if limit is not None and lineno > limit:
                return
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            if not isinstance(raw, dict):
                raise UserError(f"{path}:{lineno}: record must be a JSON object")
            yield lineno, raw


def read_jsonl(path: Path, record: type[M], id_field: str = "id") -> list[M]:
    """Validate every record up front; the first bad one stops everything with one clear line."""
    items: list[M] = []
    seen: set[str] = set()
    for lineno, raw in iter_jsonl(path):
        raw.setdefault(id_field, str(lineno))
        try:
            item = record.model_validate(raw)
        except ValidationError as exc:
            raise UserError(
                f"{path}:{lineno}: record {raw.get(id_field)!r}: {describe_validation(exc)}"
            ) from exc
        key = str(getattr(item, id_field))
        if key in seen:
            raise UserError(f"{path}:{lineno}: record {key!r}: duplicate {id_field}")
        seen.add(key)
        items.append(item)
    if not items:
        raise UserError(f"{path}: no records")
    return items
