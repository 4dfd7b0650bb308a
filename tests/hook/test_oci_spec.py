"""Reading the OCI state and config.json as runc and crun write them, and refusing anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime_hook.hook_errors import HookError
from runtime_hook.oci_spec import load_config, parse_state

RUNC_STATE = {
    "ociVersion": "1.0.2-dev",
    "id": "abc",
    "status": "creating",
    "pid": 4242,
    "bundle": "/run/bundle",
    "annotations": {"io.kubernetes.cri.container-name": "train"},
}
# crun adds a relative root and says "created" at prestart.
CRUN_STATE = {**RUNC_STATE, "ociVersion": "1.0", "status": "created", "root": "rootfs"}


@pytest.mark.parametrize("state", [RUNC_STATE, CRUN_STATE], ids=["runc", "crun"])
def test_state_of_runc_and_crun_is_read_alike(state: dict) -> None:
    container = parse_state(json.dumps(state).encode())
    assert (container.id, container.pid, container.bundle) == ("abc", 4242, "/run/bundle")
    assert container.annotations == {"io.kubernetes.cri.container-name": "train"}


def test_poststop_state_without_pid_is_accepted() -> None:
    state = {**RUNC_STATE, "status": "stopped"}
    del state["pid"]
    assert parse_state(json.dumps(state).encode()).pid == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "the OCI state on stdin is not JSON"),
        (b"[]", "is not a JSON object"),
        (json.dumps({**RUNC_STATE, "id": "../etc"}).encode(), "no usable container id"),
        (json.dumps({**RUNC_STATE, "id": ".."}).encode(), "no usable container id"),
        (json.dumps({**RUNC_STATE, "bundle": "relative"}).encode(), "no absolute bundle path"),
        (json.dumps({**RUNC_STATE, "pid": "12"}).encode(), "bad pid"),
        (json.dumps({**RUNC_STATE, "annotations": []}).encode(), "annotations are not an object"),
    ],
    ids=["empty", "array", "id with slash", "dot id", "relative bundle", "pid string", "ann list"],
)
def test_malformed_state_is_refused_clearly(raw: bytes, message: str) -> None:
    with pytest.raises(HookError, match=message) as caught:
        parse_state(raw)
    assert "OCI runtime" in caught.value.fix


def _bundle(tmp_path: Path, config: object) -> str:
    text = config if isinstance(config, str) else json.dumps(config)
    (tmp_path / "config.json").write_text(text)
    return str(tmp_path)


def test_config_gives_root_env_annotations_and_mounts(tmp_path: Path) -> None:
    config = {
        "root": {"path": "rootfs"},
        "process": {"env": ["A=1", "NVIDIA_VISIBLE_DEVICES=0"]},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/data", "type": "bind", "source": "/srv"},
            {"destination": "/dev/x", "source": "/dev/null", "options": ["rbind", "ro"]},
        ],
        "annotations": {"vcuda.io/limits": "{}"},
    }
    state = parse_state(json.dumps({**CRUN_STATE, "bundle": _bundle(tmp_path, config)}).encode())
    container = load_config(state)
    assert container.rootfs == str(tmp_path / "rootfs")  # relative root against the bundle
    assert container.env == ("A=1", "NVIDIA_VISIBLE_DEVICES=0")
    assert container.mounts == (
        ("/proc", "proc", False),
        ("/data", "/srv", True),
        ("/dev/x", "/dev/null", True),
    )
    assert container.annotations == {"vcuda.io/limits": "{}"}


def test_absolute_root_path_is_kept(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, {"root": {"path": "/var/lib/c/rootfs/"}})
    state = parse_state(json.dumps({**RUNC_STATE, "bundle": bundle}).encode())
    assert load_config(state).rootfs == "/var/lib/c/rootfs"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "cannot read"),
        ("{", "is not JSON"),
        ({"process": {}}, "is not a valid OCI config"),
        ({"root": {"path": ""}}, "is not a valid OCI config"),
        ({"root": {"path": "r"}, "process": {"env": [1]}}, "is not a valid OCI config"),
        ({"root": {"path": "r"}, "annotations": {"a": 1}}, "is not a valid OCI config"),
        ({"root": {"path": "r"}, "mounts": [{"source": "x"}]}, "is not a valid OCI config"),
        (
            {"root": {"path": "r"}, "mounts": [{"destination": "/x", "options": [1]}]},
            "is not a valid OCI config",
        ),
    ],
    ids=[
        "missing",
        "not json",
        "no root",
        "empty root",
        "env",
        "annotation value",
        "mount",
        "mount option",
    ],
)
def test_malformed_config_is_refused_clearly(tmp_path: Path, config: object, message: str) -> None:
    bundle = str(tmp_path) if config is None else _bundle(tmp_path, config)
    state = parse_state(json.dumps({**RUNC_STATE, "bundle": bundle}).encode())
    with pytest.raises(HookError, match=message):
        load_config(state)
