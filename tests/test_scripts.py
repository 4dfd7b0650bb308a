"""The scripts refuse a duration or a rate that is not a finite number above its bound, and a
count of runs that is not a whole number of at least one, with one line naming the flag, before
they build, start or measure anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FLAGS = [
    ("bench-pacing", "--seconds"),
    ("bench-webhook", "--seconds"),
    ("bench-webhook", "--rate"),
    ("bench-webhook-memory", "--hold"),
    ("bench-under-share", "--window"),
    ("bench-under-share", "--warmup"),
    ("bench-under-share", "--timeout"),
    ("bench-workloads", "--seconds"),
    ("bench-workloads", "--warmup"),
    ("bench-workloads", "--timeout"),
    ("gpu-node-check", "--seconds"),
    ("simulate-placement", "--agent-every"),
    ("simulate-placement", "--delete-ratio"),
]


def refusal(script: str, flag: str, value: str) -> str:
    """What the script prints on stderr for flag's value, which it must refuse (exit 2) before
    printing anything else."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), flag, value],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    return result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
@pytest.mark.parametrize(("script", "flag"), FLAGS, ids=[" ".join(f) for f in FLAGS])
def test_a_number_flag_of_a_script_refuses_nan_inf_and_negatives(
    script: str, flag: str, value: str
) -> None:
    assert f"argument {flag}: {value!r} is not a number" in refusal(script, flag, value)


COUNTS = [
    ("bench-workloads", "--pairs"),
    ("bench-workloads", "--rounds"),
    ("bench-under-share", "--pairs"),
    ("bench-under-share", "--windows"),
]


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "many"])
@pytest.mark.parametrize(("script", "flag"), COUNTS, ids=[" ".join(c) for c in COUNTS])
def test_a_count_of_runs_is_a_whole_number_of_at_least_one(
    script: str, flag: str, value: str
) -> None:
    assert (f"argument {flag}: {value!r} is not a whole number, at least 1"
            in refusal(script, flag, value))


@pytest.mark.parametrize("value", ["0", "100", "30,", "thirty", "30;60"])
def test_core_limits_are_whole_numbers_from_1_to_99(value: str) -> None:
    assert (f"argument --cores: {value!r} is not a list of core limits from 1 to 99, e.g. 30,60"
            in refusal("bench-under-share", "--cores", value))
