"""Comparing physical quantities in any units with pint — as a model tool and deterministically.

Only "<number> <unit>" strings are accepted: the number is read by a regular expression and the
unit by pint's unit parser, so no arithmetic or other expression is ever evaluated.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

import pint
from pydantic import BaseModel, ConfigDict, Field

from groundcover.models import Tool

_QUANTITY = re.compile(
    r"^\s*(?:about|approximately|approx\.|around|~)?\s*"
    r"(?P<number>[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"\s*(?P<unit>[A-Za-z°µ%][A-Za-z°µ%/^ .\-²³0-9]{0,40}?)\s*\.?\s*$"
)
# Quoted conversions are rounded ("500 metres (1,600 ft)"): two values are equal when the ranges
# their stated precision allows overlap (1,600 -> +/-50; 25.4 -> +/-0.05).


@lru_cache(maxsize=1)
def registry() -> pint.UnitRegistry:
    return pint.UnitRegistry()


class QuantityError(ValueError):
    pass


def stated_precision(number: str) -> float:
    """Half the place value of the last digit written: '1605' -> 0.5, '2.50' -> 0.005."""
    mantissa, _, exponent = number.replace(",", "").lstrip("+-").lower().partition("e")
    shift = int(exponent or 0)
    if "." in mantissa:
        return 0.5 * 10.0 ** (shift - len(mantissa.split(".")[1]))
    zeros = len(mantissa) - len(mantissa.rstrip("0")) if mantissa.strip("0") else 0
    zeros = zeros if zeros >= 2 else 0  # '4810' reads as exact, '1600' as possibly rounded
    half = 0.5 * 10.0 ** (shift + zeros)
    if zeros:  # rounded values may be off by half a place, but never more than 2.5%
        half = min(half, 0.025 * float(mantissa) * 10.0**shift)
    return half


def parse_quantity(text: str) -> tuple[pint.Quantity, pint.Quantity]:
    """The quantity and the half-width of its stated precision, in the same unit."""
    match = _QUANTITY.match(text or "")
    if not match:
        raise QuantityError(f"not a '<number> <unit>' quantity: {text[:40]!r}")
    number = float(match.group("number").replace(",", ""))
    if not math.isfinite(number):
        raise QuantityError(f"not a finite number: {match.group('number')[:20]!r}")
    unit_text = match.group("unit").strip().replace("²", "**2").replace("³", "**3")
    unit_text = {"%": "percent", "°C": "degC", "°F": "degF"}.get(unit_text, unit_text)
    try:
        unit = registry().parse_units(unit_text)
    except (pint.errors.PintError, AttributeError, ValueError, TypeError, SyntaxError) as exc:
        raise QuantityError(f"unknown unit {unit_text!r}") from exc
    quantity = registry().Quantity(number, unit)
    return quantity, registry().Quantity(stated_precision(match.group("number")), unit)


RELATIVE_TOLERANCE = 0.01  # the reference's tool: equal within 1% ...
CALENDAR_TOLERANCE = 1e-5  # ... or 1e-5 for years, months and days
CALENDAR_UNITS = {"year", "month", "day"}


def compare_quantities(first: str, second: str, relative: bool = False) -> dict:
    """Equal / different / incompatible, with both values in the first one's unit. Equal means
    within the stated precision of both (spec), or ``relative``ly close as in the reference
    (paper: 1% of the larger magnitude, 1e-5 for years, months and days)."""
    (a, a_tol), (b, b_tol) = parse_quantity(first), parse_quantity(second)
    if a.dimensionality != b.dimensionality:
        return {"comparable": False, "reason": f"{a.dimensionality} vs {b.dimensionality}"}
    b_in_a = b.to(a.units).magnitude
    if relative:
        calendar = {str(a.units), str(b.units)} & CALENDAR_UNITS
        rate = CALENDAR_TOLERANCE if calendar else RELATIVE_TOLERANCE
        slack = rate * max(abs(a.magnitude), abs(b_in_a))
        equal = abs(a.magnitude - b_in_a) <= slack
    else:
        # Convert b's upper bound as a point, which also works for offset units (degC, degF).
        upper = registry().Quantity(b.magnitude + b_tol.magnitude, b.units).to(a.units).magnitude
        slack = a_tol.magnitude + abs(upper - b_in_a)
        equal = abs(a.magnitude - b_in_a) < slack * (1 - 1e-9)  # ranges that only touch differ
    return {
        "comparable": True,
        "first": f"{a.magnitude:g} {a.units:~}",
        "second_in_first_units": f"{b_in_a:g} {a.units:~}",
        "equal": equal,
        "tolerance": f"{slack:g} {a.units:~}",
        "first_is_larger": a.magnitude > b_in_a and not equal,
    }


def deterministic_relation(first: str, second: str) -> str | None:
    """The relation when both answers are compatible quantities, else None (ask the model)."""
    try:
        outcome = compare_quantities(first, second)
    except (QuantityError, pint.errors.PintError):
        return None
    return relation_of(outcome)


def relation_of(outcome: dict) -> str | None:
    """Equal values are equivalent; different values of one quantity are mutually exclusive
    answers; incomparable ones have no relation here (None)."""
    if not outcome.get("comparable"):
        return None
    return "equivalent" if outcome["equal"] else "contradictory"


class QuantityPair(BaseModel):
    model_config = ConfigDict(extra="forbid")

    first: str = Field(max_length=60, description="first quantity, e.g. '8,000 nmi'")
    second: str = Field(max_length=60, description="second quantity, e.g. '14,800 km'")


def units_tool(relative: bool = False) -> Tool:
    """The comparator's tool; ``relative``: the reference's tolerances (paper protocol)."""
    equal_within = "1%" if relative else "their stated precision"
    return Tool(
        name="compare_quantities",
        description=(
            "Compare two physical quantities given as '<number> <unit>' in any units (e.g. "
            f"'8000 nmi' and '14800 km'); says whether they are equal within {equal_within}."
        ),
        parameters=QuantityPair,
        function=lambda args: compare_quantities(args.first, args.second, relative),
    )


UNITS_TOOL = units_tool()
