"""Exact parsing of Kubernetes resource quantities ("40", "1k", "500m", "80Gi")."""

from __future__ import annotations

import re
from fractions import Fraction

from webhook.errors import WebhookError

_PATTERN = re.compile(
    r"([+-]?(?:\d+\.?\d*|\.\d+))"  # number
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei)|[eE]([+-]?\d+)|(m|k|M|G|T|P|E))?"  # binary | exponent | decimal
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
# Kubernetes itself caps quantities far below these; the caps keep a hostile
# value ("1e999999") from costing the server time.
_MAX_TEXT = 64
_MAX_EXPONENT = 30


class QuantityError(WebhookError, ValueError):
    """The value is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Return the exact value of a quantity given as a string or a JSON number."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) < 19:
        return Fraction(int(value))  # the common case, without the regex
    if isinstance(value, float):
        value = repr(value)
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise QuantityError(f"{value!r} is not a quantity")
    match = _PATTERN.fullmatch(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity")
    number, binary, exponent, decimal = match.groups()
    result = Fraction(number)
    if binary:
        return result * 1024 ** _BINARY[binary]
    power = int(exponent) if exponent else 3 * _DECIMAL.get(decimal or "", 0)
    if abs(power) > _MAX_EXPONENT:
        raise QuantityError(f"{value!r} is out of range")
    return result * Fraction(10) ** power


def parse_whole_quantity(value: object) -> int:
    """Return a quantity that must be a whole number (extended resources are)."""
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) < 19:
        return int(value)  # the common case, without Fraction
    result = parse_quantity(value)
    if result.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number")
    return int(result)
