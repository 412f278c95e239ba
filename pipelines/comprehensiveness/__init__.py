"""Comprehensiveness metrics (Dejl et al.): NLI-based, Q&A-based and end-to-end."""

from pipelines.comprehensiveness.common import ComprehensivenessConfig, Item
from pipelines.comprehensiveness.task import evaluate_item

__all__ = ["ComprehensivenessConfig", "Item", "evaluate_item"]
