"""The admission policy, called directly: every rule of a vcuda request."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest

from runtime_hook.contract import ASSIGNMENT_ANNOTATION, LIMITS_ANNOTATION
from tests.webhook.builders import as_pod, container, pod, shared
from webhook.config import Config
from webhook.policy import Decision, decide

GIB = 1 << 30
DEFAULT = Config()


def create(obj: dict[str, Any], config: Config = DEFAULT) -> Decision:
    return decide(as_pod(obj), "CREATE", None, config)


def patched(obj: dict[str, Any], config: Config = DEFAULT) -> dict[str, Any]:
    """The pod after the webhook's patch, applied as the API server applies it."""
    decision = create(obj, config)
    assert decision.allowed, decision.message
    return jsonpatch.apply_patch(obj, list(decision.patch))


def limits_annotation(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(obj["metadata"]["annotations"][LIMITS_ANNOTATION])


def denial(obj: dict[str, Any], config: Config = DEFAULT) -> str:
    decision = create(obj, config)
    assert not decision.allowed
    assert decision.patch == ()
    return decision.message


# --- shared mode -----------------------------------------------------------------------------

def test_shared_container_gets_the_shared_resource_the_annotation_and_the_runtime_class() -> None:
    result = patched(pod(shared("train", cores="30", memory="40")))
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu.shared"] == "1"
    assert limits["docker.com/vcuda-core"] == "30"  # left for the scheduler
    assert limits_annotation(result) == {"train": {"cores": 30, "memory": 40 * 256 << 20}}
    assert result["spec"]["runtimeClassName"] == "vcuda"


def test_patch_escapes_slashes_in_resource_and_annotation_names() -> None:
    decision = create(pod(shared("train"), annotations={"team": "vision"}))
    paths = [op["path"] for op in decision.patch]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared" in paths
    assert "/metadata/annotations/vcuda.io~1limits" in paths


def test_pod_without_annotations_gets_the_annotations_object_added() -> None:
    decision = create(pod(shared("train")))
    (op,) = [op for op in decision.patch if op["path"].startswith("/metadata")]
    assert op == {"op": "add", "path": "/metadata/annotations",
                  "value": {LIMITS_ANNOTATION: '{"train":{"cores":30,"memory":10737418240}}'}}


def test_other_annotations_and_fields_are_left_alone() -> None:
    original = pod(shared("train"), container("sidecar", limits={"cpu": "100m"}),
                   annotations={"team": "vision"})
    result = patched(original)
    assert result["metadata"]["annotations"]["team"] == "vision"
    assert result["spec"]["containers"][1] == original["spec"]["containers"][1]
    assert result["metadata"]["labels"] == original["metadata"]["labels"]


def test_init_containers_in_shared_mode_get_their_own_entry() -> None:
    result = patched(pod(shared("train", cores="50", memory="8"),
                         init=(shared("warmup", cores="10", memory="4"),)))
    assert limits_annotation(result) == {"train": {"cores": 50, "memory": 2 * GIB},
                                         "warmup": {"cores": 10, "memory": GIB}}
    init_limits = result["spec"]["initContainers"][0]["resources"]["limits"]
    assert init_limits["nvidia.com/gpu.shared"] == "1"


def test_tencent_domain_is_accepted_and_written_as_the_one_domain_vcuda_accounts() -> None:
    asked = pod(shared("train", domain="tencent.com", requests={"tencent.com/vcuda-core": "30"}))
    result = patched(asked)
    assert limits_annotation(result) == {"train": {"cores": 30, "memory": 10 * GIB}}
    resources = result["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "1", "docker.com/vcuda-core": "30",
                                   "docker.com/vcuda-memory": "40", "nvidia.com/gpu.shared": "1"}
    assert resources["requests"] == {"docker.com/vcuda-core": "30", "nvidia.com/gpu.shared": "1"}
    assert create(asked).warnings == ("container \"train\": tencent.com/vcuda-core and "
                                      "tencent.com/vcuda-memory were written as "
                                      "docker.com/vcuda-core and docker.com/vcuda-memory, the "
                                      "names vcuda accounts",)
    assert create(result) == Decision(allowed=True)  # a second pass changes nothing


def test_configured_domains_replace_the_defaults() -> None:
    config = Config(domains=("example.org",))
    assert create(pod(shared("train")), config) == Decision(allowed=True)  # docker.com ignored
    result = patched(pod(shared("train", domain="example.org")), config)
    assert limits_annotation(result)["train"]["cores"] == 30


def test_configured_backend_and_runtime_class_are_written() -> None:
    config = Config(shared_resource="example.com/shared-gpu", runtime_class="gpu-limited")
    result = patched(pod(shared("train")), config)
    assert result["spec"]["containers"][0]["resources"]["limits"]["example.com/shared-gpu"] == "1"
    assert result["spec"]["runtimeClassName"] == "gpu-limited"


@pytest.mark.parametrize(("cores", "memory"), [(1, 1), (99, 320), ("30", 40), (30, "40")])
def test_every_share_from_1_to_99_with_memory_is_allowed(cores: Any, memory: Any) -> None:
    result = patched(pod(shared("train", cores=cores, memory=memory)))
    assert limits_annotation(result)["train"] == {"cores": int(cores),
                                                  "memory": int(memory) * 256 << 20}


# --- exclusive mode --------------------------------------------------------------------------

@pytest.mark.parametrize(("cores", "gpus"), [("100", "1"), ("200", "2"), ("1k", "10")])
def test_multiples_of_100_get_whole_gpus_and_no_annotation(cores: str, gpus: str) -> None:
    result = patched(pod(container("train", limits={"docker.com/vcuda-core": cores})))
    assert result["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert "annotations" not in result["metadata"]
    assert "runtimeClassName" not in result["spec"]


def test_memory_with_whole_gpus_is_ignored_with_a_warning() -> None:
    decision = create(pod(shared("train", cores="100", memory="40")))
    assert decision.allowed
    assert decision.warnings == ('container "train": docker.com/vcuda-memory is ignored with '
                                 "whole GPUs (docker.com/vcuda-core: 100)",)


def test_mixed_pod_annotates_only_its_shared_containers() -> None:
    result = patched(pod(shared("small"), container("big", limits={"docker.com/vcuda-core": 100})))
    assert limits_annotation(result) == {"small": {"cores": 30, "memory": 10 * GIB}}
    assert result["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert result["spec"]["runtimeClassName"] == "vcuda"


# --- requests that are denied, each with what to write instead ------------------------------

@pytest.mark.parametrize("cores", ["0", "150", "101", "-30", 0])
def test_cores_neither_a_share_nor_whole_gpus_are_denied(cores: Any) -> None:
    message = denial(pod(shared("train", cores=cores)))
    assert f'container "train": docker.com/vcuda-core: {int(cores)} is neither' in message
    assert "share of one GPU (1..99)" in message
    assert "whole GPUs (100, 200, ...)" in message


@pytest.mark.parametrize("cores", ["500m", "30.5", "abc", "1e", 2.5])
def test_cores_that_are_not_whole_numbers_are_denied(cores: Any) -> None:
    message = denial(pod(shared("train", cores=cores)))
    assert "docker.com/vcuda-core" in message
    assert "write a whole number" in message


def test_memory_alone_is_denied() -> None:
    message = denial(pod(container("train", limits={"docker.com/vcuda-memory": "40"})))
    assert message == ('container "train": docker.com/vcuda-memory needs docker.com/vcuda-core; '
                       "add docker.com/vcuda-core: 1..99 to share one GPU, or "
                       "docker.com/vcuda-core: 100 for a whole GPU")


def test_a_share_without_memory_is_denied() -> None:
    message = denial(pod(container("train", limits={"docker.com/vcuda-core": "30"})))
    assert "docker.com/vcuda-memory is required" in message
    assert "units of 256 MiB (40 = 10 GiB)" in message


@pytest.mark.parametrize("memory", ["0", "-4"])
def test_memory_below_one_unit_is_denied(memory: str) -> None:
    assert "must be at least 1 (256 MiB)" in denial(pod(shared("train", memory=memory)))


@pytest.mark.parametrize(("memory", "units", "size"), [
    ("10Gi", 40, "10 GiB"), ("8G", 29, "7.25 GiB"), ("100Mi", 1, "0.25 GiB")])
def test_memory_written_as_bytes_is_denied_with_the_unit_explained(
    memory: str, units: int, size: str
) -> None:
    message = denial(pod(shared("train", memory=memory)))
    assert message == (f'container "train": docker.com/vcuda-memory: {memory} is a byte size, '
                       "but docker.com/vcuda-memory counts units of 256 MiB; write "
                       f"docker.com/vcuda-memory: {units} for {size}")


def test_memory_beyond_the_largest_gpu_is_denied_with_the_largest_allowed() -> None:
    message = denial(pod(shared("train", memory="321")))
    assert message == ('container "train": docker.com/vcuda-memory: 321 (80.25 GiB) is more than '
                       "the largest GPU (80 GiB); write at most 320")


def test_the_largest_gpu_is_configurable() -> None:
    config = Config(max_gpu_memory=141 * GIB)
    assert create(pod(shared("train", memory="564")), config).allowed
    assert "write at most 564" in denial(pod(shared("train", memory="565")), config)


def test_one_container_may_not_mix_two_domains() -> None:
    mixed = container("train", limits={"docker.com/vcuda-core": "30",
                                       "tencent.com/vcuda-memory": "40"})
    assert "mixes vcuda resources of docker.com and tencent.com" in denial(pod(mixed))


def test_every_problem_of_a_pod_is_reported_at_once() -> None:
    message = denial(pod(shared("a", cores="150"), shared("b", memory="0")))
    assert 'container "a"' in message and 'container "b"' in message


def test_two_shared_containers_with_one_name_are_denied() -> None:
    message = denial(pod(shared("train"), init=(shared("train"),)))
    assert 'the name "train" is used by two containers' in message


def test_a_container_without_a_name_is_denied() -> None:
    assert "without a name" in denial(pod(shared("")))


# --- requests must equal limits --------------------------------------------------------------

def test_requests_equal_to_limits_are_allowed_and_get_the_resource_too() -> None:
    limits = {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40"}
    result = patched(pod(container("train", limits=limits, requests=dict(limits))))
    resources = result["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu.shared"] == "1"
    assert resources["limits"]["nvidia.com/gpu.shared"] == "1"


def test_requests_that_differ_from_limits_are_denied() -> None:
    limits = {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40"}
    requests = {"docker.com/vcuda-core": "20", "docker.com/vcuda-memory": "40"}
    message = denial(pod(container("train", limits=limits, requests=requests)))
    assert "requests docker.com/vcuda-core (20) differs from limits (30)" in message
    assert "remove it from requests or make it equal" in message


def test_requests_without_limits_are_denied() -> None:
    requests = {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40"}
    message = denial(pod(container("train", requests=requests)))
    assert "docker.com/vcuda-core is in requests but not in limits" in message
    assert "move it to resources.limits" in message


# --- the device-plugin resources -------------------------------------------------------------

def test_asking_for_the_shared_resource_directly_is_denied() -> None:
    message = denial(pod(container("train", limits={"nvidia.com/gpu.shared": "1"})))
    assert message == ('container "train" asks for nvidia.com/gpu.shared directly, which would '
                       "give it a shared GPU without limits; ask for docker.com/vcuda-core: 1..99 "
                       "and docker.com/vcuda-memory: N (units of 256 MiB) instead")


_PLACEMENT = Config(shared_resource="vcuda.io/shared-gpu", exclusive_resource="vcuda.io/gpu")


@pytest.mark.parametrize("config", [DEFAULT, _PLACEMENT], ids=["nvidia", "placement"])
@pytest.mark.parametrize("resource", ["nvidia.com/gpu.shared", "vcuda.io/shared-gpu"])
@pytest.mark.parametrize("where", ["limits", "requests", "sidecar"])
def test_every_shared_gpu_resource_asked_for_directly_is_denied_whatever_the_configuration(
        config: Config, resource: str, where: str) -> None:
    asking = container("train", **{"requests" if where == "requests" else "limits":
                                   {resource: "1"}})
    containers = (shared("limited"), asking) if where == "sidecar" else (asking,)
    assert f'container "train" asks for {resource} directly, which would give it a shared ' \
           "GPU without limits" in denial(pod(*containers), config)


def test_a_share_that_also_asks_for_another_paths_shared_gpu_is_denied() -> None:
    both = shared("train")
    both["resources"]["limits"]["vcuda.io/shared-gpu"] = "1"
    assert denial(pod(both)) == (
        'container "train" asks for docker.com/vcuda-core and for vcuda.io/shared-gpu as well, '
        "a shared GPU that vcuda does not give here and would not limit; remove "
        "vcuda.io/shared-gpu")


def test_whole_gpus_asked_for_directly_are_left_alone() -> None:
    assert create(pod(container("train", limits={"nvidia.com/gpu": "1"}))) == Decision(True)


def test_a_share_that_also_asks_for_whole_gpus_is_denied() -> None:
    both = shared("train")
    both["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert "limits has nvidia.com/gpu, which does not go with" in denial(pod(both))


def test_a_backend_count_that_disagrees_with_the_cores_is_denied() -> None:
    wrong = container("train", limits={"docker.com/vcuda-core": "200", "nvidia.com/gpu": "1"})
    assert "limits nvidia.com/gpu: 1 disagrees with docker.com/vcuda-core" in denial(pod(wrong))


# --- security --------------------------------------------------------------------------------

def test_a_privileged_container_may_not_share_a_gpu() -> None:
    message = denial(pod(shared("train", security_context={"privileged": True})))
    assert message == ('container "train" is privileged and shares a GPU, which would let it lift '
                       "its own limits; drop that from securityContext, or ask for whole GPUs "
                       "(docker.com/vcuda-core: 100)")


@pytest.mark.parametrize("capability", ["SYS_ADMIN", "CAP_SYS_ADMIN", "ALL", "sys_admin"])
def test_a_container_that_adds_sys_admin_may_not_share_a_gpu(capability: str) -> None:
    context = {"capabilities": {"add": ["NET_BIND_SERVICE", capability]}}
    assert f"adds capability {capability}" in denial(pod(shared("train",
                                                                security_context=context)))


def test_a_privileged_container_may_have_whole_gpus() -> None:
    privileged = container("train", limits={"docker.com/vcuda-core": "100"},
                           security_context={"privileged": True})
    assert create(pod(privileged)).allowed


def test_a_hand_written_annotation_is_replaced_on_create() -> None:
    forged = '{"train":{"cores":99,"memory":85899345920}}'
    decision = create(pod(shared("train"), annotations={LIMITS_ANNOTATION: forged}))
    assert {"op": "replace", "path": "/metadata/annotations/vcuda.io~1limits",
            "value": '{"train":{"cores":30,"memory":10737418240}}'} in decision.patch
    assert decision.warnings == (f"{LIMITS_ANNOTATION} was replaced: only vcuda writes it",)


def test_a_hand_written_annotation_on_a_pod_without_shares_is_removed() -> None:
    forged = {LIMITS_ANNOTATION: '{"train":{"cores":99,"memory":1}}', "team": "vision"}
    decision = create(pod(container("train"), annotations=forged))
    assert decision.patch == ({"op": "remove", "path": "/metadata/annotations/vcuda.io~1limits"},)
    assert "was removed" in decision.warnings[0]


def test_another_runtime_class_is_replaced_with_a_warning() -> None:
    decision = create(pod(shared("train"), runtime_class="nvidia"))
    assert {"op": "replace", "path": "/spec/runtimeClassName", "value": "vcuda"} in decision.patch
    assert decision.warnings == ("runtimeClassName nvidia was replaced by vcuda, which shared "
                                 "GPUs need",)


# --- placement: the assignment annotation and the scheduler -----------------------------------

PLACEMENT = Config(shared_resource="vcuda.io/shared-gpu", exclusive_resource="vcuda.io/gpu",
                   scheduler_name="vcuda-scheduler")
FORGED = '{"shared": ["GPU-of-my-choice", 30, 1]}'


def test_a_pod_created_with_an_assignment_of_its_own_loses_it_with_a_warning() -> None:
    decision = create(pod(shared("train"), annotations={ASSIGNMENT_ANNOTATION: FORGED}))
    result = jsonpatch.apply_patch(pod(shared("train"), annotations={
        ASSIGNMENT_ANNOTATION: FORGED}), list(decision.patch))
    assert ASSIGNMENT_ANNOTATION not in result["metadata"]["annotations"]
    assert limits_annotation(result) == {"train": {"cores": 30, "memory": 10 * GIB}}
    assert f"{ASSIGNMENT_ANNOTATION} was removed: only vcuda's scheduler writes it, when it " \
           "binds the pod" in decision.warnings


def test_a_pod_without_gpus_that_forges_an_assignment_loses_it_too() -> None:
    result = patched(pod(container("web"), annotations={ASSIGNMENT_ANNOTATION: FORGED}))
    assert result["metadata"]["annotations"] == {}


def test_an_update_that_writes_an_assignment_is_denied() -> None:
    stored = patched(pod(shared("train")))
    forged = json.loads(json.dumps(stored))
    forged["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = FORGED
    decision = update(forged, stored)
    assert not decision.allowed
    assert decision.message == (f"{ASSIGNMENT_ANNOTATION} is written by vcuda's scheduler when "
                                "it binds the pod, and by nothing else; keep it as it was "
                                "(absent)")


def test_with_a_scheduler_configured_gpu_pods_get_it_and_others_do_not() -> None:
    assert patched(pod(shared("train")), PLACEMENT)["spec"]["schedulerName"] == "vcuda-scheduler"
    whole = patched(pod(shared("train", cores="200")), PLACEMENT)
    assert whole["spec"]["schedulerName"] == "vcuda-scheduler"
    assert whole["spec"]["containers"][0]["resources"]["limits"]["vcuda.io/gpu"] == "2"
    assert "schedulerName" not in patched(pod(container("web")), PLACEMENT)["spec"]
    assert "schedulerName" not in patched(pod(shared("train")))["spec"]


def test_another_scheduler_is_replaced_with_a_warning() -> None:
    obj = pod(shared("train"))
    obj["spec"]["schedulerName"] = "my-scheduler"
    decision = create(obj, PLACEMENT)
    assert {"op": "replace", "path": "/spec/schedulerName",
            "value": "vcuda-scheduler"} in decision.patch
    assert "schedulerName my-scheduler was replaced by vcuda-scheduler, which places vcuda " \
           "pods on a GPU that can hold them" in decision.warnings


# --- update ----------------------------------------------------------------------------------

def update(new: dict[str, Any], old: dict[str, Any]) -> Decision:
    return decide(as_pod(new), "UPDATE", as_pod(old), DEFAULT)


def test_an_update_that_changes_the_annotation_is_denied() -> None:
    stored = patched(pod(shared("train")))
    changed = json.loads(json.dumps(stored))
    changed["metadata"]["annotations"][LIMITS_ANNOTATION] = '{"train":{"cores":99,"memory":1}}'
    decision = update(changed, stored)
    assert not decision.allowed
    assert "vcuda.io/limits is written by vcuda when the pod is created" in decision.message
    assert "create a new pod" in decision.message


def test_an_update_that_removes_or_adds_the_annotation_is_denied() -> None:
    stored = patched(pod(shared("train")))
    bare = json.loads(json.dumps(stored))
    del bare["metadata"]["annotations"]
    assert not update(bare, stored).allowed
    assert not update(stored, bare).allowed


def test_an_update_that_keeps_the_annotation_is_allowed_unchanged() -> None:
    stored = patched(pod(shared("train")))
    relabelled = json.loads(json.dumps(stored))
    relabelled["metadata"]["labels"]["stage"] = "done"
    assert update(relabelled, stored) == Decision(allowed=True)


def test_an_update_of_a_pod_from_before_the_webhook_is_not_patched() -> None:
    old = pod(shared("train"))
    assert update(old, old) == Decision(allowed=True)


def test_an_update_without_the_stored_pod_is_denied() -> None:
    decision = decide(as_pod(pod(shared("train"))), "UPDATE", None, DEFAULT)
    assert "request.oldObject" in decision.message


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_are_allowed_without_review(operation: str) -> None:
    assert decide(None, operation, None, DEFAULT) == Decision(allowed=True)


def test_an_unknown_operation_is_denied() -> None:
    assert "unknown operation 'PATCH'" in decide(None, "PATCH", None, DEFAULT).message


def test_a_create_without_a_pod_is_denied() -> None:
    assert "request.object is missing" in decide(None, "CREATE", None, DEFAULT).message


# --- idempotence -----------------------------------------------------------------------------

@pytest.mark.parametrize("original", [
    pod(shared("train")),
    pod(shared("train"), annotations={"team": "vision"}, runtime_class="nvidia"),
    pod(shared("a"), container("b", limits={"docker.com/vcuda-core": "200"}),
        init=(shared("c", cores="5", memory="1"),)),
    pod(container("train", limits={"docker.com/vcuda-core": "30",
                                   "docker.com/vcuda-memory": "40"},
                  requests={"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40"})),
    pod(container("train"), annotations={LIMITS_ANNOTATION: "{}"}),
    pod(container("tp", limits={"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "16",
                                "docker.com/vcuda-gpus": "2"},
                  requests={"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "16",
                            "docker.com/vcuda-gpus": "2"})),
    pod(container("tp", limits={"volcano.sh/vgpu-number": "3", "volcano.sh/vgpu-memory": "1024",
                                "volcano.sh/vgpu-cores": "20"})),
], ids=["shared", "annotated", "mixed", "requests", "forged", "several-gpus", "volcano"])
def test_reviewing_the_webhooks_own_output_changes_nothing(original: dict[str, Any]) -> None:
    once = patched(original)
    again = create(once)
    assert again.allowed
    assert again.patch == ()


def test_a_pod_without_gpus_gets_no_patch() -> None:
    plain = pod(container("web", limits={"cpu": "1", "memory": "1Gi"}), container("bare"))
    assert create(plain) == Decision(allowed=True)


# --- shares of several GPUs, and Volcano's and HAMi's names ----------------------------------

def multi(name: str = "tp", gpus: Any = "2", cores: Any = "50", memory: Any = "12",
          **extra: Any) -> dict[str, Any]:
    limits = {"docker.com/vcuda-core": cores, "docker.com/vcuda-memory": memory,
              "docker.com/vcuda-gpus": gpus, **extra}
    return container(name, limits=limits)


def test_vcuda_gpus_asks_for_that_many_shares_each_with_the_per_gpu_limits() -> None:
    result = patched(pod(multi()))
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu.shared"] == "2"
    assert "docker.com/vcuda-gpus" not in limits  # no node advertises it: the annotation has it
    assert limits_annotation(result) == {"tp": {"cores": 50, "memory": 12 * 256 << 20,
                                                "gpus": 2}}


def test_vcuda_gpus_of_one_writes_the_single_gpu_entry() -> None:
    result = patched(pod(multi(gpus="1")))
    assert limits_annotation(result) == {"tp": {"cores": 50, "memory": 12 * 256 << 20}}


def test_vcuda_gpus_in_requests_too_is_removed_from_both() -> None:
    spec = multi()
    spec["resources"]["requests"] = {"docker.com/vcuda-gpus": "2"}
    result = patched(pod(spec))
    assert "docker.com/vcuda-gpus" not in result["spec"]["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize(("gpus", "message"), [
    ("0", 'container "tp": docker.com/vcuda-gpus: 0 must be 1..16 (distinct GPUs, each with '
          "the vcuda-core and vcuda-memory given)"),
    ("17", 'container "tp": docker.com/vcuda-gpus: 17 must be 1..16 (distinct GPUs, each with '
           "the vcuda-core and vcuda-memory given)"),
])
def test_vcuda_gpus_out_of_range_is_denied(gpus: str, message: str) -> None:
    assert denial(pod(multi(gpus=gpus))) == message


def test_vcuda_gpus_that_is_no_whole_number_is_denied() -> None:
    assert denial(pod(multi(gpus="1.5"))).startswith('container "tp": docker.com/vcuda-gpus: ')


def test_vcuda_gpus_with_whole_gpus_is_denied() -> None:
    assert denial(pod(multi(cores="200"))) == (
        'container "tp": docker.com/vcuda-gpus goes with a share of each GPU '
        "(docker.com/vcuda-core: 1..99); for whole GPUs write docker.com/vcuda-core: 100 per "
        "GPU and no docker.com/vcuda-gpus")


def test_vcuda_gpus_alone_is_denied_for_want_of_vcuda_core() -> None:
    spec = container("tp", limits={"docker.com/vcuda-gpus": "2"})
    assert "docker.com/vcuda-memory needs docker.com/vcuda-core" in denial(pod(spec))


def test_vcuda_gpus_requested_unlike_its_limit_is_denied() -> None:
    spec = multi()
    spec["resources"]["requests"] = {"docker.com/vcuda-gpus": "3"}
    assert denial(pod(spec)) == (
        'container "tp": requests docker.com/vcuda-gpus (3) differs from limits (2); vcuda '
        "needs only limits: remove it from requests or make it equal")


def volcano(number: Any = "2", memory: Any = "3000", cores: Any = "50") -> dict[str, Any]:
    limits = {"cpu": "1"}
    for key, value in (("volcano.sh/vgpu-number", number), ("volcano.sh/vgpu-memory", memory),
                       ("volcano.sh/vgpu-cores", cores)):
        if value is not None:
            limits[key] = value
    return container("tp", limits=limits)


def test_volcano_names_are_read_as_vcuda_per_gpu_with_memory_rounded_up() -> None:
    decision = create(pod(volcano()))
    assert decision.allowed
    assert decision.warnings == (
        'container "tp": Volcano\'s names were read as docker.com/vcuda-core: 50, '
        "docker.com/vcuda-memory: 12, docker.com/vcuda-gpus: 2",
        'container "tp": 3000 MiB was rounded up to 3072 MiB, vcuda\'s memory counts units of '
        "256 MiB")
    result = patched(pod(volcano()))
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "1", "docker.com/vcuda-core": "50", "docker.com/vcuda-memory": "12",
                      "nvidia.com/gpu.shared": "2"}
    assert limits_annotation(result) == {"tp": {"cores": 50, "memory": 3 * GIB, "gpus": 2}}


def test_volcano_one_vgpu_without_a_number_is_one_share() -> None:
    result = patched(pod(volcano(number=None, memory="1024")))
    assert limits_annotation(result) == {"tp": {"cores": 50, "memory": GIB}}


def test_volcano_cores_of_100_are_whole_gpus() -> None:
    result = patched(pod(volcano(memory=None, cores="100")))
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "1", "docker.com/vcuda-core": "200", "nvidia.com/gpu": "2"}


@pytest.mark.parametrize(("spec", "message"), [
    (volcano(cores=None), 'container "tp": volcano.sh/vgpu-cores is required: vcuda holds every '
     "share to a part of its GPU's time; add volcano.sh/vgpu-cores: 1..99 per GPU, or 100 for "
     "whole GPUs"),
    (volcano(memory=None), 'container "tp": volcano.sh/vgpu-cores: 50 shares a GPU, so '
     "volcano.sh/vgpu-memory is required; add volcano.sh/vgpu-memory: MiB per GPU (e.g. 3000)"),
    (volcano(cores="0"), 'container "tp": volcano.sh/vgpu-cores: 0 is neither a share of a GPU '
     "(1..99) nor a whole GPU (100); write one of those"),
    (volcano(number="17"), 'container "tp": volcano.sh/vgpu-number: 17 must be 1..16 GPUs'),
    (volcano(memory="0"), 'container "tp": volcano.sh/vgpu-memory: 0 must be at least 1 MiB'),
    (volcano(memory="3Gi"), 'container "tp": volcano.sh/vgpu-memory: 3Gi is a byte size, but '
     "volcano.sh/vgpu-memory counts MiB; write volcano.sh/vgpu-memory: 3072"),
    (volcano(memory="90000"), 'container "tp": volcano.sh/vgpu-memory: 90000 MiB is more than '
     "the largest GPU (81920 MiB); write at most 81920"),
])
def test_volcano_requests_vcuda_cannot_hold_are_denied_in_volcano_terms(
        spec: dict[str, Any], message: str) -> None:
    assert denial(pod(spec)) == message


def test_volcano_value_that_is_no_whole_number_is_denied() -> None:
    assert denial(pod(volcano(cores="50.5"))).startswith('container "tp": volcano.sh/vgpu-cores: ')


def test_a_container_mixing_volcano_and_vcuda_names_is_told_which_to_keep() -> None:
    spec = volcano()
    spec["resources"]["limits"]["docker.com/vcuda-core"] = "50"
    assert denial(pod(spec)) == (
        'container "tp" mixes Volcano\'s names and vcuda\'s; keep vcuda\'s '
        "(docker.com/vcuda-core, docker.com/vcuda-memory) and remove Volcano's")


def test_a_pod_mixing_vocabularies_across_containers_is_told_which_to_keep() -> None:
    other = shared("single")
    assert denial(pod(volcano(), other)) == (
        'the pod mixes request names (container "tp" writes Volcano\'s names; container '
        '"single" writes vcuda\'s names); write every container in one of them, best vcuda\'s '
        "own (docker.com/vcuda-core, docker.com/vcuda-memory)")


HAMI = Config(hami_names=True)


def hami(count: Any = "2", memory: Any = "3000", cores: Any = "30",
         percent: Any = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    for key, value in (("nvidia.com/gpu", count), ("nvidia.com/gpumem", memory),
                       ("nvidia.com/gpucores", cores),
                       ("nvidia.com/gpumem-percentage", percent)):
        if value is not None:
            limits[key] = value
    return container("tp", limits=limits)


def test_hami_names_are_read_when_enabled() -> None:
    result = patched(pod(hami()), HAMI)
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "12",
                      "nvidia.com/gpu.shared": "2"}
    assert limits_annotation(result) == {"tp": {"cores": 30, "memory": 3 * GIB, "gpus": 2}}


def test_hami_memory_percentage_is_of_the_largest_gpu() -> None:
    result = patched(pod(hami(memory=None, percent="25")), HAMI)
    assert limits_annotation(result) == {"tp": {"cores": 30, "memory": 20 * GIB, "gpus": 2}}


def test_hami_gpucores_of_100_are_whole_gpus_of_nvidias_own_resource() -> None:
    result = patched(pod(hami(memory=None, cores="100")), HAMI)
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"docker.com/vcuda-core": "200", "nvidia.com/gpu": "2"}


def test_nvidia_gpu_alone_keeps_its_meaning_with_hami_names_enabled() -> None:
    assert create(pod(container("w", limits={"nvidia.com/gpu": "2"})), HAMI).patch == ()


def test_hami_names_are_denied_where_not_enabled() -> None:
    assert denial(pod(hami())) == (
        'container "tp" asks for HAMi\'s nvidia.com/gpumem, gpumem-percentage or gpucores, '
        "which this webhook reads only where its ConfigMap sets hami_names: true; set it, or "
        "write vcuda's own names (docker.com/vcuda-core: 1..99, docker.com/vcuda-memory: N "
        "(units of 256 MiB))")


@pytest.mark.parametrize(("spec", "message"), [
    (hami(percent="50"), 'container "tp": nvidia.com/gpumem and nvidia.com/gpumem-percentage '
     "both give the memory; keep one"),
    (hami(memory=None, percent="0"), 'container "tp": nvidia.com/gpumem-percentage: 0 must be '
     "1..100 percent"),
    (hami(cores=None), 'container "tp": nvidia.com/gpucores is required: vcuda holds every '
     "share to a part of its GPU's time; add nvidia.com/gpucores: 1..99 per GPU, or 100 for "
     "whole GPUs"),
])
def test_hami_requests_vcuda_cannot_hold_are_denied_in_hami_terms(
        spec: dict[str, Any], message: str) -> None:
    assert denial(pod(spec), HAMI) == message


def test_a_container_mixing_volcano_and_hami_names_is_told_to_keep_one() -> None:
    spec = hami()
    spec["resources"]["limits"]["volcano.sh/vgpu-number"] = "2"
    assert denial(pod(spec), HAMI) == (
        'container "tp" mixes Volcano\'s and HAMi\'s names; keep one of them, or write vcuda\'s '
        "own (docker.com/vcuda-core: 1..99, docker.com/vcuda-memory: N (units of 256 MiB))")


def test_vcuda_gpus_of_another_domain_is_read_and_removed_too() -> None:
    spec = container("tp", limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4",
                                   "tencent.com/vcuda-gpus": "3"})
    result = patched(pod(spec))
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"docker.com/vcuda-core": "50", "docker.com/vcuda-memory": "4",
                      "nvidia.com/gpu.shared": "3"}
    assert limits_annotation(result)["tp"]["gpus"] == 3


def test_volcano_names_in_requests_are_removed_with_those_in_limits() -> None:
    spec = volcano()
    spec["resources"]["requests"] = {"volcano.sh/vgpu-number": "2", "cpu": "1"}
    result = patched(pod(spec))
    assert result["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}


def test_the_webhooks_own_output_of_volcano_names_is_left_as_it_is() -> None:
    assert create(patched(pod(volcano()))).patch == ()


# --- virtual device memory -------------------------------------------------------------------

VIRTUAL = "vcuda.io/virtual-memory"


def test_a_pod_asking_virtual_memory_gets_it_in_each_shares_entry() -> None:
    result = patched(pod(shared("train", memory="40"), shared("serve", memory="8"),
                         container("sidecar", limits={"cpu": "100m"}),
                         annotations={VIRTUAL: "true"}))
    assert limits_annotation(result) == {
        "train": {"cores": 30, "memory": 10 * GIB, "virtual": True},
        "serve": {"cores": 30, "memory": 2 * GIB, "virtual": True},
    }


@pytest.mark.parametrize("annotations", [{VIRTUAL: "false"}, {}])
def test_a_pod_not_asking_virtual_memory_has_none(annotations: dict[str, str]) -> None:
    result = patched(pod(shared("train"), annotations=annotations))
    assert limits_annotation(result) == {"train": {"cores": 30, "memory": 10 * GIB}}


@pytest.mark.parametrize("value", ["yes", "True", "", "1"])
def test_a_virtual_memory_annotation_other_than_true_or_false_is_denied(value: str) -> None:
    assert denial(pod(shared("train"), annotations={VIRTUAL: value})) == (
        f'{VIRTUAL} is "{value}": write "true" to let the part of each GPU share\'s memory '
        'past the node\'s scaled share live in host memory, or "false"')


def test_a_long_virtual_memory_value_is_cut_in_the_denial() -> None:
    message = denial(pod(shared("train"), annotations={VIRTUAL: "x" * 5000}))
    assert f'{VIRTUAL} is "{"x" * 64}": write' in message
