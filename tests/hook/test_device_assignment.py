"""The GPUs of a container come from the device side only; its environment can only be refused."""

from __future__ import annotations

import pytest

from runtime_hook.contract import Gpu
from runtime_hook.device_assignment import Devices, Source, assigned
from runtime_hook.hook_errors import HookError
from runtime_hook.oci_spec import Container

GIB = 1 << 30
A = "GPU-5c3d0a1e-0000-4000-8000-00000000000a"
B = "GPU-81aa0b2f-0000-4000-8000-00000000000b"
MIG = "MIG-7f1e2d3c-0000-4000-8000-00000000000c"
INVENTORY = {
    A: Gpu(uuid=A, index=0, memory=16 * GIB),
    B: Gpu(uuid=B, index=1, memory=80 * GIB),
    MIG: Gpu(uuid=MIG, index=1, memory=10 * GIB),  # a MIG device of B, listed with its index
}
PLUGIN_ENV = "NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"


def _plugin_mount(device: str, source: str = "/dev/null", bind: bool = True) -> tuple:
    return (f"/var/run/nvidia-container-devices/{device}", source, bind)


def _container(
    *devices: str, env: tuple[str, ...] = (PLUGIN_ENV,), mounts: tuple = (),
    annotations: dict[str, str] | None = None,
) -> Container:
    return Container(
        id="c",
        pid=1,
        bundle="/b",
        annotations=annotations or {},
        rootfs="/b/rootfs",
        env=("PATH=/bin", *env),
        mounts=(("/proc", "proc", False), *(_plugin_mount(d) for d in devices), *mounts),
    )


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ((A,), (A,)),
        (("1", "0"), (B, A)),
        ((A.upper(),), (A,)),  # NVIDIA's tools compare UUIDs without regard to case
        ((MIG.lower(),), (MIG,)),
        ((A, A.upper()), (A,)),
    ],
    ids=["uuid", "indices", "uuid in capitals", "mig uuid", "duplicates"],
)
def test_device_plugin_mounts_give_the_gpus_in_the_inventorys_spelling(
    devices: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    assert assigned(_container(*devices), INVENTORY) == Devices(expected, expected)


def test_an_index_names_the_whole_gpu_and_never_a_mig_device_of_it() -> None:
    assert assigned(_container("1"), INVENTORY) == Devices((B,), (B,))
    assert assigned(_container(MIG), INVENTORY) == Devices((MIG,), (MIG,))
    with pytest.raises(HookError, match="environment sets NVIDIA_VISIBLE_DEVICES=1, but"):
        assigned(_container(MIG, env=(PLUGIN_ENV, "NVIDIA_VISIBLE_DEVICES=1")), INVENTORY)


def test_environment_without_trusted_mounts_gives_no_gpu_and_refuses_the_start() -> None:
    container = _container(env=(f"NVIDIA_VISIBLE_DEVICES={A}",))
    with pytest.raises(HookError) as caught:
        assigned(container, INVENTORY)
    assert caught.value.cause == (
        "no trusted list of this container's GPUs (vcuda's placement at bind or the device "
        "plugin's volume mounts)"
    )
    assert "deviceListStrategy volume-mounts" in caught.value.fix


@pytest.mark.parametrize(
    "mount",
    [
        _plugin_mount(A, source="/var/lib/kubelet/pods/x/volumes/empty"),  # an emptyDir
        _plugin_mount(A, bind=False),
        ("/var/run/nvidia-container-devices/imex/0", "/dev/null", True),
        ("/var/run/nvidia-container-devicesX/" + A, "/dev/null", True),
    ],
    ids=["other source", "not a bind mount", "imex channel", "sibling directory"],
)
def test_mounts_the_device_plugin_does_not_make_are_not_a_device_list(mount: tuple) -> None:
    with pytest.raises(HookError, match="no trusted list"):
        assigned(_container(mounts=(mount,)), INVENTORY)


@pytest.mark.parametrize(
    "value",
    [A, A.upper(), "0", PLUGIN_ENV.split("=")[1], "void", "none", ""],
    ids=["same uuid", "in capitals", "same index", "plugin's own", "void", "none", "empty"],
)
def test_environment_that_agrees_with_the_device_plugin_is_accepted(value: str) -> None:
    container = _container(A, env=(PLUGIN_ENV, f"NVIDIA_VISIBLE_DEVICES={value}"))
    assert assigned(container, INVENTORY) == Devices((A,), (A,))


@pytest.mark.parametrize(
    "env",
    [
        (PLUGIN_ENV, f"NVIDIA_VISIBLE_DEVICES={B}"),
        (f"NVIDIA_VISIBLE_DEVICES={B.upper()}",),
        (f"NVIDIA_VISIBLE_DEVICES={A},{B}",),
        ("NVIDIA_VISIBLE_DEVICES=all",),
        ("NVIDIA_VISIBLE_DEVICES=1",),
        (f"NVIDIA_VISIBLE_DEVICES={B}", PLUGIN_ENV),  # any occurrence, not only the last
    ],
    ids=["other gpu", "other gpu in capitals", "one more", "all", "other index", "earlier"],
)
def test_environment_naming_other_gpus_refuses_the_start_with_one_line(env: tuple) -> None:
    with pytest.raises(HookError) as caught:
        assigned(_container(A, env=env), INVENTORY)
    assert caught.value.cause.startswith("the container's environment sets NVIDIA_VISIBLE_DEVICES=")
    assert caught.value.cause.endswith(f"but the device plugin's volume mounts give it {A}")
    assert "\n" not in caught.value.line()


def test_gpu_missing_from_the_inventory_is_refused_not_left_unlimited() -> None:
    unknown = "GPU-00000000-0000-4000-8000-0000000000ff"
    with pytest.raises(HookError) as caught:
        assigned(_container(A, unknown), INVENTORY)
    assert f"name {unknown}, which this node's GPU inventory does not list" in caught.value.cause
    with pytest.raises(HookError, match="GPU index 7, which this node's GPU inventory"):
        assigned(_container("7"), INVENTORY)


def test_without_an_inventory_uuids_are_limited_and_an_index_leaves_all_visible_limited() -> None:
    devices = assigned(_container(A.upper()), None)
    assert (devices.for_limits, devices.for_ledger) == ((A.upper(),), (A.upper(),))
    assert "are not checked" in devices.notes[0]
    assert assigned(_container("0", A), None).for_limits == ()


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu0", "'gpu0', neither a GPU UUID nor an index"),
        ("GPU-a=b", "'GPU-a=b', which is no device ID"),
        ("0:1", "'0:1', neither a GPU UUID nor an index"),  # a MIG index
    ],
)
def test_device_ids_of_unknown_shape_are_refused(device: str, message: str) -> None:
    with pytest.raises(HookError, match=message):
        assigned(_container(device), INVENTORY)


def test_sources_that_disagree_refuse_the_start_and_agreeing_ones_pass() -> None:
    placement = Source("vcuda's placement", lambda container: (B,))
    sources = (placement, Source("the device plugin's volume mounts", lambda c: (A,)))
    with pytest.raises(HookError) as caught:
        assigned(_container(A), INVENTORY, sources)
    assert caught.value.cause == (
        f"vcuda's placement give this container {B} but the device plugin's volume mounts "
        f"give {A}"
    )
    agreeing = (placement, Source("the device plugin's volume mounts", lambda c: ("1",)))
    assert assigned(_container(B), INVENTORY, agreeing) == Devices((B,), (B,))


def test_a_source_with_no_say_is_skipped() -> None:
    silent = Source("vcuda's placement", lambda container: None)
    sources = (silent, Source("the device plugin's volume mounts", lambda c: (A,)))
    assert assigned(_container(A), INVENTORY, sources) == Devices((A,), (A,))


def _bound_to(gpu: str) -> dict[str, str]:
    return {"vcuda.io/assigned-gpus": f'{{"shared":["{gpu}",30,1073741824]}}'}


def test_the_gpu_bound_at_bind_and_the_device_plugins_agree_and_pass() -> None:
    assert assigned(_container(B, annotations=_bound_to(B)), INVENTORY) == Devices((B,), (B,))


def test_a_device_plugin_gpu_other_than_the_bound_one_refuses_the_start_naming_both() -> None:
    with pytest.raises(HookError) as caught:
        assigned(_container(A, annotations=_bound_to(B)), INVENTORY)
    assert caught.value.cause == (
        f"vcuda's placement at bind give this container {B} but the device plugin's volume "
        f"mounts give {A}"
    )


@pytest.mark.parametrize("value", ["{", '{"whole": ["GPU-x"]}', '{"shared": []}', "[]"])
def test_an_assignment_without_a_shared_gpu_refuses_a_limited_container(value: str) -> None:
    container = _container(A, annotations={"vcuda.io/assigned-gpus": value})
    with pytest.raises(HookError, match="names no shared GPU for this limited container"):
        assigned(container, INVENTORY)


def _bound_to_both(gpus: int) -> dict[str, str]:
    """A pod bound with a share of A and B, for a container asking for ``gpus`` of them."""
    entry = '{"cores": 30, "memory": 1073741824' + (f', "gpus": {gpus}' if gpus > 1 else "")
    return {"vcuda.io/assigned-gpus": f'{{"shared":["{A}",30,1073741824],"also_shared":["{B}"]}}',
            "vcuda.io/limits": f'{{"tp": {entry}}}}}',
            "io.kubernetes.cri.container-name": "tp"}


def test_a_two_gpu_share_bound_at_bind_gets_both_gpus_into_the_limits_file() -> None:
    container = _container(A, B, annotations=_bound_to_both(2))
    assert assigned(container, INVENTORY) == Devices((A, B), (A, B))


def test_a_one_gpu_container_of_a_pod_with_a_two_gpu_share_gets_the_first_gpu() -> None:
    assert assigned(_container(A, annotations=_bound_to_both(1)), INVENTORY) == Devices((A,), (A,))


def test_a_two_gpu_share_whose_assignment_names_one_gpu_refuses_the_start() -> None:
    annotations = _bound_to_both(2) | _bound_to(A)
    with pytest.raises(HookError, match="names fewer than the 2 shared GPUs this container asks"):
        assigned(_container(A, B, annotations=annotations), INVENTORY)
