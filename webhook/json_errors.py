"""Why JSON could not be read, or where it does not fit a typed shape, in vcuda's words.

A decoder's own messages change with its releases; a client and a test read
these instead. They are worked out here, on the slow path of a refused document.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi

_KEY_SHOWN = 60  # characters of a map key quoted in a path
# What msgspec's decoders raise for a document they refuse (some versions raise the last two
# themselves, for bytes that are no UTF-8 and for nesting past the interpreter's limit).
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def unreadable(data: bytes) -> str:
    """Why ``data``, which a JSON decoder refused, is no JSON: e.g. ``not UTF-8: ...``."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        return f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}"
    try:
        json.loads(text)  # for where it breaks only: the standard library gives the position
    except json.JSONDecodeError as exc:
        if not text[exc.pos:].strip():
            return "not JSON: it ends before its JSON does"
        return f"not JSON: it goes wrong at character {exc.pos}"
    except RecursionError:
        return "nested too deep to read"
    return "not JSON: it holds NaN, Infinity or a number out of range"


def why_refused(data: bytes, typ: Any, name: str) -> str:
    """Why a typed decoder refused ``data`` as ``typ`` (called ``name`` in the message)."""
    try:
        value = msgspec.json.decode(data)
    except DECODE_ERRORS:
        return f"it is {unreadable(data)}"
    return misfit(value, typ, name) or f"it does not have the shape of {name}"


def misfit(value: Any, typ: Any, path: str) -> str:
    """Say where ``value`` (decoded without types) does not fit ``typ``.

    The typed decoders refuse a value of the wrong shape; this walks the same
    type, as ``msgspec.inspect`` describes it, over the value.

    Args:
        value: the JSON value, as ``msgspec.json.decode`` gives it untyped.
        typ: the type the typed decoder refused it as (a Struct, list, dict, union...).
        path: the JSON path of ``value`` itself, e.g. ``object``.

    Returns "" when it fits, which should not happen for a value that the typed
    decoder refused; callers then say only that the shape is wrong.
    """
    return _misfit(value, mi.type_info(typ), path)


def _misfit(value: Any, info: mi.Type, path: str) -> str:
    if not _fits_kind(value, info):
        return f"{path} is {_described(value)}, where {_expected(info)} belongs"
    for option in info.types if isinstance(info, mi.UnionType) else (info,):
        if _fits_kind(value, option):
            return _inside(value, option, path)
    return ""


def _inside(value: Any, info: mi.Type, path: str) -> str:
    """The first misfit below ``value``, whose own kind is right."""
    if isinstance(info, mi.StructType):
        for field in info.fields:
            if field.encode_name not in value:
                if field.required:
                    return f"{path} has no {field.encode_name}, which it must have"
                continue
            found = _misfit(value[field.encode_name], field.type, f"{path}.{field.encode_name}")
            if found:
                return found
    elif isinstance(info, mi.ListType):
        for index, item in enumerate(value):
            found = _misfit(item, info.item_type, f"{path}[{index}]")
            if found:
                return found
    elif isinstance(info, mi.DictType):
        for key, item in value.items():
            found = _misfit(item, info.value_type, f"{path}[{json.dumps(key[:_KEY_SHOWN])}]")
            if found:
                return found
    return ""


def _fits_kind(value: Any, info: mi.Type) -> bool:
    """Whether ``value`` is of the JSON kind ``info`` takes (not looking inside it)."""
    if isinstance(info, mi.UnionType):
        return any(_fits_kind(value, option) for option in info.types)
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(value, bool):  # before int: JSON's true is no number
        return isinstance(info, mi.BoolType)
    kinds: dict[type, tuple[type, ...]] = {
        mi.StructType: (dict,), mi.DictType: (dict,), mi.ListType: (list,), mi.StrType: (str,),
        mi.IntType: (int,), mi.FloatType: (int, float), mi.NoneType: (type(None),)}
    return isinstance(value, kinds.get(type(info), ()))


def _expected(info: mi.Type) -> str:
    options = info.types if isinstance(info, mi.UnionType) else (info,)
    names: list[str] = []
    for option in options:
        name = _NAMES.get(type(option), "a value")
        if name not in names:
            names.append(name)
    return " or ".join(names)


_NAMES: dict[type, str] = {
    mi.StructType: "an object", mi.DictType: "an object", mi.ListType: "a list",
    mi.StrType: "a string", mi.IntType: "a number", mi.FloatType: "a number",
    mi.BoolType: "a boolean", mi.NoneType: "null"}


def _described(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((dict, "an object"), (list, "a list"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return "a number"
