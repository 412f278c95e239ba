import pytest

from groundcover.pipelines.comprehensiveness.units import (
    UNITS_TOOL,
    QuantityError,
    compare_quantities,
    deterministic_relation,
    parse_quantity,
    stated_precision,
)


@pytest.mark.parametrize(
    ("a", "b", "relation"),
    [
        ("8,000 nmi", "14,800 km", "equivalent"),  # rounded conversions agree
        ("500 m", "1600 ft", "equivalent"),
        ("829.8 m", "2,722 ft", "equivalent"),
        ("100 degC", "212 degF", "equivalent"),  # offset units
        ("4,806 m", "4,810 m", "contradictory"),  # '4810' is read as exact
        ("25.4 %", "25.5 %", "contradictory"),  # ranges that only touch differ
        ("3 kg", "5 m", None),  # incompatible dimensions: the model decides
        ("over 23%", "25.4 %", None),  # not a plain quantity
        ("Paris", "Lyon", None),
    ],
)
def test_deterministic_relation(a, b, relation):
    assert deterministic_relation(a, b) == relation


def test_stated_precision():
    assert stated_precision("1605") == 0.5
    assert stated_precision("2.50") == pytest.approx(0.005)
    assert stated_precision("1,600") == pytest.approx(40)  # 50 capped at 2.5%
    assert stated_precision("14800") == 50


@pytest.mark.parametrize(
    "text", ['__import__("os").system("x") m', "2**10**10 m", "1e999999 m", "3 meter**meter", ""]
)
def test_never_evaluates_expressions(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_tool_validates_and_reports_errors_as_data():
    assert '"equal": true' in UNITS_TOOL.call({"first": "1 km", "second": "1000 m"})
    assert "QuantityError" in UNITS_TOOL.call({"first": "2**99 m", "second": "1 m"})
    assert "ValidationError" in UNITS_TOOL.call({"first": "1 m"})
    assert compare_quantities("3 kg", "5 m")["comparable"] is False
