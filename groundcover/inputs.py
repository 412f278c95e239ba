"""What a framework reads, and how its options name it: option fields that are inputs known by
content (``InputFile``, ``InputDir``, ``IndexDir``, ``ModelName``; ``NotContent`` for a field that
is not, ``Content`` for a path of another kind), answers made elsewhere (``AnswerFile``,
``GivenAnswers``), record ids, strict models and the JSON Lines readers whose errors name file,
record and field."""

from __future__ import annotations

from .pipelines.runtime.contract.answers import AnswerFile, GivenAnswers
from .pipelines.runtime.contract.config import RecordId, Strict
from .pipelines.runtime.contract.readers import (
    describe_validation,
    iter_jsonl,
    read_jsonl,
    read_text,
)
from .pipelines.runtime.store.provenance import (
    Content,
    IndexDir,
    InputDir,
    InputFile,
    ModelName,
    NotContent,
)

__all__ = [
    "AnswerFile",
    "Content",
    "GivenAnswers",
    "IndexDir",
    "InputDir",
    "InputFile",
    "ModelName",
    "NotContent",
    "RecordId",
    "Strict",
    "describe_validation",
    "iter_jsonl",
    "read_jsonl",
    "read_text",
]
