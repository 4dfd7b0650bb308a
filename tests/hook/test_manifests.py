"""Node configuration in manifests/node/: containerd and CRI-O run the hook as its CLI expects."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib

from runtime_hook.hook_cli import DEFAULT_LIBRARY, parse_args
from tests.hook.bundles import REPO

NODE = REPO / "manifests" / "node"
BASE_SPEC = "/etc/vcuda/base-runtime-spec.json"
CONTAINERD = {
    "containerd-1.7-vcuda.toml": (2, "io.containerd.grpc.v1.cri"),
    "containerd-2-vcuda.toml": (3, "io.containerd.cri.v1.runtime"),
}


def _hooks() -> dict[str, list[tuple[str, dict]]]:
    """Every hook entry of the node files, by stage, with the file it comes from."""
    spec = json.loads((NODE / "base-runtime-spec.json").read_text())
    found: dict[str, list[tuple[str, dict]]] = {
        stage: [("base-runtime-spec.json", hook) for hook in spec["hooks"][stage]]
        for stage in ("prestart", "poststop")
    }
    for stage in found:
        doc = json.loads((NODE / f"crio-vcuda-{stage}.json").read_text())
        assert doc["stages"] == [stage]
        found[stage].append((f"crio-vcuda-{stage}.json", doc["hook"]))
    return found


@pytest.mark.parametrize("name", list(CONTAINERD))
def test_containerd_handler_passes_vcuda_annotations_and_uses_the_base_spec(name: str) -> None:
    version, plugin = CONTAINERD[name]
    config = tomllib.loads((NODE / name).read_text())
    assert config["version"] == version
    runtime = config["plugins"][plugin]["containerd"]["runtimes"]["vcuda"]
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["pod_annotations"] == ["vcuda.io/*"]
    assert runtime["base_runtime_spec"] == BASE_SPEC
    assert runtime["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"


def test_crio_handler_runs_nvidias_runtime() -> None:
    config = tomllib.loads((NODE / "crio-vcuda.conf").read_text())
    runtime = config["crio"]["runtime"]["runtimes"]["vcuda"]
    assert runtime["runtime_path"] == "/usr/bin/nvidia-container-runtime"


@pytest.mark.parametrize("stage", ["prestart", "poststop"])
def test_crio_hook_runs_only_for_pods_with_limits(stage: str) -> None:
    when = json.loads((NODE / f"crio-vcuda-{stage}.json").read_text())["when"]
    assert set(when) == {"annotations"}
    ((key, value),) = when["annotations"].items()
    assert re.search(key, "vcuda.io/limits") and re.search(value, '{"c": {"cores": 30}}')
    assert not re.search(key, "vcudaXio/limits") and not re.search(key, "vcuda.io/limits-old")


@pytest.mark.parametrize("stage", ["prestart", "poststop"])
def test_every_hook_entry_is_a_valid_isolated_command_line_of_the_hook(stage: str) -> None:
    for source, hook in _hooks()[stage]:
        args = hook["args"]
        assert hook["path"] == "/usr/bin/python3" and Path(args[0]).name == "python3", source
        script = args.index("/usr/local/vcuda/python/runtime_hook/oci_hook.py")
        assert "-I" in args[1:script], f"{source}: Python must ignore PYTHON* and user site"
        installed = Path(args[script]).relative_to("/usr/local/vcuda/python")
        assert (REPO / installed).is_file(), f"{source}: the node copy of the package mirrors it"
        parsed = parse_args(args[script + 1 :])
        assert (parsed.stage, parsed.state_dir, parsed.library) == (
            stage,
            "/run/vcuda",
            DEFAULT_LIBRARY,
        ), source
        assert hook["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], source
        assert 0 < hook["timeout"] <= 30, source


def test_base_spec_and_crio_run_the_same_command() -> None:
    for stage, entries in _hooks().items():
        assert len({json.dumps(hook, sort_keys=True) for _, hook in entries}) == 1, stage


def test_base_spec_keeps_containerds_defaults() -> None:
    spec = json.loads((NODE / "base-runtime-spec.json").read_text())
    assert spec["root"] == {"path": "rootfs"}
    assert {m["destination"] for m in spec["mounts"]} >= {"/proc", "/dev", "/dev/pts", "/sys"}
    assert {n["type"] for n in spec["linux"]["namespaces"]} == {
        "pid",
        "ipc",
        "uts",
        "mount",
        "network",
    }
    assert spec["process"]["noNewPrivileges"] is True
    assert "CAP_SYS_ADMIN" not in spec["process"]["capabilities"]["bounding"]
