"""Decisions remembered by what they were decided on: the same answer as deciding again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.webhook.builders import as_pod, container, pod, shared
from tests.webhook.test_admission import ODD_VALUES, REVIEW, paths, replaced
from webhook.admission import admit
from webhook.config import Config
from webhook.policy import decide
from webhook.remembered import KEY_BYTES, RememberedDecisions

CONFIG = Config()


def test_replicas_of_one_template_are_decided_once() -> None:
    decisions = RememberedDecisions()
    first = as_pod(pod(shared("train"), name="trainer-a"))
    second = as_pod(pod(shared("train"), name="trainer-b"))
    decision = decisions.decide(first, "CREATE", None, CONFIG)
    assert decision.patch
    assert decisions.decide(second, "CREATE", None, CONFIG) is decision
    assert len(decisions) == 1


@pytest.mark.parametrize("other", [
    pod(shared("train", cores="31")),
    pod(shared("train", memory="41")),
    pod(shared("trains")),
    pod(shared("train", security_context={"privileged": True})),
    pod(shared("train"), annotations={"vcuda.io/limits": "{}"}),
    pod(shared("train"), runtime_class="nvidia"),
    pod(shared("train"), container("side")),
    pod(container("train"), init=(shared("train"),)),
], ids=["cores", "memory", "name", "privileged", "annotation", "runtime-class", "sidecar",
        "init"])
def test_a_pod_that_differs_in_a_field_read_is_decided_anew(other: dict[str, object]) -> None:
    decisions = RememberedDecisions()
    decisions.decide(as_pod(pod(shared("train"))), "CREATE", None, CONFIG)
    assert decisions.decide(as_pod(other), "CREATE", None, CONFIG) == \
        decide(as_pod(other), "CREATE", None, CONFIG)
    assert len(decisions) == 2


def test_new_settings_forget_what_was_decided_under_the_old() -> None:
    decisions = RememberedDecisions()
    asked = as_pod(pod(shared("train", memory="40")))
    assert decisions.decide(asked, "CREATE", None, CONFIG).allowed
    smaller = replace(CONFIG, max_gpu_memory=8 << 30)
    denied = decisions.decide(asked, "CREATE", None, smaller)
    assert not denied.allowed
    assert "more than the largest GPU (8 GiB)" in denied.message
    assert len(decisions) == 1


def test_the_oldest_decision_goes_first_when_full() -> None:
    decisions = RememberedDecisions(entries=2)
    pods = [as_pod(pod(shared("train", cores=str(cores)))) for cores in (10, 20, 30)]
    remembered = [decisions.decide(p, "CREATE", None, CONFIG) for p in pods]
    assert len(decisions) == 2
    assert decisions.decide(pods[2], "CREATE", None, CONFIG) is remembered[2]
    assert decisions.decide(pods[0], "CREATE", None, CONFIG) is not remembered[0]


def test_a_pod_too_large_to_remember_is_decided_every_time() -> None:
    decisions = RememberedDecisions()
    large = as_pod(pod(shared("train"), annotations={"note": "x" * KEY_BYTES}))
    first = decisions.decide(large, "CREATE", None, CONFIG)
    assert decisions.decide(large, "CREATE", None, CONFIG) == first
    assert len(decisions) == 0


def test_updates_are_decided_against_the_stored_pod_every_time() -> None:
    decisions = RememberedDecisions()
    stored = as_pod(pod(shared("train"), annotations={"vcuda.io/limits": "{}"}))
    changed = as_pod(pod(shared("train"), annotations={"vcuda.io/limits": '{"a":1}'}))
    assert decisions.decide(stored, "UPDATE", stored, CONFIG).allowed
    assert not decisions.decide(changed, "UPDATE", stored, CONFIG).allowed
    assert len(decisions) == 0


def test_every_variation_of_a_review_is_answered_as_without_memory() -> None:
    """One memory across every odd value anywhere in a review: no answer comes from another."""
    decisions = RememberedDecisions()
    for path in paths(REVIEW):
        for value in ODD_VALUES:
            body = json.dumps(replaced(REVIEW, path, value)).encode()
            assert admit(body, CONFIG, decisions.decide).body == admit(body, CONFIG).body
    assert len(decisions) > 1
