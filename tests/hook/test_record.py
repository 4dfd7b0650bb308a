"""The hook's value types behave as the named tuples they replace: built, compared, immutable."""

from __future__ import annotations

import pytest

from runtime_hook.record import Record


class _Pair(Record):
    _fields = ("name", "size", "tags")
    __slots__ = _fields
    _defaults = ((),)


def test_fields_come_from_positions_keywords_and_defaults() -> None:
    assert _Pair("a", 1)._asdict() == {"name": "a", "size": 1, "tags": ()}
    assert _Pair(size=2, name="b", tags=("x",)).tags == ("x",)
    assert _Pair("a", size=1) == _Pair("a", 1, ())


def test_equal_values_compare_and_hash_alike_and_other_types_differ() -> None:
    assert _Pair("a", 1) == _Pair("a", 1) and hash(_Pair("a", 1)) == hash(_Pair("a", 1))
    assert _Pair("a", 1) != _Pair("a", 2)
    assert _Pair("a", 1) != ("a", 1, ())


def test_repr_names_every_field() -> None:
    assert repr(_Pair("a", 1)) == "_Pair(name='a', size=1, tags=())"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("a",), {}, "missing field 'size'"),
        (("a", 1, (), 4), {}, "takes 3 fields, got 4"),
        (("a", 1), {"name": "b"}, "unexpected or repeated field 'name'"),
        (("a", 1), {"colour": "red"}, "unexpected or repeated field 'colour'"),
    ],
)
def test_wrong_arguments_are_refused(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _Pair(*args, **kwargs)


def test_fields_cannot_be_changed_or_added() -> None:
    pair = _Pair("a", 1)
    for change in (
        lambda: setattr(pair, "size", 2),
        lambda: setattr(pair, "colour", "red"),
        lambda: delattr(pair, "name"),
    ):
        with pytest.raises(AttributeError):
            change()
    assert pair == _Pair("a", 1)
