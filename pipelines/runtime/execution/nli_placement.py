"""Where a framework's NLI cross-encoder runs: here, on a Ray Serve app, or on Ray actors of its
own.

One set of options for every framework that scores (premise, hypothesis) pairs with a
cross-encoder (comprehensiveness ``--nli-backend cross-encoder``, ICAT grounding), and one place
that opens the scorer. Every placement gives the local scorer's labels and probabilities.

- nothing: ``retrieval.nli.NliScorer`` in the run's process;
- ``--nli-replicas N``: a Serve app of N replicas this run deploys and deletes
  (``retrieval.nli_serve``); ``--nli-app NAME``: a running app (``groundcover serve --nli``);
- ``--nli-replicas N --nli-bulk``: N plain Ray actors of the run's own, without Serve, that load
  the model once and take whole planned batches (``retrieval.nli_ray``).

The cluster is the evaluator's ``--ray-address`` (none: a local Ray of the run's own).
"""

from __future__ import annotations

import json
from typing import Any, Self

from pydantic import Field, model_validator

from ..contract.config import Strict

# where NLI runs changes no number: not part of a run's identity
PLACEMENT_FIELDS = frozenset({"nli_replicas", "nli_app", "nli_bulk", "nli_resources", "nli_wait"})


class NliPlacement(Strict):
    """Where a framework's NLI cross-encoder runs, as options: here (the default), on a Ray
    Serve app of ``nli_replicas`` (or the running ``nli_app``), or on plain Ray actors
    (``nli_bulk``), with their resources and how long to wait for them."""

    nli_replicas: int = Field(0, ge=0, le=4096, description="NLI on a Serve app of N replicas")
    nli_app: str | None = Field(None, description="NLI on this running Serve app")
    nli_bulk: bool = Field(False, description="NLI replicas as plain Ray actors (no Serve)")
    nli_resources: str | None = Field(None, description="Ray resources per NLI replica (JSON)")
    nli_wait: float = Field(
        120.0, gt=0, le=86_400, description="seconds to wait for a live NLI replica, then stop"
    )

    @model_validator(mode="before")
    @classmethod
    def _actors_alias(cls, data: Any) -> Any:
        """``nli_actors: N`` (before Serve) meant N Ray actors: replicas N, bulk."""
        if isinstance(data, dict) and "nli_actors" in data:
            data = dict(data)
            actors = data.pop("nli_actors")
            if actors:
                data.setdefault("nli_replicas", actors)
                data.setdefault("nli_bulk", True)
        return data

    @model_validator(mode="after")
    def _placement(self) -> NliPlacement:
        if self.nli_app and (self.nli_replicas or self.nli_bulk or self.nli_resources):
            raise ValueError(
                "nli_app: a running app has its replicas; drop nli_replicas, "
                "nli_bulk and nli_resources"
            )
        if self.nli_bulk and not self.nli_replicas:
            raise ValueError("nli_bulk: how many Ray actors? set nli_replicas")
        if self.nli_resources and not self.nli_replicas:
            raise ValueError("nli_resources: for the replicas nli_replicas deploys")
        if self.nli_resources and self.nli_bulk:
            raise ValueError("nli_resources: pins Serve replicas, not the bulk actors (nli_bulk)")
        parse_resources(self.nli_resources)  # ValueError names the field
        return self

    @property
    def nli_on_ray(self) -> bool:
        return bool(self.nli_replicas or self.nli_app)

    def cross_encoder(self) -> tuple[str, str, int] | None:
        """(model, device, batch size) of the cross-encoder these options run, or None when
        they run none (each framework says where it keeps them)."""
        return None

    def serve_app_settings(self) -> dict[str, Any] | None:
        """The Serve app a scorer opened from these options would deploy for itself
        (``nli_replicas`` without ``nli_bulk`` or ``nli_app``), or None."""
        used = self.cross_encoder()
        if used is None or not self.nli_replicas or self.nli_bulk or self.nli_app:
            return None
        from ....retrieval.nli_serve import app_settings

        model, device, batch_size = used
        return app_settings(
            model,
            replicas=self.nli_replicas,
            device=device,
            batch_size=batch_size,
            resources=parse_resources(self.nli_resources),
        )

    def on_app(self, name: str) -> Self:
        """These options with the cross-encoder on the running app ``name``: the drivers of one
        run share the app their command deployed instead of deploying one each."""
        return self.model_copy(update={"nli_app": name, "nli_replicas": 0, "nli_resources": None})

    def open_nli(self, model: str, device: str, batch_size: int, address: str | None) -> Any:
        """The scorer this placement asks for (``retrieval.nli.PairScorer``)."""
        from ....retrieval.nli import NliScorer

        if self.nli_app or (self.nli_replicas and not self.nli_bulk):
            from ....retrieval.nli_serve import ServeNliScorer

            return ServeNliScorer(
                model,
                replicas=max(1, self.nli_replicas),
                app=self.nli_app,
                device=device,
                batch_size=batch_size,
                address=address,
                resources=parse_resources(self.nli_resources),
                retry_for=self.nli_wait,
            )
        if self.nli_replicas:
            from ....retrieval.nli_ray import RayNliScorer

            return RayNliScorer(
                model,
                actors=self.nli_replicas,
                device=device,
                batch_size=batch_size,
                address=address,
            )
        return NliScorer(model, device=device, batch_size=batch_size)


def parse_resources(text: str | None) -> dict[str, float] | None:
    """``'{"nli": 1}'``: a JSON object of Ray resource -> amount per replica."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"resources: not a JSON object ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and v > 0 for k, v in value.items()
    ):
        raise ValueError(f'resources: want {{"NAME": AMOUNT > 0, ...}}, got {text!r}')
    return {k: float(v) for k, v in value.items()}


def placement_of(scorer: Any) -> dict[str, Any] | None:
    """What a Ray scorer reports about where it ran, for the run's summary."""
    report = getattr(scorer, "placement", None)
    return report() if callable(report) else None
