"""The models a framework asks: the evaluator client every stage asks through (``EvalClient``,
``Tool`` for a tool a model may call), an evaluator's configuration (``EvaluatorConfig``) and
the models of roles (``RoleSpec``, ``role_evaluator``, ``responder_config``, ``model_name``)."""

from __future__ import annotations

from .pipelines.runtime.contract.config import EvaluatorConfig
from .pipelines.runtime.contract.roles import RoleSpec, model_name, responder_config, role_evaluator
from .serving.client import EvalClient, Tool

__all__ = [
    "EvalClient",
    "EvaluatorConfig",
    "RoleSpec",
    "Tool",
    "model_name",
    "responder_config",
    "role_evaluator",
]
