"""The hook's pure decisions: whose limits, whether they fit, what is preloaded."""

from __future__ import annotations

import json

import pytest

from runtime_hook.contract import Gpu, Sharing
from runtime_hook.hook_errors import HookError
from runtime_hook.inject import merge_preload
from runtime_hook.limits_decision import Request, overcommit, requested_limits, too_few_gpus
from runtime_hook.oci_hook import surely_unlimited

GIB = 1 << 30
INVENTORY = {
    "GPU-a": Gpu(uuid="GPU-a", index=0, memory=16 * GIB),
    "GPU-b": Gpu(uuid="GPU-b", index=1, memory=80 * GIB),
}


def _annotations(table: object, name: str = "train", key: str = "io.kubernetes.cri.container-name"):
    raw = table if isinstance(table, str) else json.dumps(table)
    return {"vcuda.io/limits": raw, key: name}


def test_entry_of_this_container_becomes_its_request() -> None:
    ann = _annotations({"train": {"cores": 30, "memory": 10 * GIB}, "other": {"cores": 5}})
    assert requested_limits(ann) == Request(container="train", cores=30, memory=10 * GIB)


def test_entry_with_gpus_asks_for_that_many_distinct_gpus() -> None:
    ann = _annotations({"train": {"cores": 30, "memory": GIB, "gpus": 4}})
    assert requested_limits(ann) == Request(container="train", cores=30, memory=GIB, gpus=4)


def test_entry_without_gpus_is_one_gpu_as_before() -> None:
    assert requested_limits(_annotations({"train": {"cores": 30, "memory": GIB}})).gpus == 1


def test_distinct_gpus_must_be_as_many_as_asked_for() -> None:
    two = Request(container="train", cores=30, memory=GIB, gpus=2)
    assert too_few_gpus(two, ("GPU-a", "GPU-b")) is None
    assert too_few_gpus(two, ("GPU-a",)) == (
        "the container asks for shares of 2 distinct GPUs, but the device side gave it 1 (GPU-a)")
    assert too_few_gpus(two, ("GPU-a", "GPU-b", "GPU-c")) == (
        "the container asks for shares of 2 distinct GPUs, but the device side gave it 3 "
        "(GPU-a, GPU-b, GPU-c)")
    one = Request(container="train", cores=30, memory=GIB)
    assert too_few_gpus(one, ("GPU-a", "GPU-b")) is None  # one GPU's meaning is unchanged


def test_cri_o_container_name_key_is_read_too() -> None:
    ann = _annotations({"w": {"cores": 99, "memory": 1}}, "w", "io.kubernetes.container.name")
    assert requested_limits(ann) == Request(container="w", cores=99, memory=1)


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {"io.kubernetes.cri.container-name": "train"},
        _annotations({"other": {"cores": 30, "memory": GIB}}),
        {
            **_annotations({"POD": {"cores": 30, "memory": GIB}}, "POD"),
            "io.kubernetes.cri.container-type": "sandbox",
        },
        {**_annotations("not even json"), "io.kubernetes.cri-o.ContainerType": "sandbox"},
    ],
    ids=["no annotations", "no limits", "no entry", "containerd sandbox", "cri-o sandbox"],
)
def test_containers_without_an_entry_and_sandboxes_get_no_limits(annotations: dict) -> None:
    assert requested_limits(annotations) is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("{nope", "annotation vcuda.io/limits is not JSON"),
        ("[1, 2]", "annotation vcuda.io/limits is not a JSON object"),
        ({"train": 30}, "entry for 'train' is not an object"),
        ({"train": {"memory": GIB}}, "cores of 'train' is None, expected a whole number 1..99"),
        ({"train": {"cores": 0, "memory": GIB}}, "cores of 'train' is 0"),
        ({"train": {"cores": 100, "memory": GIB}}, "cores of 'train' is 100"),
        ({"train": {"cores": 30.5, "memory": GIB}}, "cores of 'train' is 30.5"),
        ({"train": {"cores": True, "memory": GIB}}, "cores of 'train' is True"),
        ({"train": {"cores": 30}}, "memory of 'train' is None, expected a whole number at least 1"),
        ({"train": {"cores": 30, "memory": "10Gi"}}, "memory of 'train' is '10Gi'"),
        ({"train": {"cores": 30, "memory": -1}}, "memory of 'train' is -1"),
        ({"train": {"cores": 30, "memory": 1, "gpus": 0}},
         "gpus of 'train' is 0, expected a whole number 1..16"),
        ({"train": {"cores": 30, "memory": 1, "gpus": 17}}, "gpus of 'train' is 17"),
        ({"train": {"cores": 30, "memory": 1, "gpus": "2"}}, "gpus of 'train' is '2'"),
    ],
)
def test_malformed_annotation_is_refused_with_what_is_wrong(table: object, message: str) -> None:
    with pytest.raises(HookError) as caught:
        requested_limits(_annotations(table))
    assert message in caught.value.cause
    assert "let the vcuda webhook write vcuda.io/limits" in caught.value.fix


def test_limits_without_a_container_name_are_refused() -> None:
    with pytest.raises(HookError, match="no container name"):
        requested_limits({"vcuda.io/limits": json.dumps({"x": {"cores": 1, "memory": 1}})})


def _asks(memory: int, cores: int = 10) -> Request:
    return Request(container="train", cores=cores, memory=memory)


def test_memory_fits_up_to_the_last_byte() -> None:
    committed = {"GPU-a": (10 * GIB, 0)}
    assert overcommit(_asks(6 * GIB), ["GPU-a"], committed, INVENTORY, Sharing()) is None


def test_overcommit_names_the_gpu_what_is_free_and_what_was_asked() -> None:
    committed = {"GPU-a": (10 * GIB, 0)}
    reason = overcommit(_asks(6 * GIB + 1), ["GPU-b", "GPU-a"], committed, INVENTORY, Sharing())
    assert reason == (
        "GPU GPU-a (index 0) has 6.00 GiB (6442450944 bytes) free of 16.00 GiB "
        "(17179869184 bytes) for shared containers, and this container asks for "
        "6.00 GiB (6442450945 bytes)"
    )


def test_memory_scaling_raises_what_a_gpu_may_give_out() -> None:
    committed = {"GPU-a": (16 * GIB, 0)}
    assert overcommit(_asks(8 * GIB), ["GPU-a"], committed, INVENTORY, Sharing(1.5)) is None
    assert "has 0.00 GiB" in overcommit(_asks(8 * GIB), ["GPU-a"], committed, INVENTORY, Sharing())


def test_cores_scaling_lets_the_shares_of_a_gpu_add_up_past_100_percent() -> None:
    committed = {"GPU-a": (GIB, 90)}
    assert overcommit(_asks(GIB, cores=60), ["GPU-a"], committed, INVENTORY,
                      Sharing(cores_scaling=1.5)) is None
    assert overcommit(_asks(GIB, cores=61), ["GPU-a"], committed, INVENTORY,
                      Sharing(cores_scaling=1.5)) == (
        "GPU GPU-a (index 0) has 60% of its time free for shared containers, "
        "and this container asks for 61%"
    )


def test_a_gpu_with_max_sharers_containers_refuses_one_more_with_its_count_and_the_flag() -> None:
    sharing = Sharing(max_sharers=2)
    assert overcommit(_asks(GIB), ["GPU-a"], {}, INVENTORY, sharing, {"GPU-a": 1}) is None
    assert overcommit(_asks(GIB), ["GPU-a"], {}, INVENTORY, sharing, {"GPU-a": 2}) == (
        "GPU GPU-a (index 0) has 2 shared containers, the most this node allows on one GPU "
        "(--max-sharers 2)"
    )
    assert overcommit(_asks(GIB), ["GPU-a"], {}, INVENTORY, Sharing(), {"GPU-a": 500}) is None


def test_time_of_a_gpu_is_committed_up_to_100_percent_and_not_scaled() -> None:
    committed = {"GPU-a": (GIB, 90)}
    assert overcommit(_asks(GIB, cores=10), ["GPU-a"], committed, INVENTORY, Sharing(1.5)) is None
    assert overcommit(_asks(GIB, cores=11), ["GPU-a"], committed, INVENTORY, Sharing(1.5)) == (
        "GPU GPU-a (index 0) has 10% of its time free for shared containers, "
        "and this container asks for 11%"
    )


@pytest.mark.parametrize(
    ("image", "merged"),
    [
        (b"", b"/usr/local/vcuda/lib/libvcuda.so\n"),
        (b"/lib/a.so /lib/b.so", b"/usr/local/vcuda/lib/libvcuda.so\n/lib/a.so /lib/b.so"),
        (
            b"/lib/a.so:/usr/local/vcuda/lib/libvcuda.so\n",
            b"/lib/a.so:/usr/local/vcuda/lib/libvcuda.so\n",
        ),
    ],
    ids=["no image list", "image entries kept after the library", "already listed"],
)
def test_preload_list_names_the_library_first_and_keeps_the_image_entries(
    image: bytes, merged: bytes
) -> None:
    assert merge_preload(image) == merged


@pytest.mark.parametrize(
    ("state", "unlimited"),
    [
        (b'{"id":"a","annotations":{"io.kubernetes.cri.container-name":"x"}}', True),
        (b'{"id":"a","bundle":"/b"}', True),
        (b'{"annotations":{"vcuda.io/limits":"{}"}}', False),
        (b'{"annotations":{"vcuda.io\\/limits":"{}"}}', False),
        (
            b'{"annotations":{"vcuda.io/limits":"{}",'
            b'"io.kubernetes.cri.container-type":"sandbox"}}',
            True,
        ),
        (b'{"annotations":{"note":"see vcuda.io"}}', False),
    ],
    ids=["other annotations", "none", "limits", "escaped slash", "sandbox", "mention in a value"],
)
def test_fast_path_skips_only_containers_that_surely_have_no_limits(
    state: bytes, unlimited: bool
) -> None:
    assert surely_unlimited(state) is unlimited
