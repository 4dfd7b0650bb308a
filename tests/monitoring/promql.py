"""The metric names a PromQL expression reads, found without a PromQL parser.

Crude but sound for the expressions vcuda ships: strings, label matchers,
ranges and the label lists of grouping modifiers are removed first, then every
identifier left that is not a function (it precedes a parenthesis), a keyword
or a number is a metric name. An identifier it cannot place is an error, not a
guess.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
# Grafana's template variables ($node, $__range) stand inside matchers and ranges, removed
# above; one anywhere else would be read as a name and fail the check, as it should.


def metric_names(expr: str) -> set[str]:
    """The names of the metrics ``expr`` selects (``up`` included)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        following = text[match.end():].lstrip()
        if following.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        if text[match.start() - 1:match.start()] in ("$", "."):
            raise ValueError(f"cannot place {word!r} in {expr!r}")
        if re.fullmatch(r"[0-9]", text[match.start() - 1:match.start()] or " "):
            continue  # the exponent or suffix of a number (1e3)
        names.add(word)
    return names


def label_values_metric(query: str) -> set[str]:
    """The metric of a Grafana variable's ``label_values(METRIC{...}, label)``."""
    inner = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query)
    if inner is None:
        raise ValueError(f"not a label_values query: {query!r}")
    return metric_names(inner.group(1))
