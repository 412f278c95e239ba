"""Reproducing FanOutQA's Table 1: every answering model x setting, our columns beside the paper's.

Each (model, setting) is an ordinary FanOutQA run under ``<root>/<model>/<setting>/``, so the grid
resumes cell by cell. The paper's Table 1 is on the test split (scored by the authors'
leaderboard); the default data here is the dev split the ``fanoutqa`` package ships, so the two
columns compare a model across splits, and the table says so.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from groundcover.grids import ModelGrid, Published, published_row
from groundcover.inputs import NotContent

from .framework import FANOUTQA, TABLE_COLUMNS, FanoutOptions

# Paper Table 1 (test split): setting -> model name fragment -> the TABLE_COLUMNS values. Longer
# fragments first: "gpt-4-turbo" must win over "gpt-4".
PAPER_TABLE1: Published = {
    "closed-book": {
        "gpt-4-turbo": (0.460, 0.101, 0.482, 0.290, 0.409, 0.493, 0.199),
        "gpt-3.5-turbo": (0.398, 0.058, 0.401, 0.227, 0.342, 0.455, 0.145),
        "gpt-4": (0.355, 0.066, 0.313, 0.177, 0.267, 0.419, 0.149),
        "llama-2": (0.440, 0.058, 0.285, 0.149, 0.238, 0.441, 0.120),
        "mistral-7b": (0.427, 0.055, 0.260, 0.123, 0.212, 0.449, 0.102),
        "mixtral-8x7b": (0.470, 0.081, 0.302, 0.158, 0.254, 0.466, 0.186),
        "claude-2.1": (0.341, 0.041, 0.412, 0.208, 0.344, 0.426, 0.110),
    },
    "open-book": {
        "gpt-4-turbo": (0.470, 0.109, 0.356, 0.207, 0.314, 0.487, 0.262),
        "gpt-3.5-turbo": (0.155, 0.032, 0.114, 0.051, 0.099, 0.338, 0.076),
        "gpt-4": (0.315, 0.057, 0.208, 0.106, 0.183, 0.427, 0.164),
        "llama-2": (0.390, 0.064, 0.157, 0.075, 0.131, 0.443, 0.108),
        "mixtral-8x7b": (0.396, 0.055, 0.173, 0.078, 0.147, 0.449, 0.148),
        "claude-2.1": (0.471, 0.086, 0.295, 0.157, 0.253, 0.485, 0.218),
    },
    "evidence": {
        "gpt-4-turbo": (0.628, 0.192, 0.614, 0.395, 0.523, 0.581, 0.413),
        "gpt-3.5-turbo": (0.517, 0.102, 0.455, 0.252, 0.358, 0.497, 0.243),
        "gpt-4": (0.546, 0.144, 0.500, 0.301, 0.413, 0.530, 0.304),
        "llama-2": (0.514, 0.077, 0.376, 0.206, 0.304, 0.472, 0.162),
        "mistral-7b": (0.540, 0.088, 0.330, 0.172, 0.264, 0.475, 0.202),
        "mixtral-8x7b": (0.576, 0.135, 0.409, 0.231, 0.343, 0.509, 0.283),
        "claude-2.1": (0.653, 0.215, 0.423, 0.262, 0.354, 0.508, 0.470),
    },
}


class ReproduceFanoutOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: Annotated[
        list[str], NotContent("each becomes a role's model, known by its revision")
    ] = Field(min_length=1, description="answering MODEL or MODEL@URL per row")
    fanoutqa: FanoutOptions = Field(default_factory=FanoutOptions)


class ReproduceFanout(ModelGrid[ReproduceFanoutOptions]):
    name = "reproduce-fanoutqa"
    paper_judges_without_reasoning = True  # the paper judged with GPT-4
    Options = ReproduceFanoutOptions
    roles = {"judge": "the A-F judge (--judge); the answering models are --models"}
    framework = FANOUTQA
    field = "fanoutqa"
    columns = ("loose", "strict", "rougeL", "bleurt", "gpt_judge")
    title = "FanOutQA Table 1 (the paper's: test split, authors' leaderboard)"

    def flat(self, tables: dict[str, Any] | None) -> dict[str, float | None]:
        return {c: (tables or {}).get(c) for c in TABLE_COLUMNS}

    def paper(self, model: str, run: str) -> dict[str, float] | None:
        return published_row(model, run, PAPER_TABLE1, tuple(TABLE_COLUMNS))


REPRODUCE_FANOUTQA = ReproduceFanout()
