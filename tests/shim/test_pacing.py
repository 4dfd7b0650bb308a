"""Kernel launches are paced to the container's share of the device, on the test double.

The double's device runs each spin kernel for the simulated time its launch
asks for, one kernel at a time for all processes, and its events report
those times; the probe measures the share its kernels got of the wall time.
The pacing arithmetic alone is checked on a simulated clock (pacing_sim).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.shim.gpu_load import bucket_waits
from tests.shim.harness import GIB, TESTS, FakeGpu, account_gpu_ns, fake_uuid

MS = 1_000_000
US = 1_000
BAND = 5  # percentage points, as the issue asks
LOAD = ("init", "ctx", "0", "module")
# A 5 us kernel every 200 us for 1.5 s: a launch-bound loop, whose timed
# launches hold their stream.
HELD_LOAD = (*LOAD, "gaps", str(5 * US), "200", "1500")
# A driver whose launch call takes 40 us, and its kernel 20 us more to reach the device.
WAY_TO_DEVICE = {"VCUDA_FAKE_LAUNCH_NS": str(40 * US), "VCUDA_FAKE_SUBMIT_NS": str(20 * US)}
CANNOT_HOLD = "cannot hold a stream until its launch is on the device"


def sim(*words: object) -> list[str]:
    """pacing_sim's one line of output, split."""
    result = subprocess.run([str(TESTS / "pacing_sim"), *map(str, words)], capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stdout.split()


def load(api: str, kernel_ns: int, ms: int, streams: int = 0, threads: int = 1) -> tuple[str, ...]:
    return ("load", api, str(kernel_ns), str(ms), str(streams), str(threads))


def share(lines: list[list[str]], label: str = "load") -> float:
    """The share a load (or replay) line reports; fails on a line with an error."""
    found = [line for line in lines if line[0] == label or line[:2] == ["child", label]]
    assert found, lines
    words = found[-1][1:] if found[-1][0] == "child" else found[-1]
    assert len(words) >= 4 and not words[-1].startswith("CUDA_ERROR"), words
    return float(words[-1])


def limited(gpu: FakeGpu, cores: int) -> FakeGpu:
    gpu.limit(4 * GIB, cores=cores)
    return gpu


def pacing_tally(log: str) -> tuple[int, int, int, int, int, float, float]:
    """The pacer's tally at exit: launches paced, timed alone, in runs,
    untimed; launches that waited, seconds waited, seconds charged up front."""
    found = re.search(
        r"paced (\d+) launches \((\d+) timed alone, (\d+) in runs, (\d+) untimed\); "
        r"(\d+) waited for the bucket, ([\d.]+) s in all; charged ([\d.]+) s up front",
        log)
    assert found, log
    paced, alone, in_runs, untimed, waits = map(int, found.groups()[:5])
    waited, up_front = map(float, found.groups()[5:])
    return paced, alone, in_runs, untimed, waits, waited, up_front


def slices_found(log: str) -> tuple[int, float]:
    """The other processes' time slices the pacer found, and their seconds, from its tally."""
    found = re.search(r"(\d+) time slices of other processes found, ([\d.]+) s in all", log)
    assert found, log
    return int(found[1]), float(found[2])


def long_kernels_at_30(gpu: FakeGpu, **fake: str) -> tuple[list[list[str]], str]:
    """Runs 3 ms kernels back to back for 3 s at 30 on a double set up by ``fake``, and checks
    the share they got: the probe's lines, split, and the library's log (info)."""
    limited(gpu, 30)
    result = gpu.run(*LOAD, *load("kernel", 3 * MS, 3000), VCUDA_LOG_LEVEL="info", **fake)
    lines = [line.split() for line in result.stdout.splitlines()]
    assert abs(share(lines) - 30) <= BAND, (lines, result.stderr)
    return lines, result.stderr


def charged_per_launch(gpu: FakeGpu, launches: int) -> float:
    """The GPU time the account was charged, in ns a launch, on the one device."""
    return account_gpu_ns(gpu.account)[fake_uuid(0)] / launches


def assert_not_held_back(slow: int, launches: int) -> None:
    """Paced, nearly every launch of a loop would wait for the bucket; unpaced, only those whose
    thread a loaded host descheduled do (up to 78 in 7,500 were seen on a 2-core CI machine)."""
    assert slow <= launches // 25, (slow, launches)


def assert_charged_its_5_us_kernel(gpu: FakeGpu, launches: int) -> None:
    """A loop of 5 us kernels (HELD_LOAD's) was charged about its kernel's time a launch."""
    charged = charged_per_launch(gpu, launches)
    assert 0.9 * 5 * US <= charged <= 1.5 * 5 * US, charged


def concurrently(*runs: tuple[FakeGpu, tuple[str, ...]]) -> list[list[list[str]]]:
    """Runs probes at once (each with its GPU's limits); their outputs, split."""
    processes = [
        subprocess.Popen(gpu.command(*words), env=gpu.environment(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for gpu, words in runs
    ]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        outputs.append([line.split() for line in out.splitlines()])
    return outputs


# ---- the arithmetic, on a simulated clock ----


@pytest.mark.parametrize(
    ("percent", "kernel_us", "launchers", "oversleep_us"),
    [(10, 1700, 1, 50), (30, 10, 1, 50), (30, 1700, 3, 0), (60, 10, 4, 50), (90, 1700, 2, 50),
     (90, 10, 1, 0)],
)
def test_every_2_second_window_holds_the_share_for_long_and_short_kernels_and_many_launchers(
    shim_build: None, percent: int, kernel_us: int, launchers: int, oversleep_us: int
) -> None:
    low, high = map(float, sim("share", percent, kernel_us, 8, launchers, oversleep_us)[1:])
    assert percent - 1 <= low <= high <= percent + 1


@pytest.mark.parametrize("kernel_us", [10, 1700])
def test_after_a_long_idle_spell_the_first_window_stays_within_the_share(
    shim_build: None, kernel_us: int
) -> None:
    assert float(sim("idle", 30, kernel_us, 60_000)[1]) <= 30 + 1


@pytest.mark.parametrize(("percent", "kernel_us", "host_ms"), [(30, 100, 35), (60, 100, 25),
                                                           (60, 1700, 20)])
def test_a_program_that_idles_the_device_between_steps_gets_its_whole_share(
    shim_build: None, percent: int, kernel_us: int, host_ms: int
) -> None:
    # A training loop: 40 ms of kernels, a sync, then host work with the
    # device idle. The idle time is saved up and spent in the next step; a
    # bucket that saved 10 ms left it 4.5 to 11 points under its share.
    mean, busiest = map(float, sim("steps", percent, kernel_us, 40, host_ms, 10)[1:])
    assert percent - 1 <= mean <= percent + 1
    assert busiest <= percent + 2


def test_a_program_in_steps_under_its_share_is_not_slowed(shim_build: None) -> None:
    mean = float(sim("steps", 90, 100, 40, 30, 10)[1])
    assert mean == pytest.approx(100 * 40 / (40 + 30), abs=0.5)


def test_one_huge_kernel_never_makes_a_launch_wait_more_than_2_seconds(shim_build: None) -> None:
    assert float(sim("debt", 1, 60_000)[1]) <= 2000


@pytest.mark.parametrize(
    ("kernel_us", "noise", "stretched", "stretch_us"),
    [(10, 5, 0, 0), (10, 5, 60, 2000), (1700, 2, 50, 2000), (1700, 3, 30, 1700)],
)
def test_a_kernels_estimate_is_its_own_time_whatever_else_ran_between_its_events(
    shim_build: None, kernel_us: int, noise: int, stretched: int, stretch_us: int
) -> None:
    for seed in range(5):
        words = sim("estimate", kernel_us, noise, stretched, stretch_us, 0, 200, seed)
        estimate, mean = float(words[1]), float(words[3])
        assert abs(estimate - mean) <= 0.03 * mean, (seed, estimate, mean)


def test_when_almost_every_sample_is_stretched_the_estimate_errs_on_the_high_side(
    shim_build: None,
) -> None:
    for seed in range(5):
        words = sim("estimate", 200, 0, 90, 2000, 0, 200, seed)
        estimate, mean = float(words[1]), float(words[3])
        assert mean <= estimate <= 1.1 * mean, (seed, estimate, mean)


@pytest.mark.parametrize(("kernel_us", "noise", "stretched"),
                         [(1400, 1, 0), (1400, 1, 30), (50, 3, 0)])
def test_a_record_cut_short_now_and_then_never_pulls_the_estimate_down(
    shim_build: None, kernel_us: int, noise: int, stretched: int
) -> None:
    # One sample in 100 cut to a tenth to a half, as a record loses much of its
    # kernel's time to a span wrongly taken for another process's slice. Such a
    # sample is in the mean while it is in the ring (1/16 of its shortfall, or
    # two such in one ring), but never sets the floor: the old estimator's
    # fell to the cut sample, and its estimate down to a tenth of the kernel's.
    for seed in range(5):
        words = sim("estimate", kernel_us, noise, stretched, 2000, 1, 400, seed)
        estimate, mean, lowest = float(words[1]), float(words[3]), float(words[5])
        assert estimate <= 1.03 * mean, (seed, estimate, mean)
        assert lowest >= 0.75 * mean, (seed, lowest, mean)


@pytest.mark.parametrize(("before_us", "after_us", "within"),
                         [(1400, 700, 3), (80, 5, 3), (1400, 1300, 16)])
def test_a_kernel_that_became_faster_is_followed(
    shim_build: None, before_us: int, after_us: int, within: int
) -> None:
    # Far faster: from its third fast sample, as two recent ones must agree
    # with a sample far under the floor. A little faster: the floor follows at
    # once, and the estimate as the new samples fill the ring.
    assert 1 <= int(sim("shift", before_us, after_us)[1]) <= within


@pytest.mark.parametrize(("kernel_us", "stretched_us"), [(100, 118), (12, 15), (1400, 1700)])
def test_a_kernel_timed_alone_again_after_a_busy_spell_is_charged_its_own_time_at_once(
    shim_build: None, kernel_us: int, stretched_us: int
) -> None:
    # 1.5 s of samples stretched by a neighbour's slices raise the floor some
    # 15%, and those samples lie near it; the next sample of the kernel's own
    # time is far under the risen floor but at the fastest one seen, so it is
    # no record cut short and sets the floor again at once.
    assert int(sim("return", kernel_us, stretched_us, 1.5)[1]) == kernel_us * 1000


# ---- the shim on the test double ----


@pytest.mark.parametrize(
    ("cores", "kernel_ns"),
    [(30, 1 * MS), (30, 50 * US), (10, 2 * MS), (90, 200 * US)],
    ids=["30-long", "30-short", "10-long", "90-short"],
)
def test_one_process_gets_its_share_with_long_and_short_kernels(
    gpu: FakeGpu, cores: int, kernel_ns: int
) -> None:
    limited(gpu, cores)
    assert abs(share(gpu.lines(*LOAD, *load("kernel", kernel_ns, 2000))) - cores) <= BAND


def test_without_the_shim_the_load_keeps_the_device_busy(gpu: FakeGpu) -> None:
    # The yardstick of the tests above: unpaced, the same load takes about all
    # of it (a loaded machine deschedules the launching thread now and then).
    assert share(gpu.lines(*LOAD, *load("kernel", 50 * US, 1000), shim=False)) >= 90


@pytest.mark.parametrize("api", ["kernel", "ex", "coop", "graph"])
@pytest.mark.parametrize("mode", ["link", "getproc-ptsz"])
def test_every_launch_call_is_paced_however_it_is_reached(
    gpu: FakeGpu, api: str, mode: str
) -> None:
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, *load(api, 500 * US, 1000), mode=mode)
    assert abs(share(lines) - 30) <= BAND


@pytest.mark.parametrize(("streams", "at_most", "at_least"), [(0, 0.35, 0.0), (2, 9.0, 1.2)])
def test_small_kernels_on_one_stream_are_timed_now_and_then_and_on_several_all(
    gpu: FakeGpu, streams: int, at_most: float, at_least: float
) -> None:
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, *load("kernel", 50 * US, 1000, streams=streams), "records")
    launches = int(next(line for line in lines if line[0] == "load")[2])
    # The probe records one event a stream every 8 launches itself.
    recorded = int(lines[-1][1]) / launches
    assert at_least <= recorded <= at_most, recorded
    assert abs(share(lines) - 30) <= BAND


def test_small_kernels_timed_in_runs_are_charged_their_own_time_not_the_events(
    gpu: FakeGpu,
) -> None:
    # An event between two kernels holds the device a moment: about 2 us beside
    # a 12 us kernel on an H200, so 16 us beside these 100 us ones. A kernel
    # timed alone would be charged its events' moment too and get 0.86 of its
    # share.
    limited(gpu, 30)
    kernel_ns = 100 * US
    result = gpu.run(*LOAD, *load("kernel", kernel_ns, 2500), VCUDA_FAKE_EVENT_NS=str(16 * US))
    words = result.stdout.splitlines()[-1].split()
    launches, got = int(words[2]), float(words[-1])
    charged = charged_per_launch(gpu, launches)
    # The probe's own checkpoint (an event every 8 launches) costs 2 us a launch.
    assert kernel_ns <= charged <= 1.06 * kernel_ns, charged
    assert abs(got - 30) <= BAND, got


@pytest.mark.parametrize("mode", ["link", "dlsym", "getproc"])
def test_the_double_holds_a_stream_until_the_host_value_it_waits_for_is_written(
    gpu: FakeGpu, mode: str
) -> None:
    # As the driver does (tests/shim/test_gpu_pacing.py runs the same on a
    # GPU): the work behind the wait is not done 20 ms on, and is done at
    # once when the value is written.
    hold = gpu.lines("init", "ctx", "0", "hold", "20", mode=mode, shim=False)[-1]
    assert hold[:3] == ["hold", "CUDA_ERROR_NOT_READY", "CUDA_SUCCESS"], hold
    assert float(hold[3]) < 10, hold


def test_launches_hold_their_streams_again_in_a_context_made_after_a_reset(gpu: FakeGpu) -> None:
    # The reset context's entry, and its word, go to the new context: its
    # small kernels are held and charged their time as before.
    limited(gpu, 30)
    gaps = ("gaps", str(5 * US), "200", "300")
    lines = gpu.lines(*LOAD, *gaps, "reset", "0", "ctx", "0", "module", *gaps, **WAY_TO_DEVICE)
    made = [line for line in lines if line[0] == "gaps"]
    assert [int(line[1]) for line in made] == [300 * 1000 // 200] * 2, lines
    launches = sum(int(line[1]) for line in made)
    assert_charged_its_5_us_kernel(gpu, launches)


@pytest.mark.parametrize("blocks", ["1", "2"], ids=["call", "every-call"])
def test_a_launch_call_that_blocks_while_its_stream_is_held_is_let_go(
    gpu: FakeGpu, blocks: str
) -> None:
    # A driver whose queue for the stream is full returns from a launch call
    # only once the stream runs: the library holds a small kernel's stream
    # during its launch call, so a thread of its own lets such a stream go.
    # One that calls no driver: with blocks 2 every other driver call waits
    # for the held stream too, the pacing thread's among them.
    limited(gpu, 30)
    result = gpu.run(*LOAD, "gaps", str(5 * US), "2000", "300", VCUDA_FAKE_HELD_BLOCKS=blocks)
    launches, slow = map(int, result.stdout.split()[-2:])
    assert launches == 300 * 1000 // 2000
    # The held launches (a sample of a kernel's, once its cost is known)
    # returned after a millisecond or two, the others at once.
    assert 1 <= slow <= launches // 4, slow


def test_a_stream_held_while_another_thread_waits_for_it_in_the_driver_is_let_go(
    gpu: FakeGpu,
) -> None:
    # On an H100 a PyTorch program's cuStreamCreate spun under the driver's
    # lock until a held stream ran, and the thread that held it waited for
    # that lock before it could let it go: the pacing thread, timing a held
    # pair of events on its own stream at its start, hung half the runs. The
    # double's driver does the same (blocks 2) while a thread creates
    # streams all along beside a launch-bound loop.
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, "hammer", "streams", "gaps", str(5 * US), "200", "300",
                      "hammer", "0", VCUDA_FAKE_HELD_BLOCKS="2")
    assert lines[-2][:2] == ["gaps", str(300 * 1000 // 200)], lines
    assert lines[-1] == ["hammer", "off"], lines


@pytest.mark.parametrize("launch_us,submit_us,mode", [
    (0, 0, "link"),
    (40, 0, "link"),
    (40, 20, "link"),
    (40, 20, "getproc-ptsz"),   # the per-thread default stream is the one held
])
def test_a_small_kernel_every_200_us_under_30_is_not_paced_at_all(
    gpu: FakeGpu, launch_us: int, submit_us: int, mode: str
) -> None:
    # 5 us of kernel every 200 us is 2.5% of the device: the idle time between
    # launches, the host's time in each launch call before its kernel reaches
    # the device (launch_us, as a driver spends it), and the time the kernel
    # takes to get there once the call returned (submit_us) are never charged.
    limited(gpu, 30)
    lines = gpu.lines(*HELD_LOAD, mode=mode,
                      VCUDA_FAKE_LAUNCH_NS=str(launch_us * US),
                      VCUDA_FAKE_SUBMIT_NS=str(submit_us * US))
    launches, slow = int(lines[-1][1]), int(lines[-1][2])
    assert launches == 1500 * 1000 // 200
    assert_not_held_back(slow, launches)
    # Charged its kernel's time: far from the 45-65 us of kernel, launch call
    # and way to the device, or the 200 us from one launch to the next. Its
    # timed launches hold their stream until the call returned, so their
    # events time the kernel alone.
    assert_charged_its_5_us_kernel(gpu, launches)


def test_a_launch_call_that_returns_while_its_kernel_runs_teaches_no_shorter_time(
    gpu: FakeGpu,
) -> None:
    # A thread descheduled after the driver pushed its kernel returns from
    # the launch call 4 us into a 5 us kernel. An unheld record that starts
    # at the call's return would read 1 us: taken as a sample, it would
    # become the kernel's estimate, and every launch would be undercharged.
    # (On a busy host this happens now and then; here, at every launch.)
    limited(gpu, 30)
    lines = gpu.lines(*HELD_LOAD, VCUDA_FAKE_RETURN_NS=str(4 * US))
    launches = int(lines[-1][1])
    assert launches >= 0.9 * 1500 * 1000 // 200, launches
    assert_charged_its_5_us_kernel(gpu, launches)


def late_returns(log: str) -> tuple[int, float]:
    """The records the pacer left unsampled as their launch call returned late, and the latest
    return in ms, from its tally."""
    found = re.search(r"(\d+) records not sampled as their launch call returned late, by "
                      r"([\d.]+) ms at most", log)
    assert found, log
    return int(found[1]), float(found[2])


@pytest.mark.parametrize("every", [3, 1])
def test_a_long_kernel_whose_launch_calls_return_late_is_charged_its_time(
    gpu: FakeGpu, every: int
) -> None:
    # A thread held 2 ms in the call after the driver pushed its 3 ms kernel
    # returns two thirds into it. Charged from the call's return, such a
    # record reads 1 ms, and the kernel's cost, learned from what its records
    # were charged, fell to 1.4 ms: the load got 38% of the device at 30 where
    # one call in three returned late, 65% where every one did. Charged from
    # their start events, and no samples, such records leave it its 3 ms.
    lines, log = long_kernels_at_30(gpu, VCUDA_FAKE_RETURN_NS=str(2 * MS),
                                    VCUDA_FAKE_RETURN_EVERY=str(every))
    launches = int(lines[-1][2])
    late, latest = late_returns(log)
    # Every one timed (a launch now and then goes untimed) is counted.
    assert 0.85 * launches / every <= late <= launches / every + 1, (late, launches)
    assert latest >= 1.9, latest   # more where this host held the thread longer still


def test_each_of_the_many_kernels_of_a_training_step_is_learned_once(gpu: FakeGpu) -> None:
    # A training step launches about a hundred kernels, each once a step.
    # Each kernel's cost is learned from its first timed launches; a kernel
    # whose estimate made room for another's would be charged a guess and
    # timed afresh every step, and learned again (or never).
    limited(gpu, 30)
    result = gpu.run(*LOAD, "shapes", str(10 * US), "300", "10", VCUDA_LOG_LEVEL="debug")
    assert result.stdout.split()[-2:] == ["shapes", str(300 * 10)], result.stdout
    learned = re.findall(r"kernel ([0-9a-f]{16}) costs", result.stderr)
    assert len(learned) == len(set(learned)) == 300, (len(learned), len(set(learned)))


def test_kernels_that_two_threads_take_turns_to_launch_on_one_stream_are_all_charged(
    gpu: FakeGpu,
) -> None:
    # As PyTorch launches a training step: the main thread its forward pass,
    # a thread of its own the backward pass, on the same stream. The main
    # thread's last run ends at its next launch, so its end event spans the
    # other thread's kernels; taken as the context's busy time, it left them
    # charged nothing (7.5-9.6 us a 20 us launch).
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, "handoff", str(20 * US), "200", "20", str(20 * US), "0")
    launches = int(lines[-1][1])
    assert launches == 2 * 200 * 20
    charged = charged_per_launch(gpu, launches)
    assert 0.95 * 20 * US <= charged <= 1.2 * 20 * US, charged


@pytest.mark.parametrize("command", ["varying", "handoff"])
@pytest.mark.parametrize("gap_us", [0, 1000])
def test_a_kernel_whose_time_depends_on_its_argument_gets_its_share_and_no_more(
    gpu: FakeGpu, command: str, gap_us: int
) -> None:
    # One kernel of one shape, 5 us at 50 launches and 80 us at the next 50
    # (as a GEMM takes as long as its inner dimension says), from one thread
    # or two in turns, the host idle between rounds or not. Its runs and
    # untimed launches were charged near its fastest launches: a process at
    # 30 kept an H100 58-94% busy (NVML), and took 74-99% of the device here.
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, command, str(5 * US), "50", "120", str(80 * US), str(gap_us))
    assert abs(share(lines, command) - 30) <= BAND, lines[-1]


def test_a_kernel_that_takes_the_same_time_at_every_launch_is_still_timed_in_runs(
    gpu: FakeGpu,
) -> None:
    # Each kernel has one launch in 128 timed alone, to see whether its
    # launches take what its estimate says; one that does keeps its runs
    # (one pair of events for up to 32 launches), and its share.
    limited(gpu, 30)
    result = gpu.run(*LOAD, *load("kernel", 10 * US, 1000), VCUDA_LOG_LEVEL="info")
    paced, alone, in_runs = pacing_tally(result.stderr)[:3]
    assert alone <= paced // 64, (paced, alone, in_runs)
    assert in_runs >= paced * 9 // 10, (paced, alone, in_runs)
    assert abs(float(result.stdout.split()[-1]) - 30) <= BAND


def test_a_thread_behind_its_device_times_no_more_launches_alone_than_its_samples(
    gpu: FakeGpu,
) -> None:
    # A launch-bound thread (decoding) times one launch in 128 at random, and
    # that sample is also its check: a check drawn besides would double what
    # its timing costs it (about 6 us of driver calls a timed launch on an
    # H100), as the first form of checks did (1.7% of these launches).
    limited(gpu, 30)
    result = gpu.run(*LOAD, "gaps", str(5 * US), "50", "3000", VCUDA_LOG_LEVEL="info")
    paced, alone = pacing_tally(result.stderr)[:2]
    assert paced >= 3000 * 1000 // 50 * 9 // 10, paced
    assert alone <= paced // 80, (paced, alone)


def test_a_kernel_that_mostly_waits_out_a_neighbours_time_slice_is_charged_its_own_time(
    gpu: FakeGpu,
) -> None:
    # Beside a busy neighbour a launch-bound program's kernel often reaches
    # the device during the neighbour's time slice: the events before it have
    # completed, and it starts when the slice ends (2.4 ms beside a training
    # step on an H100, for 6 us decoding kernels). Here three records in four
    # span a 1 ms slice, so the kernel is not steady; it is still charged at
    # most 4x its estimate (its 5 us and about 4 us of its two events' moment
    # on the double, more where a loaded host delays the events: 52 us was
    # seen), not the slices: 0.75 ms a launch, 75% of the device, with which
    # it waited for the bucket.
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, "gaps", str(5 * US), "1000", "1500",
                      VCUDA_FAKE_SLICE_NS=str(1 * MS), VCUDA_FAKE_SLICE_PERCENT="75")
    launches, slow = int(lines[-1][1]), int(lines[-1][2])
    assert launches == 1500
    assert_not_held_back(slow, launches)
    charged = charged_per_launch(gpu, launches)
    assert 5 * US <= charged <= 0.75 * MS / 10, charged


@pytest.mark.parametrize("slice_ms", [2, 5])
def test_long_kernels_that_a_neighbours_time_slices_preempt_get_their_share(
    gpu: FakeGpu, slice_ms: int
) -> None:
    # Beside a busy neighbour a long kernel is preempted by its time slices
    # and ends that much later (3.4 ms kernels of a training step were charged
    # 8.2 ms beside a matmul on an H100). Here half the 3 ms kernels wait out
    # a slice; charged it, the load got 22.6% (2 ms slices) and 16.5% (5 ms)
    # of the device, not its 30.
    lines, log = long_kernels_at_30(gpu, VCUDA_FAKE_SLICE_NS=str(slice_ms * MS),
                                    VCUDA_FAKE_SLICE_PERCENT="50")
    # The pacer tells what it found: most of each slice, none of it twice.
    launches = int(lines[-1][2])
    slices, seconds = slices_found(log)
    sliced = launches // 2 * slice_ms / 1000
    assert 0.4 * launches <= slices <= 0.5 * launches + 1, (slices, launches)
    assert 0.7 * sliced <= seconds <= sliced, (seconds, sliced, slices, launches)


def test_a_held_launch_is_charged_its_kernel_and_half_its_events_moment(gpu: FakeGpu) -> None:
    # Each event behind a wait holds the double's stream 4 us: a held launch
    # takes its start event's moment and its kernel, 9 us in all. A held pair
    # with nothing between takes the moment alone, and half of it is taken
    # off (NVML counts about half of it as busy on an H100).
    limited(gpu, 30)
    result = gpu.run(*HELD_LOAD, **WAY_TO_DEVICE, VCUDA_FAKE_EVENT_NS=str(4 * US))
    launches = int(result.stdout.split()[-2])
    charged = charged_per_launch(gpu, launches)
    assert 0.95 * 7 * US <= charged <= 7.75 * US, charged


def test_a_driver_that_cannot_hold_streams_gets_one_warning_and_launches_timed_unheld(
    gpu: FakeGpu,
) -> None:
    # A device without stream memory operations refuses every wait with
    # CUDA_ERROR_NOT_SUPPORTED: its small kernels are timed without holds,
    # and so charged their way to the device as well.
    limited(gpu, 30)
    result = gpu.run(*HELD_LOAD, **WAY_TO_DEVICE, VCUDA_FAKE_WAIT_ERROR="801",
                     VCUDA_LOG_LEVEL="warn")
    assert result.stderr.count(CANNOT_HOLD) == 1, result.stderr
    assert "(CUDA error 801)" in result.stderr
    launches, slow = map(int, result.stdout.split()[-2:])
    assert launches == 1500 * 1000 // 200
    assert_not_held_back(slow, launches)
    charged = charged_per_launch(gpu, launches)
    assert charged > 2 * 5 * US, charged


def test_a_wait_that_fails_for_another_reason_leaves_later_launches_held(gpu: FakeGpu) -> None:
    # Two waits fail as a driver out of memory fails a call: those two
    # launches go unheld, and holds go on for the launches after them.
    limited(gpu, 30)
    result = gpu.run(*HELD_LOAD, **WAY_TO_DEVICE, VCUDA_FAKE_WAIT_ERROR="2",
                     VCUDA_FAKE_WAIT_ERRORS="2", VCUDA_LOG_LEVEL="warn")
    assert CANNOT_HOLD not in result.stderr, result.stderr
    launches = int(result.stdout.split()[-2])
    assert_charged_its_5_us_kernel(gpu, launches)


def test_a_thread_behind_its_device_times_one_launch_in_eight_then_in_128(gpu: FakeGpu) -> None:
    # Each timed launch costs its thread three driver calls and its device a
    # moment an event: a launch-bound loop would pay for timing every launch
    # in its own speed. Once the kernel's cost is known, one in eight is
    # timed, one in 128 once it has 64 samples, and the others are charged
    # the kernel's estimate.
    limited(gpu, 30)
    result = gpu.run(*HELD_LOAD, VCUDA_LOG_LEVEL="info")
    launches = int(result.stdout.splitlines()[-1].split()[1])
    paced, alone, in_runs, untimed, *_ = pacing_tally(result.stderr)
    assert paced == launches == alone + in_runs + untimed
    # Of its 7,500 launches, some 64 + (7,500 - 8 * 64) / 128 = 119 would be
    # timed alone if each timed launch gave a sample; 170-181 are here, with
    # 40-43 untimed launches to each (a loaded machine deschedules the loop
    # now and then, and the launches it then makes in a row queue and go in
    # runs). One in 32 would time some 340 in all, one in eight all along
    # some 940.
    assert launches > 7000, launches
    assert alone > 0 and untimed >= 30 * alone, (alone, in_runs, untimed)
    assert_charged_its_5_us_kernel(gpu, launches)


def test_a_memset_queued_before_each_launch_does_not_charge_the_idle_gap_before_it(
    gpu: FakeGpu,
) -> None:
    # As a program queues a memset (or a copy) before a kernel: work on the
    # stream that libvcuda does not see. An end event recorded
    # at the next launch would sit behind that memset and time the whole idle
    # gap: the old pacer charged 60 us a launch here and held the loop to 30%.
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, "gapsmemset", str(5 * US), "200", "1500", str(2 * US))
    launches, slow = int(lines[-1][1]), int(lines[-1][2])
    assert launches == 1500 * 1000 // 200
    assert_not_held_back(slow, launches)
    # The kernel and the memset are 7 us of device time a launch. On a loaded
    # machine the loop falls behind and catches up with launches in a row,
    # which run together; the run that ends such a burst still times the gap
    # up to its next launch's memset: 11-12 us a launch with two other busy
    # processes on this 2-core machine.
    charged = charged_per_launch(gpu, launches)
    assert 5 * US <= charged <= 2 * 7 * US, charged


def test_a_kernel_whose_first_launch_ran_long_is_not_charged_that_long_again(
    gpu: FakeGpu,
) -> None:
    # A driver that loads modules lazily loads a kernel's code in its first
    # launch call, after the start event that times the launch: here that
    # record spans 2 ms. The kernel first runs when the program has long
    # launched on one stream, and it never queues (each launch comes 200 us
    # after the last call returned), so no later record of it need be a
    # sample that lowers an estimate learned from that one (on a GPU some
    # decoding kernels never had one). Learned as an average of its first
    # records, its cost was 1.4 ms once trusted, each of its next launches was
    # charged that much up front, and a loop that uses 2.5% of the device
    # waited for the bucket at 30, 5 times in 1.5 s.
    limited(gpu, 30)
    first_launch_ns = 2000 * US
    result = gpu.run(*LOAD, "gapslate", str(5 * US), "200", "1500", VCUDA_LOG_LEVEL="debug",
                     VCUDA_FAKE_FIRST_LAUNCH_NS=str(first_launch_ns))
    launches, slow = map(int, result.stdout.split()[-2:])
    assert launches >= 0.8 * 1500 * 1000 // 200, launches
    assert_not_held_back(slow, launches)
    assert pacing_tally(result.stderr)[4] == 0, result.stderr
    # Both kernels are trusted at about their own time.
    costs = [int(ns) for ns in re.findall(r"kernel [0-9a-f]{16} costs (\d+) ns", result.stderr)]
    assert len(costs) == 2 and all(ns <= 1.5 * 5 * US for ns in costs), costs
    # Each of the two kernels' first launches is charged its whole record.
    charged = account_gpu_ns(gpu.account)[fake_uuid(0)]
    assert charged <= launches * 1.5 * 5 * US + 2 * first_launch_ns, charged / launches


@pytest.mark.parametrize(("every_us", "waited", "busy"), [(200, False, 2.5), (10, True, 30)])
def test_launch_gaps_on_a_simulated_clock_are_never_charged(
    shim_build: None, every_us: int, waited: bool, busy: float
) -> None:
    # A 5 us kernel every 200 us never waits at 30; every 10 us (50% of the
    # device) it is held to 30.
    words = sim("gaps", 30, 5, every_us, 2)
    assert (int(words[1]) > 0) == waited, words
    assert abs(float(words[3]) - busy) <= 0.5, words


def test_several_threads_on_several_streams_share_one_limit(gpu: FakeGpu) -> None:
    limited(gpu, 60)
    lines = gpu.lines(*LOAD, *load("kernel", 200 * US, 2000, streams=2, threads=3))
    assert abs(share(lines) - 60) <= BAND


def test_the_processes_of_one_container_share_one_budget(gpu: FakeGpu) -> None:
    limited(gpu, 30)
    words = (*LOAD, *load("kernel", 500 * US, 2000))
    first, second = concurrently((gpu, words), (gpu, words))
    shares = share(first), share(second)
    assert abs(sum(shares) - 30) <= BAND, shares
    assert min(shares) >= 5, shares   # neither starves


def test_two_containers_at_30_and_60_each_get_their_share(gpu: FakeGpu, tmp_path: Path) -> None:
    limited(gpu, 30)
    other = FakeGpu(tmp_path / "other")
    other.root.mkdir()
    other.env["VCUDA_FAKE_STATE"] = gpu.env["VCUDA_FAKE_STATE"]
    limited(other, 60)
    words = (*LOAD, *load("kernel", 1 * MS, 2500))
    thirty, sixty = concurrently((gpu, words), (other, words))
    assert abs(share(thirty) - 30) <= BAND
    assert abs(share(sixty) - 60) <= BAND


@pytest.mark.parametrize("api", ["kernel", "graph"])
def test_a_capture_is_neither_paced_nor_recorded_into_and_its_replays_are_paced(
    gpu: FakeGpu, api: str
) -> None:
    limited(gpu, 30)
    # A first load gives the pacing thread events to read while the capture runs
    # in the global mode, where a query from a thread in that mode would break it.
    lines = gpu.lines(*LOAD, *load("kernel", 200 * US, 200), "capture", api, str(200 * US), "10",
                      "sleep", "300", "replay", "2000")
    capture = next(line for line in lines if line[0] == "capture")
    assert capture == ["capture", "CUDA_SUCCESS", "10", "0"]
    assert abs(share(lines, "replay") - 30) <= BAND


def test_launches_ask_the_driver_about_capture_only_while_a_capture_is_open(
    gpu: FakeGpu,
) -> None:
    # Asked at every launch, the capture status was some 60 ns of a decoding
    # loop's launch on an H100: the library asks only while one may be open.
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, *load("kernel", 50 * US, 100), "captureasks",
                      "bgcapture", "relaxed", *load("kernel", 50 * US, 100), "captureasks",
                      "bgend", *load("kernel", 50 * US, 100), "captureasks")
    loads = [line for line in lines if line[0] == "load"]
    asks = [int(line[1]) for line in lines if line[0] == "captureasks"]
    assert ["bgcapture", "CUDA_SUCCESS"] in lines and ["bgend", "CUDA_SUCCESS"] in lines
    assert asks[0] == 0
    # Each launch while another thread's capture is open asks once.
    assert asks[1] >= int(loads[1][2])
    assert asks[2] == asks[1]
    assert all(abs(share([line]) - 30) <= BAND for line in loads[1:])


def test_a_failed_launch_gives_its_charge_back_and_its_error_unchanged(gpu: FakeGpu) -> None:
    limited(gpu, 10)
    lines = gpu.lines(*LOAD, "badlaunch", "5000", *load("kernel", 1 * MS, 1000))
    assert ["badlaunch", "CUDA_ERROR_INVALID_HANDLE"] in lines
    assert abs(share(lines) - 10) <= BAND


@pytest.mark.parametrize("cores", [100, 30])
def test_a_pacing_thread_runs_only_under_a_core_limit(gpu: FakeGpu, cores: int) -> None:
    # Under a limit: the pacing thread and the watch that lets held streams go.
    limited(gpu, cores)
    lines = gpu.lines(*LOAD, *load("kernel", 100 * US, 200), "threads")
    assert lines[-1] == ["threads", "3" if cores < 100 else "1"]


def test_a_forked_child_is_paced_by_its_own_thread_in_the_same_budget(gpu: FakeGpu) -> None:
    limited(gpu, 30)
    lines = gpu.lines(*LOAD, *load("kernel", 200 * US, 100), "fork",
                      "init;ctx 0;module;load kernel 500000 1500 0 1;threads")
    assert abs(share(lines) - 30) <= BAND
    assert ["child", "threads", "3"] in lines
    assert ["fork", "0"] in lines


def test_the_account_shows_the_gpu_time_charged_and_the_log_the_share(gpu: FakeGpu) -> None:
    limited(gpu, 50)
    result = gpu.run(*LOAD, *load("kernel", 1 * MS, 2500), VCUDA_LOG_LEVEL="info")
    launches = int(result.stdout.splitlines()[-1].split()[2])
    charged = account_gpu_ns(gpu.account)[fake_uuid(0)]
    assert abs(charged - launches * MS) <= 0.05 * launches * MS
    assert "of the device's time charged to the container" in result.stderr


def test_at_exit_the_log_tells_how_the_launches_were_timed_waited_and_charged(
    gpu: FakeGpu,
) -> None:
    limited(gpu, 30)
    result = gpu.run(*LOAD, *load("kernel", 1 * MS, 1000), VCUDA_LOG_LEVEL="info")
    launches = int(result.stdout.splitlines()[-1].split()[2])
    paced, alone, in_runs, untimed, waits, waited, up_front = pacing_tally(result.stderr)
    assert paced == launches == alone + in_runs + untimed
    # At 30% of the device, 1 ms kernels back to back keep their host waiting
    # for the bucket nearly all of the load's second (a launch returns at
    # once, the device idles 70%); the last wait may end a few ms past it.
    assert waits > 0 and 0.5 <= waited <= 1.05, (waits, waited)
    # The benchmarks read the same from it.
    assert bucket_waits(result.stderr) == (waits, waited)
    assert up_front > 0
    # Alone on the device, its launches never waited out another process's slice.
    assert slices_found(result.stderr) == (0, 0.0)


def test_a_kernel_every_50_us_using_40_percent_under_60_is_charged_its_own_time(
    gpu: FakeGpu,
) -> None:
    # A loop whose host launches a little slower than the device runs: each
    # kernel finds its stream idle or nearly so. Its idle time is not charged,
    # so at 60 it is never held back.
    limited(gpu, 60)
    lines = gpu.lines(*LOAD, "gaps", str(20 * US), "50", "1500")
    launches, slow = int(lines[-1][1]), int(lines[-1][2])
    charged = charged_per_launch(gpu, launches)
    # The pacer before estimates set the charge charged it 30 us a launch; a
    # loaded machine delays a few events and deschedules a few launches.
    assert charged <= 1.35 * 20 * US, charged
    assert slow <= launches // 50, slow
