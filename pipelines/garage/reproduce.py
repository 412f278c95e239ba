"""Reproducing GaRAGe's Tables 2-4: every answering model's eligibility, factuality, uRAF, RAF,
deflection rates and attribution P/R/F1 (percentages, as the paper prints them), its values beside.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from groundcover.grids import ModelGrid, Published, published_row
from groundcover.inputs import NotContent

from .framework import GARAGE, GarageOptions

COLUMNS = (
    "eligibility",
    "unadjusted_factuality",
    "factuality",
    "uRAF",
    "RAF",
    "true_positive",
    "false_positive",
    "precision",
    "recall",
    "f1",
)
# Tables 2, 3 and 4 of the paper (percent), by model name fragment (all words must occur).
PAPER_TABLES: Published = {
    "": {
        "haiku": (79.37, 51.83, 48.37, 40.00, 36.90, 15.2, 0.4, 49.9, 71.9, 58.9),
        "sonnet": (86.07, 68.48, 64.67, 51.75, 48.91, 25.3, 1.4, 51.8, 67.5, 58.6),
        "gemini-1.5": (84.88, 81.07, 70.50, 67.78, 59.43, 27.2, 2.3, 54.7, 56.3, 55.5),
        "gpt-4o": (92.47, 62.91, 59.30, 56.18, 52.88, 31.1, 2.3, 57.9, 59.0, 58.4),
        "nova-micro": (90.97, 48.83, 45.02, 39.94, 37.16, 7.0, 0.3, 48.2, 75.8, 58.9),
        "nova-lite": (80.15, 61.06, 49.25, 55.67, 45.97, 7.5, 1.4, 50.0, 46.4, 48.1),
        "nova-pro": (87.77, 74.47, 66.63, 68.29, 60.67, 18.0, 0.8, 56.9, 49.6, 53.0),
        "mixtral": (82.72, 47.08, 42.96, 37.31, 34.12, 9.4, 3.3, 46.3, 56.3, 51.0),
        "mistral": (85.30, 48.01, 43.32, 38.14, 34.32, 5.2, 0.8, 44.4, 60.0, 51.0),
        "qwen 14b": (85.80, 68.20, 59.80, 59.20, 52.70, 17.1, 1.1, 55.2, 43.6, 48.7),
        "qwen 32b": (90.50, 66.10, 61.00, 57.70, 52.90, 21.5, 1.2, 55.2, 47.0, 50.8),
    }
}


def _percent(value: Any) -> float | None:
    return None if value is None else 100 * value


class ReproduceGarageOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: Annotated[
        list[str], NotContent("each becomes a role's model, known by its revision")
    ] = Field(min_length=1, description="answering MODEL or MODEL@URL per row")
    garage: GarageOptions = Field(default_factory=GarageOptions)


class ReproduceGarage(ModelGrid[ReproduceGarageOptions]):
    name = "reproduce-garage"
    paper_judges_without_reasoning = True  # the paper judged with GPT-4o
    Options = ReproduceGarageOptions
    roles = {"judge": "every judging stage; the answering models are --models"}
    framework = GARAGE
    field = "garage"
    columns = ("eligibility", "factuality", "uRAF", "RAF", "true_positive", "false_positive", "f1")
    title = "GaRAGe Tables 2-4 (percent)"

    def flat(self, tables: dict[str, Any] | None) -> dict[str, float | None]:
        if not tables:
            return dict.fromkeys(COLUMNS)
        t2, t3, t4 = tables["table2"], tables["table3"], tables["table4"]
        row = {k: _percent(t2.get(k)) for k in COLUMNS[:5]}
        row["true_positive"] = _percent(t3.get("true_positive_rate"))
        row["false_positive"] = _percent(t3.get("false_positive_rate"))
        return row | {k: _percent(t4.get(k)) for k in ("precision", "recall", "f1")}

    def paper(self, model: str, run: str) -> dict[str, float] | None:
        return published_row(model, run, PAPER_TABLES, COLUMNS)


REPRODUCE_GARAGE = ReproduceGarage()
