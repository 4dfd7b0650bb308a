"""The scripts refuse a duration or a rate that is not a finite number above its bound, and a
count of runs that is not a whole number of at least one, with one line naming the flag, before
they build, start or measure anything."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.shim.gpu_load import processes_that_waited

REPO = Path(__file__).resolve().parents[1]

FLAGS = [
    ("bench-pacing", "--seconds"),
    ("bench-webhook", "--seconds"),
    ("bench-webhook", "--rate"),
    ("bench-webhook-memory", "--hold"),
    ("bench-under-share", "--window"),
    ("bench-paced-windows", "--seconds"),
    ("bench-paced-windows", "--warmup"),
    ("bench-paced-windows", "--window"),
    ("bench-paced-windows", "--settle"),
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
    ("bench-hook", "--runs"),
    ("bench-pacing", "--rounds"),
    ("bench-pacing", "--launches"),
    ("bench-placement", "--nodes"),
    ("bench-placement", "--calls"),
    ("bench-placement", "--binds"),
    ("bench-scheduling", "--creates"),
    ("bench-scheduling", "--burst"),
    ("bench-shim-overhead", "--rounds"),
    ("bench-shim-overhead", "--launches"),
    ("bench-shim-overhead", "--pairs"),
    ("bench-webhook-memory", "--greedy"),
    ("bench-webhook-memory", "--slow"),
    ("bench-webhook-memory", "--bare"),
    ("simulate-placement", "--nodes"),
    ("simulate-placement", "--gpus"),
    ("simulate-placement", "--pods"),
    ("simulate-placement", "--burst"),
    ("simulate-placement", "--node-processes"),
    ("bench-workloads", "--pairs"),
    ("bench-workloads", "--rounds"),
    ("bench-under-share", "--pairs"),
    ("bench-under-share", "--windows"),
    ("bench-paced-windows", "--runs"),
]


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "many"])
@pytest.mark.parametrize(("script", "flag"), COUNTS, ids=[" ".join(c) for c in COUNTS])
def test_a_count_of_runs_is_a_whole_number_of_at_least_one(
    script: str, flag: str, value: str
) -> None:
    assert (f"argument {flag}: {value!r} is not a whole number, at least 1"
            in refusal(script, flag, value))


@pytest.mark.parametrize("value", ["0", "100", "30,", "thirty", "30;60"])
@pytest.mark.parametrize(
    "script", ["bench-under-share", "bench-paced-windows", "bench-workloads", "bench-varying"])
def test_core_limits_are_whole_numbers_from_1_to_99(script: str, value: str) -> None:
    assert (f"argument --cores: {value!r} is not a list of core limits from 1 to 99, e.g. 30,60"
            in refusal(script, "--cores", value))


def test_paced_windows_must_leave_part_of_each_window_counted() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench-paced-windows"), "--window", "0.2",
         "--settle", "0.2"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert "--settle 0.2 leaves nothing of a 0.2 s window" in result.stderr


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--nodes", "1000,100", "give growing node counts, e.g. 100,1000"),
    ("--nodes", "0", "give growing node counts"),
    ("--nodes", "many", "give growing node counts"),
    ("--paths", "extender,fast", "unknown path fast: choose from extender, totals, extender-x2, "
                                 "dra"),
])
def test_the_scheduling_benchmark_refuses_what_it_cannot_run(flag: str, value: str,
                                                             words: str) -> None:
    assert words in refusal("bench-scheduling", flag, value)


def windows(paced: list[float], unpaced: list[float], step_ms: float | None = 0.5) -> dict:
    """A process as bench-paced-windows measures it, whose steps each keep the device busy
    step_ms: NVML's busy % over its run is its mean rate times that (None: NVML gave none)."""
    rates = paced + unpaced
    return {"ratio": statistics.median(paced) / statistics.median(unpaced), "paced": paced,
            "unpaced": unpaced,
            "busy": None if step_ms is None else statistics.mean(rates) * step_ms / 10}


def test_a_window_over_the_limit_is_told_by_its_rate_times_a_steps_gpu_time() -> None:
    # 400 tokens a second on average at 20% busy: 0.5 ms of GPU time a token, so a window at
    # 600 a second kept the device 30% busy, and one at 580 29%.
    run = windows([200.0, 600.0, 580.0, 220.0], [200.0, 600.0, 580.0, 220.0])
    assert script("bench-paced-windows").windows_over(run, 30) == 1
    assert script("bench-paced-windows").windows_over(run, 31) == 0
    assert script("bench-paced-windows").windows_over(windows([400.0], [400.0], None), 30) is None


def test_a_process_that_reached_its_limit_is_weighed_against_what_the_limit_leaves_it() -> None:
    # 0.5 ms a token: 600 tokens a second keep the device 30% busy, so a perfect limiter at 30
    # leaves unpaced windows of 700 and 800 a second 600 each, and the median goes from 700 to
    # 600.
    run = windows(paced=[540.0, 560.0, 600.0], unpaced=[700.0, 800.0, 300.0])
    assert script("bench-paced-windows").of_ideal(run, 30) == pytest.approx(560 / 600)
    assert run["ratio"] == pytest.approx(0.8)
    assert script("bench-paced-windows").of_ideal(run, 40) == pytest.approx(560 / 700)
    assert script("bench-paced-windows").busiest_paced(run) == pytest.approx(30.0)


def test_each_process_is_judged_by_the_target_its_unpaced_windows_call_for() -> None:
    verdict = script("bench-paced-windows").verdict
    steady = [400.0] * 4   # 20% busy at 0.5 ms a token
    reached = windows(paced=[540.0, 560.0, 600.0], unpaced=[700.0, 800.0, 300.0])
    lines, met = verdict([windows([w * 0.96 for w in steady], steady),
                          windows([w * 0.97 for w in steady], steady), reached], 30)
    assert met
    assert lines == [
        "2 under the limit in every window: ratio 0.965 (0.960-0.970); target >= 0.95: met",
        "1 at or over it in some window: of ideal 0.933 (0.933-0.933), busiest paced window "
        "30.0% (median); target of ideal >= 0.9, busiest <= 35%: met"]
    # Under its share it must keep 0.95 of its rate; over it, its busy time must stay within
    # the band, however fast that makes it.
    lines, met = verdict([windows([w * 0.94 for w in steady], steady)], 30)
    assert (lines[0].endswith("target >= 0.95: MISSED"), met) == (True, False)
    over_band = windows(paced=[800.0, 800.0, 800.0], unpaced=[700.0, 800.0, 300.0])
    lines, met = verdict([over_band], 30)
    assert not met and "busiest paced window 40.0% (median)" in lines[0]
    assert lines[0].endswith("busiest <= 35%: MISSED")
    lines, met = verdict([windows([w * 0.5 for w in steady], steady, None)], 30)
    assert (lines, met) == (["1 without NVML's busy %: not judged"], True)


@functools.cache
def script(name: str) -> ModuleType:
    """scripts/NAME as a module (its main() is not run)."""
    path = REPO / "scripts" / name
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module   # its dataclasses look their module up there
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("would_busy", "limit", "busy", "of_free", "met", "target"),
    [
        # Over its share: its limit +- 5 points of busy time.
        (95.6, 60, 57.0, None, True, "busy 60+-5"),
        (95.6, 60, 51.8, None, False, "busy 60+-5"),
        (76.7, 30, 35.4, None, False, "busy 30+-5"),
        (42.8, 30, 26.8, 0.622, True, "busy 30+-5"),
        # Under it: >= 0.95 of its rate unlimited beside the same neighbour.
        (25.0, 30, 14.5, 0.930, False, "of its rate unlimited beside it >= 0.95"),
        (25.0, 30, 14.5, 0.985, True, "of its rate unlimited beside it >= 0.95"),
        # Under it as the neighbour leaves it less than its share even unlimited (decoding
        # graphs at 60 beside a trainer at 30 on an H100).
        (54.5, 60, 53.7, 0.972, True, "of its rate unlimited beside it >= 0.95"),
        (54.5, 60, 48.0, 0.881, False, "of its rate unlimited beside it >= 0.95"),
        # Under it with nothing to weigh it against, or without a limit: no target.
        (25.0, 60, 16.3, None, True, ""),
        (95.6, None, 60.0, None, True, ""),
    ],
)
def test_a_container_of_two_at_once_is_held_to_its_share_or_its_rate_beside_the_other(
    would_busy: float, limit: int | None, busy: float, of_free: float | None, met: bool,
    target: str,
) -> None:
    together_target = script("bench-workloads").together_target
    assert together_target(would_busy, limit, busy, of_free) == (met, target)


def together_run(workload: str, cores: int | None, beside: str, beside_cores: int | None,
                 busy: float, would: float, of_free: float | None, waits: int = 0) -> dict:
    """One container's measurement in one round of a two-container pair."""
    return {"workload": workload, "cores": cores, "beside": beside, "beside_cores": beside_cores,
            "busy": busy, "would": would, "of_free": of_free, "waits": waits,
            "waited": 0.01 * waits}


def test_a_container_of_two_is_judged_by_the_medians_of_its_rounds() -> None:
    # Decoding graphs at 60 beside a trainer at 30, three rounds: one round alone would miss.
    graphs = [together_run("decode-graph", 60, "train", 30, busy, 54.0, of_free)
              for busy, of_free in ((51.9, 0.941), (53.6, 0.972), (52.8, 0.990))]
    trainer = [together_run("train", 30, "decode-graph", 60, busy, 80.0, None, waits)
               for busy, waits in ((29.5, 40), (36.0, 52), (29.9, 38))]
    unlimited = together_run("decode-graph", None, "train", 30, 54.0, 54.0, None)
    verdicts = script("bench-workloads").together_verdicts([*graphs, *trainer, unlimited])
    assert verdicts == [
        (True, "decode-graph at 60 beside train at 30: busy 52.8 (51.9-53.6), 0.972 of its "
               "rate unlimited beside it (0.941-0.990); waited for the bucket in 0 of 3 runs "
               "[of its rate unlimited beside it >= 0.95]"),
        (True, "train at 30 beside decode-graph at 60: busy 29.9 (29.5-36.0); waited for the "
               "bucket in 3 of 3 runs (0.520 s at most) [busy 30+-5]"),
    ]


def test_a_container_of_two_that_misses_in_most_rounds_is_missed() -> None:
    rounds = [together_run("decode", 30, "train", None, 14.0, 25.0, of_free)
              for of_free in (0.93, 0.97, 0.90)]
    (met, line), = script("bench-workloads").together_verdicts(rounds)
    assert not met
    assert line.endswith("0.930 of its rate unlimited beside it (0.900-0.970); waited for the "
                         "bucket in 0 of 3 runs [of its rate unlimited beside it >= 0.95: MISSED]")


def test_the_benchmarks_tell_how_many_processes_waited_for_the_bucket_and_how_long() -> None:
    assert processes_that_waited([(11, 0.1), (0, 0.0), (246, 0.546)]) == (
        "2 of 3, 0.100-0.546 s in all")
    assert processes_that_waited([(0, 0.0), (0, 0.0)]) == "0 of 2"

