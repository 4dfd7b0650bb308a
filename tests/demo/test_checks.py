"""What the demo checks before it starts, and of the webhook's answers."""

from __future__ import annotations

import copy
import shutil

import pytest

from demo import machine
from demo.admission import Review
from demo.pods import SAMPLES
from demo.reviews import unexpected

_BY_NAME = {sample.name: sample for sample in SAMPLES}


def test_as_a_non_root_user_the_check_says_runc_needs_root_and_how_to_run_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.os, "geteuid", lambda: 1000)
    found = machine.check_machine()
    assert "root:              no" in found.facts
    assert any(problem.startswith("not root: runc needs root") and "sudo bash scripts/demo"
               in problem for problem in found.containers_missing)


@pytest.mark.skipif(not shutil.which("runc"), reason="needs a dynamically linked program")
def test_a_dynamically_linked_busybox_is_refused_with_the_package_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "BUSYBOX", shutil.which("runc"))
    problems = machine.check_machine().containers_missing
    assert any("is dynamically linked" in p and "busybox-static" in p for p in problems)


def test_a_webhook_that_admits_the_invalid_pod_fails_the_review_step() -> None:
    sample = _BY_NAME["invalid-request"]
    review = Review(allowed=True, message="", warnings=(), patch=[], pod=sample.pod)
    assert unexpected(sample, review) == "admitted, expected the opposite"


def test_a_webhook_that_leaves_the_forged_annotation_fails_the_review_step() -> None:
    sample = _BY_NAME["forged-limits"]
    pod = copy.deepcopy(sample.pod)
    pod["spec"]["runtimeClassName"] = "vcuda"
    review = Review(allowed=True, message="", warnings=(), patch=[], pod=pod)
    assert unexpected(sample, review).startswith(
        "vcuda.io/limits is {'app': {'cores': 99, 'memory': 85899345920}}, expected")


def test_a_webhook_that_gives_a_shared_pod_a_whole_gpu_fails_the_review_step() -> None:
    sample = _BY_NAME["shared-notebook"]
    pod = copy.deepcopy(sample.pod)
    pod["metadata"]["annotations"] = {
        "vcuda.io/limits": '{"notebook":{"cores":30,"memory":10737418240}}'}
    pod["spec"]["runtimeClassName"] = "vcuda"
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    review = Review(allowed=True, message="", warnings=(), patch=[], pod=pod)
    assert unexpected(sample, review) == (
        "notebook's limits have nvidia.com/gpu.shared: None, expected 1")
