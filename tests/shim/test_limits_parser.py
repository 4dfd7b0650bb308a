"""The shim's C parser reads what runtime_hook/contract.py renders, and refuses the same."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runtime_hook.contract import Limits, LimitsFormatError, parse_limits, render_limits
from tests.shim.harness import TESTS


def c_parse(tmp_path: Path, text: str) -> dict[str, list[str]]:
    """What cshim's parser makes of text: key -> values, or {"error": [message]}."""
    path = tmp_path / "limits"
    path.write_bytes(text.encode())
    out = subprocess.run(
        [str(TESTS / "limits_dump"), str(path)], capture_output=True, text=True, check=False
    ).stdout
    parsed: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, value = line.split("=", 1)
        parsed.setdefault(key, []).append(value)
    return parsed


@pytest.mark.parametrize(
    "limits",
    [
        Limits(memory=4 << 30),
        Limits(memory=10 << 30, cores=30, devices=("GPU-5c3d1a2b-0000-1111-2222-333344445555",)),
        Limits(memory=1, cores=1, devices=("GPU-a", "MIG-b", "GPU-c"), account="/run/vcuda/acct"),
        Limits(memory=(1 << 63) - 1, cores=100, account="/tmp/with space/and=sign"),
    ],
)
def test_what_python_renders_the_shim_reads_back_the_same(
    shim_build: None, tmp_path: Path, limits: Limits
) -> None:
    parsed = c_parse(tmp_path, render_limits(limits))
    assert "error" not in parsed, parsed
    assert parsed["memory"] == [str(limits.memory)]
    assert parsed["cores"] == [str(limits.cores)]
    assert tuple(parsed.get("device", [])) == limits.devices
    assert parsed["account"] == [limits.account]


@pytest.mark.parametrize(
    "text",
    [
        "memory=1\n",
        "version=2\nmemory=1\n",
        "version=1\n",
        "version=1\nmemory=lots\n",
        "version=1\nmemory=1\ncores=x\n",
        "version=1\nmemory=1\nmemory=2\n",
        "version=1\nmemory=1\nextra=a\nextra=b\n",
        "version=1\nmemory=0\n",
        "version=1\nmemory=1\ncores=0\n",
        "version=1\nmemory=1\ncores=150\n",
        "version=1\nnonsense\n",
        "version=1\nmemory=1\ndevices=GPU-a b\n",
        "version=1\nmemory=1\ndevices=GPU#1\n",
    ],
)
def test_the_shim_refuses_what_the_python_parser_refuses_with_the_same_message(
    shim_build: None, tmp_path: Path, text: str
) -> None:
    with pytest.raises(LimitsFormatError) as python:
        parse_limits(text)
    assert c_parse(tmp_path, text) == {"error": [str(python.value)]}


def test_comments_blank_lines_and_unknown_keys_are_accepted(
    shim_build: None, tmp_path: Path
) -> None:
    text = "# written by hand\n\nversion=1\n   \nmemory=2048\nfuture=1\n"
    assert parse_limits(text) == Limits(memory=2048)
    assert c_parse(tmp_path, text) == {"memory": ["2048"], "cores": ["100"], "account": [""]}


def test_a_nul_byte_is_refused(shim_build: None, tmp_path: Path) -> None:
    assert c_parse(tmp_path, "version=1\nmemory=1\naccount=/a\0b\n")["error"] == [
        "the file holds a NUL byte"
    ]
