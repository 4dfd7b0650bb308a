"""The hook's JSON decoder gives what json.loads gives, without loading the json package."""

from __future__ import annotations

import json
import subprocess

import pytest

from runtime_hook import fast_json
from tests.hook.bundles import PYTHON, REPO

DOCUMENTS = [
    '{"ociVersion": "1.0.2", "pid": 42, "annotations": {"vcuda.io/limits": "{\\"a\\": 1}"}}',
    '  [1, -2.5e3, true, false, null, "\\u00e9\\ud83d\\ude00", {"": []}]\n',
    '{"nan": NaN, "inf": -Infinity}',
    '"just a string"',
    "0",
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_decodes_like_json(text: str) -> None:
    assert repr(fast_json.loads(text)) == repr(json.loads(text))
    assert repr(fast_json.loads(text.encode())) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} trailing', "[1,]", '{"a" 1}', b"\xff"])
def test_malformed_input_raises_value_error(text: str | bytes) -> None:
    with pytest.raises(ValueError):
        fast_json.loads(text)


def test_decoding_does_not_load_the_json_package() -> None:
    code = (
        "import sys; from runtime_hook import fast_json;"
        "fast_json.loads('{\"a\": [1, 2]}'); print('json' in sys.modules, 're' in sys.modules)"
    )
    out = subprocess.run(
        [PYTHON, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["False", "False"]
