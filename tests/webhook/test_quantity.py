"""Kubernetes quantities are read exactly, in every form the API server writes."""

from __future__ import annotations

from fractions import Fraction

import pytest

from webhook.quantity import QuantityError, parse_quantity, parse_whole_quantity


@pytest.mark.parametrize(("text", "value"), [
    ("40", 40), ("+7", 7), ("-3", -3), ("1k", 1000), ("2M", 2_000_000), ("1E", 10**18),
    ("80Gi", 80 << 30), ("1Ki", 1024), ("1e3", 1000), ("1E3", 1000), ("5e-1", Fraction(1, 2)),
    ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)), (".5", Fraction(1, 2)), ("2.", 2),
    (30, 30), (2.5, Fraction(5, 2)),
])
def test_quantities_parse_to_their_exact_value(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1 k", "1KB", "0x10", "1e", "--1", "1.2.3",
                                  "1" * 65, None, True, [1], {"a": 1}])
def test_anything_else_is_not_a_quantity(text: object) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text)


def test_huge_exponents_are_refused_without_computing_them() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e999999999")


@pytest.mark.parametrize("text", ["500m", "1.5", "5e-1"])
def test_whole_quantities_refuse_fractions(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a whole number"):
        parse_whole_quantity(text)


def test_whole_quantities_accept_whole_values_in_any_form() -> None:
    assert [parse_whole_quantity(t) for t in ("30", "1k", "1e2", "2000m", 7)] == [30, 1000, 100,
                                                                                 2, 7]
