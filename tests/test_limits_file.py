"""The limits file: what the hook writes is what the shim's parser accepts."""

from __future__ import annotations

import pytest

from runtime_hook.limits_file import Limits, LimitsFormatError, parse, render


def test_render_then_parse_gives_back_the_same_limits() -> None:
    limits = Limits(memory=10 << 30, cores=30, devices=("GPU-a", "GPU-b"), account="/run/a")
    assert parse(render(limits)) == limits


def test_render_lists_every_key_once_in_key_value_lines() -> None:
    text = render(Limits(memory=1024, cores=5))
    assert text == "version=1\nmemory=1024\ncores=5\ndevices=\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory=1\n", "version must be 1"),
        ("version=1\n", "memory is missing"),
        ("version=1\nmemory=lots\n", "whole numbers"),
        ("version=1\nmemory=1\nmemory=2\n", "given twice"),
        ("version=1\nmemory=0\n", "positive"),
        ("version=1\nmemory=1\ncores=150\n", "1..100"),
        ("version=1\nnonsense\n", "key=value"),
    ],
)
def test_parse_rejects_bad_files_with_a_message(text: str, message: str) -> None:
    with pytest.raises(LimitsFormatError, match=message):
        parse(text)


def test_device_uuid_with_a_separator_is_refused() -> None:
    with pytest.raises(LimitsFormatError, match="not allowed"):
        Limits(memory=1, devices=("GPU-a,GPU-b",))
