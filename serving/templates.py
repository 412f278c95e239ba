"""Versioned prompt templates kept as YAML files next to the code that uses them.

A template has ``name``, ``version``, optional ``system`` and a ``user`` Jinja body. Its id,
``name@vN#hash``, goes into cache keys and run manifests, so editing a prompt (even without bumping
its version) never serves a stale cached answer. A paraphrase of a judging prompt (the same
values, output format and scale in other words) names its ``variant`` and lives under the
prompts' ``variants/`` folder (``load_variants``); its id is ``name~variant@vN#hash``.
"""

from __future__ import annotations

import functools
import hashlib
from functools import cached_property
from pathlib import Path

import jinja2
import yaml
from pydantic import BaseModel

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)


@functools.lru_cache(maxsize=1024)
def compiled(source: str) -> jinja2.Template:
    """A template body compiled once: compiling took most of a trivial item's time in a run
    (scripts/benchmarks/bench_runner.py's profile); rendering a compiled template is thread-safe."""
    return _ENV.from_string(source)


class PromptTemplate(BaseModel):
    """A versioned prompt: ``name``, ``version``, an optional ``system`` and a ``user`` Jinja
    body (undefined values are errors), ``variant`` for a paraphrase. ``messages(**values)``
    renders the chat messages; ``id`` (``name@vN#hash``) enters cache keys and manifests."""

    name: str
    version: int
    user: str
    system: str | None = None
    variant: str | None = None  # a paraphrase's label (None: the prompt a run asks)
    path: str | None = None

    @classmethod
    def load(cls, path: Path | str) -> PromptTemplate:
        data = yaml.safe_load(Path(path).read_text())
        return cls(**data, path=str(path))

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.system}\x00{self.user}".encode()).hexdigest()[:12]

    @property
    def id(self) -> str:
        name = f"{self.name}~{self.variant}" if self.variant else self.name
        return f"{name}@v{self.version}#{self.digest}"

    def messages(self, **values) -> list[dict[str, str]]:
        out = []
        if self.system:
            out.append({"role": "system", "content": compiled(self.system).render(**values)})
        out.append({"role": "user", "content": compiled(self.user).render(**values).strip()})
        return out

    def text(self) -> str:
        parts = [f"# {self.id}"]
        if self.system:
            parts += ["## system", self.system.rstrip()]
        parts += ["## user", self.user.rstrip()]
        return "\n".join(parts)


def load_dir(folder: Path | str) -> dict[str, PromptTemplate]:
    """All templates in a folder, by name."""
    return {t.name: t for t in map(PromptTemplate.load, sorted(Path(folder).glob("*.yaml")))}


def load_variants(folder: Path | str) -> dict[str, tuple[PromptTemplate, ...]]:
    """The paraphrases under ``folder/variants``, by the name of the prompt each rewords."""
    found: dict[str, list[PromptTemplate]] = {}
    for template in map(PromptTemplate.load, sorted((Path(folder) / "variants").glob("*.yaml"))):
        if not template.variant:
            raise ValueError(f"{template.path}: a paraphrase names its variant")
        found.setdefault(template.name, []).append(template)
    return {name: tuple(found[name]) for name in sorted(found)}


REASK = PromptTemplate.load(Path(__file__).parent / "prompts" / "reask.yaml")
