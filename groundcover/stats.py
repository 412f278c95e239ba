"""Metric helpers shared by the frameworks' tables and ``compare``: BCa intervals, paired tests,
precision / recall / F1."""

from __future__ import annotations

from .pipelines.runtime.stats import Interval, bca_interval, paired_test, precision_recall_f1

__all__ = [
    "Interval",
    "bca_interval",
    "paired_test",
    "precision_recall_f1",
]
