"""The demo's step runner: one line per step, failures counted, interrupts passed through."""

from __future__ import annotations

import io

import pytest

from demo.steps import Done, Runner, StepFailed, StepSkipped


def _runner() -> tuple[Runner, io.StringIO]:
    out = io.StringIO()
    return Runner(out), out


def test_a_step_that_works_prints_ok_its_number_title_summary_and_details() -> None:
    runner, out = _runner()
    assert runner.run("say hello", lambda: Done("said it", ["line one", "line two"]))
    assert out.getvalue().splitlines() == [
        "ok       1. say hello: said it",
        "            line one",
        "            line two",
    ]
    assert runner.failed == 0


def test_a_failing_step_is_counted_and_shows_what_happened() -> None:
    runner, out = _runner()

    def fail() -> Done:
        raise StepFailed("the webhook said no", ["because"])

    assert not runner.run("ask", fail)
    assert out.getvalue().splitlines() == ["FAILED   1. ask: the webhook said no",
                                           "            because"]
    assert runner.failed == 1


def test_an_unexpected_exception_fails_the_step_and_names_the_demo_line_it_came_through() -> None:
    runner, out = _runner()

    def broken() -> Done:
        return Done({}["missing"])

    assert not runner.run("look up", broken)
    first, where = out.getvalue().splitlines()
    assert first == "FAILED   1. look up: unexpected KeyError: 'missing'"
    assert "test_steps.py" in where and "in broken" in where
    assert runner.failed == 1


def test_skipped_steps_do_not_count_as_failures() -> None:
    runner, out = _runner()

    def no_gpu() -> Done:
        raise StepSkipped("no NVIDIA GPU here")

    assert runner.run("use the GPU", no_gpu)
    runner.skip("later", "not run: see step 1")
    assert out.getvalue().splitlines() == ["skipped  1. use the GPU: no NVIDIA GPU here",
                                           "skipped  2. later: not run: see step 1"]
    assert runner.failed == 0
    assert runner.tally() == "2 steps: 0 ok, 0 failed, 2 skipped"


def test_ctrl_c_inside_a_step_is_not_swallowed() -> None:
    runner, _ = _runner()

    def interrupted() -> Done:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run("wait", interrupted)
