"""JSON decoding for the hook without importing the ``json`` package.

``import json`` pulls in ``re`` and costs more than the rest of a hook run
(about 8 ms of a 40 ms budget). The decoding itself is done by CPython's C
scanner in ``_json``, which ``json.decoder`` drives the same way; this module
drives it directly and falls back to ``json`` where ``_json`` is missing.
Malformed input raises ``ValueError`` (json's ``JSONDecodeError``), as
``json.loads`` does.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"


class _Options:
    """The decoding options json.decoder passes its scanner: the defaults of json.loads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {
        "-Infinity": float("-inf"),
        "Infinity": float("inf"),
        "NaN": float("nan"),
    }.__getitem__


_scan: Callable[[str, int], tuple[Any, int]] | None
try:
    from _json import make_scanner

    _scan = make_scanner(_Options())  # type: ignore[arg-type]  # the options json.decoder passes
except (ImportError, TypeError):  # an interpreter without CPython's accelerator
    _scan = None


def loads(data: bytes | str) -> Any:
    """Decode one JSON document (UTF-8 when given bytes)."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    if _scan is not None:
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration as exc:
            raise ValueError(f"expecting a JSON value at character {exc.value}") from None
        except SystemError:
            pass  # the scanner reports malformed JSON through json.decoder, not loaded here
        else:
            if text[end:].strip(_WHITESPACE):
                raise ValueError(f"extra data after the JSON value at character {end}")
            return value
    import json  # no C scanner, or malformed input: json says what is wrong

    return json.loads(text)
