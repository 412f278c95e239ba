"""Judging: how a panel's answers combine (``Vote``, ``Average``, ``Cover``), human labels
beside a run's decision (``HumanLabel``), the recorded judgements the reliability audits ask
again (``Judgement``, ``SwapPair``), paraphrases of a judging prompt (``load_variants``) and
reading a model's output (``ParseError``, ``bullet_list``), what a stage's verdict is to a judge
cascade (``verdict_of``: a label, a rating, a set, or none; ``cover_label``: a set as its label)
and the judgement a cascade abstained on (``JudgementAbstained``: a stage whose verdict is one
metric among several may record it as such and keep the rest)."""

from __future__ import annotations

from .pipelines.runtime.contract.cascade import JudgementAbstained
from .pipelines.runtime.contract.panels import (
    Average,
    Cover,
    HumanLabel,
    Vote,
    cover_label,
    verdict_of,
)
from .pipelines.runtime.contract.results import Judgement, SwapPair
from .serving.parsing import ParseError, bullet_list
from .serving.templates import load_variants

__all__ = [
    "Average",
    "Cover",
    "HumanLabel",
    "Judgement",
    "JudgementAbstained",
    "ParseError",
    "SwapPair",
    "Vote",
    "bullet_list",
    "cover_label",
    "load_variants",
    "verdict_of",
]
