"""Teacher data for a claim extractor (the ICAT paper's recipe): topics -> entities per topic -> a
paragraph per entity -> its atomic claims, all from a teacher model; then de-duplicated,
filtered and split into chat examples (``train.jsonl``, ``validation.jsonl``) with a data card.

Runs on the framework runtime, so it resumes: topics are generated in batches (run ``topics``,
skipped when a topics file is given), every topic is one item of run ``examples`` (its entities,
paragraphs and claims recorded together), and the dataset files are rewritten from the records
at the end of every invocation.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console

from groundcover import (
    Framework,
    FrameworkOptions,
    InputFile,
    ItemContext,
    ItemResult,
    RunOutcome,
    RunPlan,
    RunRequest,
    Study,
    UserError,
    load_dir,
)
from groundcover.inputs import iter_jsonl
from groundcover.judges import bullet_list
from groundcover.runs import atomic_write_json
from groundcover.serving.files import write_atomic

from ..shared.claims import parse_claims
from .examples import TEMPLATE as CLAIMS_TEMPLATE
from .examples import chat_example

PROMPTS = load_dir(Path(__file__).parent / "prompts")
TOPICS_PER_CALL = 20
TEACHER_ROLES = {"teacher": "topics, entities, paragraphs and their claims"}


class TeacherOptions(FrameworkOptions):
    topics: InputFile | None = Field(
        None, description="topics file (JSONL 'topic' or one per line)"
    )
    n_topics: int = Field(200, ge=1, le=10_000, description="topics generated (no topics file)")
    entities: int = Field(5, ge=1, le=50, description="entities per topic")
    validation: float = Field(0.1, ge=0, lt=1, description="share held out")
    seed: int = 0
    max_paragraph_chars: int = Field(3000, ge=100)
    max_claims: int = Field(60, ge=1)
    line_max_chars: int = Field(300, ge=20, le=2000)


class Topic(BaseModel):
    id: str
    topic: str


def _list_regex(n: int, chars: int) -> str:
    return rf"(- [^\n]{{1,{min(chars, 120)}}}\n){{1,{n}}}"


def read_topics(path: Path) -> list[Topic]:
    """JSONL with "topic" (and "id"), or plain text with one topic per line."""
    raw = path.read_text(encoding="utf-8") if path.is_file() else None
    if raw is None:
        raise UserError(f"input file not found: {path}")
    if raw.lstrip().startswith("{"):
        topics = []
        for lineno, row in iter_jsonl(path):
            if not isinstance(row.get("topic"), str) or not row["topic"].strip():
                raise UserError(f"{path}:{lineno}: field topic: missing or not a string")
            topics.append(Topic(id=str(row.get("id", lineno)), topic=row["topic"].strip()))
    else:
        lines = [line.strip() for line in raw.splitlines() if line.strip()]
        topics = [Topic(id=str(n), topic=t) for n, t in enumerate(lines, 1)]
    if not topics:
        raise UserError(f"{path}: no topics")
    return topics


class TopicBatches(Framework[TeacherOptions, Topic]):
    """Run ``topics``: item k asks the teacher for a batch of topics."""

    name = "finetune-topics"
    Options = TeacherOptions
    prompts = PROMPTS
    roles = TEACHER_ROLES
    stage_roles = {"*": "teacher"}

    async def solve(self, item: Topic, ctx: ItemContext) -> ItemResult:
        n = min(TOPICS_PER_CALL, ctx.options.n_topics)
        parsed = await ctx.ask(
            PROMPTS["teacher_topics"],
            "topics",
            bullet_list,
            "one '- <topic>' per line",
            {"n": n, "avoid": []},
            regex=_list_regex(n, ctx.options.line_max_chars),
            temperature=0.9,
            seed=int(item.id),
        )
        ctx.details["topics"] = parsed.value
        return ctx.result("ok", None, f"{len(parsed.value)} topics")


class TopicExamples(Framework[TeacherOptions, Topic]):
    """Run ``examples``: per topic, entities, a paragraph each, and the paragraph's claims."""

    name = "finetune-examples"
    Options = TeacherOptions
    prompts = PROMPTS | {"extract_claims": CLAIMS_TEMPLATE}
    roles = TEACHER_ROLES
    stage_roles = {"*": "teacher"}

    async def solve(self, item: Topic, ctx: ItemContext) -> ItemResult:
        options: TeacherOptions = ctx.options
        entities = await ctx.ask(
            PROMPTS["teacher_entities"],
            "entities",
            bullet_list,
            "one '- <entity>' per line",
            {"n": options.entities, "topic": item.topic},
            regex=_list_regex(options.entities, options.line_max_chars),
        )
        chosen = entities.value[: options.entities]
        rng = random.Random(f"{options.seed}:{item.id}")
        lengths = [rng.choice([2, 3, 4, 6, 8]) for _ in chosen]  # variable-length paragraphs
        pending = zip(chosen, lengths, strict=True)
        examples = await asyncio.gather(
            *(self._example(ctx, item.topic, entity, n) for entity, n in pending)
        )
        ctx.details |= {"topic": item.topic, "examples": examples}
        return ctx.result("ok", None, f"{len(examples)} paragraphs with their claims")

    async def _example(self, ctx: ItemContext, topic: str, entity: str, sentences: int) -> dict:
        paragraph = await ctx.ask(
            PROMPTS["teacher_paragraph"],
            "paragraph",
            lambda t: t.strip(),
            "the paragraph",
            {"topic": topic, "entity": entity, "sentences": sentences},
        )
        chars = ctx.options.line_max_chars
        claims = await ctx.ask(
            CLAIMS_TEMPLATE,
            "claims",
            parse_claims,
            "one '- <claim>' per line, or None",
            {"response": paragraph.value},
            regex=rf"((- [^\n]{{1,{chars}}}\n){{1,{ctx.options.max_claims}}}|None\n?)",
        )
        return {"entity": entity, "paragraph": paragraph.value, "claims": claims.value}


class TeacherData(Study[TeacherOptions]):
    name = "finetune-data"
    Options = TeacherOptions
    roles = TEACHER_ROLES

    def load(self, options: TeacherOptions) -> list[Topic]:
        if options.topics is not None:
            return read_topics(options.topics)[: options.n_topics]
        batches = -(-options.n_topics // TOPICS_PER_CALL)
        return [Topic(id=str(k), topic=f"batch {k}") for k in range(1, batches + 1)]

    def plan(self, request: RunRequest, root: Path) -> list[RunPlan]:
        options: TeacherOptions = request.options
        if options.topics is not None:
            return [RunPlan("examples", "teacher-examples", options, framework=EXAMPLES)]
        return [
            RunPlan("topics", "teacher-topics", options, framework=TOPIC_BATCHES),
            RunPlan(
                "examples",
                "teacher-examples",
                options,
                framework=EXAMPLES,
                items=lambda outcomes: generated_topics(outcomes["topics"], options),
            ),
        ]

    def combine(self, outcomes: dict[str, RunOutcome], options: TeacherOptions) -> dict:
        from groundcover.runs import MANIFEST, read_manifest

        outcome = outcomes["examples"]  # in <root>/examples: the dataset goes to <root>
        teacher = read_manifest(outcome.dir / MANIFEST).models
        return write_dataset(outcome.dir.parent, outcome.results, options, teacher)

    def render_combined(self, combined: dict[str, Any], console: Console) -> None:
        counts = combined["counts"]
        console.print(
            f"dataset: {counts['train']} train, {counts['validation']} validation "
            f"({counts['generated']} generated, {counts['duplicates']} duplicates, "
            f"{counts['filtered']} filtered) in {combined['dir']}"
        )


def generated_topics(outcome: RunOutcome, options: TeacherOptions) -> list[Topic]:
    seen: dict[str, None] = {}
    for record in outcome.results:
        for topic in record.details.get("topics", []):
            seen.setdefault(topic.strip(), None)
    return [Topic(id=str(n), topic=t) for n, t in enumerate(seen, 1)][: options.n_topics]


def write_dataset(
    root: Path, records: Sequence[ItemResult], options: TeacherOptions, teacher: Any = None
) -> dict:
    """De-duplicate (same paragraph), filter (no claims, overlong paragraph, too many claims),
    split by a seeded hash of the paragraph, and write the files and the card atomically."""
    seen: set[str] = set()
    counts = {
        "generated": 0,
        "duplicates": 0,
        "filtered": 0,
        "train": 0,
        "validation": 0,
        "topics_ok": 0,
        "topics_failed": 0,
    }
    split: dict[str, list[str]] = {"train": [], "validation": []}
    for record in records:
        counts["topics_ok" if record.status == "ok" else "topics_failed"] += 1
        for example in record.details.get("examples", []):
            counts["generated"] += 1
            key = " ".join(example["paragraph"].split()).lower()
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            if (
                not example["claims"]
                or len(example["paragraph"]) > options.max_paragraph_chars
                or len(example["claims"]) > options.max_claims
            ):
                counts["filtered"] += 1
                continue
            digest = hashlib.sha256(f"{options.seed}:{key}".encode()).digest()
            part = "validation" if digest[0] / 256 < options.validation else "train"
            row = chat_example(
                example["paragraph"],
                example["claims"],
                topic=record.details.get("topic"),
                entity=example["entity"],
                source=record.id,
            )
            split[part].append(json.dumps(row, ensure_ascii=False))
    files = {}
    for part, rows in split.items():
        counts[part] = len(rows)
        path = root / f"{part}.jsonl"
        write_atomic(path, "".join(r + "\n" for r in rows), within=root)
        files[part] = {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    card = {
        "dir": str(root),
        "teacher": teacher,
        "counts": counts,
        "files": files,
        "prompts": {n: t.id for n, t in (PROMPTS | {"claims": CLAIMS_TEMPLATE}).items()},
        "options": options.model_dump(mode="json"),
    }
    atomic_write_json(root / "data_card.json", card, within=root)
    return card


TOPIC_BATCHES = TopicBatches()
EXAMPLES = TopicExamples()
TEACHER_DATA = TeacherData()
