"""The demo's bundles: containerd's annotations, and the hook exactly as manifests/node wires it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo import node
from demo.commands import REPO
from runtime_hook.contract import Gpu

GIB = 1 << 30
_GPUS = (Gpu("GPU-a", 0, 80 * GIB),)


def _pod(runtime_class: str | None) -> dict:
    pod = {"metadata": {"name": "p", "namespace": "ns", "annotations": {
               "vcuda.io/limits": '{"c":{"cores":30,"memory":1073741824}}',
               "team.example.com/owner": "someone"}},
           "spec": {"containers": [{"name": "c"}]}}
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    return pod


def test_a_vcuda_pod_gets_the_base_specs_hooks_with_only_the_node_paths_moved(
        tmp_path: Path) -> None:
    prepared = node.prepare_node(tmp_path, _GPUS)
    config = node.container_config(_pod("vcuda"), {"name": "c"}, prepared, ("GPU-a",))
    base = json.loads((REPO / "manifests/node/base-runtime-spec.json").read_text())["hooks"]
    moved = {"/usr/local/vcuda/python/runtime_hook/oci_hook.py":
             str(REPO / "runtime_hook/oci_hook.py"),
             "/run/vcuda": str(tmp_path / "state"),
             "/usr/local/vcuda/lib/libvcuda.so": str(prepared.library)}
    for stage in ("prestart", "poststop"):
        (hook,) = config["hooks"][stage]
        (wired,) = base[stage]
        assert hook["args"] == [moved.get(arg, arg) for arg in wired["args"]]
        assert (hook["path"], hook["env"], hook["timeout"]) == (
            wired["path"], wired["env"], wired["timeout"])
    assert config["annotations"] == {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "c",
        "io.kubernetes.cri.sandbox-name": "p",
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "vcuda.io/limits": '{"c":{"cores":30,"memory":1073741824}}',
    }
    assert "NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices" in config["process"]["env"]
    assert {"destination": "/var/run/nvidia-container-devices/GPU-a", "type": "bind",
            "source": "/dev/null", "options": ["rbind", "rprivate", "ro"]} in config["mounts"]


def test_a_pod_of_another_runtime_class_runs_without_the_hook_or_pod_annotations(
        tmp_path: Path) -> None:
    prepared = node.prepare_node(tmp_path, _GPUS)
    config = node.container_config(_pod(None), {"name": "c"}, prepared, ())
    assert "hooks" not in config
    assert "vcuda.io/limits" not in config["annotations"]


def test_without_a_cshim_build_a_placeholder_library_stands_in_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "BUILT_LIBRARY", tmp_path / "not-built.so")
    prepared = node.prepare_node(tmp_path, _GPUS)
    assert prepared.library == tmp_path / "libvcuda.so"
    assert prepared.library.read_text().startswith("placeholder for libvcuda.so")
    assert json.loads((prepared.state_dir / "gpus.json").read_text())["gpus"] == [
        {"uuid": "GPU-a", "index": 0, "memory": 80 * GIB}]
