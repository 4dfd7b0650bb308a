"""From body to answer without a server: whatever a body holds, the answer is a 200 or a 400."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.webhook.builders import container, pod, review, shared
from webhook.admission import admit
from webhook.config import Config

ODD_VALUES = [None, True, 0, -1, 1.5, 1e308, 2**70, "", "x", "1e999", [], [1], {}, {"a": 1}]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a member or element of a JSON value."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    result = copy.deepcopy(document)
    target = result
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return result


REVIEW = review(pod(shared("train", security_context={"capabilities": {"add": ["NET_ADMIN"]}}),
                    container("side", limits={"cpu": "1"}, requests={"cpu": "1"}),
                    init=(shared("warm", cores="100"),),
                    annotations={"vcuda.io/limits": "{}"}, runtime_class="nvidia"))


@pytest.mark.parametrize("path", list(paths(REVIEW)), ids=lambda p: ".".join(map(str, p)))
def test_any_value_anywhere_gives_a_200_or_a_400(path: tuple[Any, ...]) -> None:
    for value in ODD_VALUES:
        answer = admit(json.dumps(replaced(REVIEW, path, value)).encode(), Config())
        assert answer.status in (200, 400)
        if answer.status == 200:  # a review was answered: it names the request
            assert isinstance(json.loads(answer.body)["response"]["allowed"], bool)
        else:
            assert answer.body.startswith(b"bad AdmissionReview: ")
