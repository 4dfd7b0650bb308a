"""Every container that shares a GPU keeps a seccomp profile that refuses user namespaces."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhook.builders import container, pod, shared
from tests.webhook.test_policy import create, denial, patched
from webhook.config import Config

RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def _with_pod_profile(obj: dict[str, Any], profile: dict[str, str]) -> dict[str, Any]:
    obj["spec"]["securityContext"] = {"seccompProfile": profile}
    return obj


def test_a_limited_container_without_a_profile_gets_runtime_default() -> None:
    result = patched(pod(shared("train"), container("sidecar")))
    train, sidecar = result["spec"]["containers"]
    assert train["securityContext"] == {"seccompProfile": RUNTIME_DEFAULT}
    assert "securityContext" not in sidecar  # it shares no GPU: not vcuda's to change


def test_a_security_context_of_its_own_keeps_its_fields_and_gains_the_profile() -> None:
    obj = pod(shared("train", security_context={"runAsUser": 1000}))
    context = patched(obj)["spec"]["containers"][0]["securityContext"]
    assert context == {"runAsUser": 1000, "seccompProfile": RUNTIME_DEFAULT}


def test_init_containers_that_share_a_gpu_get_the_profile_too() -> None:
    result = patched(pod(container("main"), init=(shared("warmup"),)))
    assert result["spec"]["initContainers"][0]["securityContext"] == {
        "seccompProfile": RUNTIME_DEFAULT}


@pytest.mark.parametrize("profile", [RUNTIME_DEFAULT, {"type": "Localhost",
                                                       "localhostProfile": "profiles/gpu.json"}])
def test_a_profile_that_holds_is_left_as_written(profile: dict[str, str]) -> None:
    config = Config(trusted_seccomp_profiles=("profiles/gpu.json",))
    obj = pod(shared("train", security_context={"seccompProfile": profile}))
    assert patched(obj, config)["spec"]["containers"][0]["securityContext"] == {
        "seccompProfile": profile}
    on_pod = _with_pod_profile(pod(shared("train")), profile)
    assert "securityContext" not in patched(on_pod, config)["spec"]["containers"][0]


def test_the_webhook_output_is_left_unchanged_by_a_second_pass() -> None:
    once = patched(pod(shared("train")))
    assert create(once).patch == ()


def test_unconfined_on_the_container_is_denied_with_the_fix() -> None:
    obj = pod(shared("train", security_context={"seccompProfile": {"type": "Unconfined"}}))
    assert denial(obj) == (
        'container "train" shares a GPU, and its seccompProfile Unconfined lets it create a user '
        "namespace, from which it could drop its limits; remove it, and vcuda sets "
        "RuntimeDefault, which refuses them")


def test_unconfined_on_the_pod_is_denied_for_its_limited_containers() -> None:
    obj = _with_pod_profile(pod(shared("train")), {"type": "Unconfined"})
    assert denial(obj) == (
        'container "train" shares a GPU, and the pod\'s seccompProfile Unconfined lets it create '
        "a user namespace, from which it could drop its limits; give the container "
        "seccompProfile type RuntimeDefault, which refuses them")


def test_the_containers_own_runtime_default_wins_over_the_pods_unconfined() -> None:
    obj = _with_pod_profile(
        pod(shared("train", security_context={"seccompProfile": RUNTIME_DEFAULT})),
        {"type": "Unconfined"})
    assert create(obj).allowed


def test_a_localhost_profile_the_cluster_does_not_trust_is_denied() -> None:
    profile = {"type": "Localhost", "localhostProfile": "profiles/mine.json"}
    obj = pod(shared("train", security_context={"seccompProfile": profile}))
    assert denial(obj, Config(trusted_seccomp_profiles=("profiles/gpu.json",))) == (
        'container "train" shares a GPU, and its seccompProfile Localhost \'profiles/mine.json\' '
        "is not one that this cluster trusts to refuse user namespaces (trusted: "
        "profiles/gpu.json); remove it, and vcuda sets RuntimeDefault, which refuses them, or "
        "have the administrator add the profile to trusted_seccomp_profiles in vcuda's "
        "configuration")
    assert "(trusted: none)" in denial(obj)


def test_whole_gpu_containers_are_not_given_a_profile() -> None:
    result = patched(pod(shared("train", cores="100")))
    assert "securityContext" not in result["spec"]["containers"][0]
