"""The claim's CDI spec: valid against the CDI specification's JSON schema, and applied by a real
CDI consumer (podman, from Debian's packages) to a busybox container that then sees its limits."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import jsonschema
import pytest
import referencing

from runtime_hook import contract
from runtime_hook.contract import Sharing
from runtime_hook.node import cdi_files
from runtime_hook.node.dra import cdi
from runtime_hook.node.dra.prepare import Paths, Preparer
from runtime_hook.node.dra.slices import DRIVER, device_name
from tests.busybox_root import make_busybox_root
from tests.dra.conftest import GPU0, GPU1, LIBRARY, DraNode, unmount_below
from tests.nvidia_cdi import write_nvidia_stand_in
from tests.podman import LIMITS, PODMAN, require_podman

# Debian's golang-github-container-orchestrated-devices-container-device-interface-dev
# (scripts/setup installs it) ships the specification's schema.
SCHEMA_DIR = Path("/usr/share/gocode/src/github.com/container-orchestrated-devices/"
                  "container-device-interface/schema")
IMAGE = "localhost/vcuda-dra-test-busybox:1"


def _validator() -> jsonschema.Draft7Validator:
    if not (SCHEMA_DIR / "schema.json").is_file():
        pytest.skip(f"no CDI schema at {SCHEMA_DIR} (scripts/setup installs it)")
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = referencing.Registry().with_resource(
        "defs.json", referencing.Resource.from_contents(defs, referencing.jsonschema.DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)


def test_the_spec_of_a_claim_validates_against_the_cdi_schema() -> None:
    body = cdi.spec("6f1c2b8e-1d3a-4c5b-9e7f-0a1b2c3d4e5f", "/run/vcuda/containers/claim-6f1c",
                    "/usr/local/vcuda/lib/libvcuda.so")
    _validator().validate(body)
    assert body["kind"] == "vcuda.io/claim" and body["cdiVersion"] == "0.5.0"


def test_the_schema_check_rejects_a_mount_without_its_container_path() -> None:
    body = cdi.spec("x", "/r", "/l/libvcuda.so")
    del body["devices"][0]["containerEdits"]["mounts"][0]["containerPath"]
    with pytest.raises(jsonschema.ValidationError) as caught:
        _validator().validate(body)
    # What was checked, not the validator's wording of it.
    assert caught.value.validator == "required"
    assert list(caught.value.path) == ["devices", 0, "containerEdits", "mounts", 0]


def test_the_spec_prepare_writes_validates_too(dra_node: DraNode) -> None:
    claim = dra_node.claim("schema", cores="30", memory="1Gi")
    uid = claim["metadata"]["uid"]
    dra_node.kubelet.prepare(claim)
    spec = json.loads(Path(cdi.spec_path(str(dra_node.cdi_dir), uid)).read_text())
    _validator().validate(spec)
    assert oct(os.stat(cdi.spec_path(str(dra_node.cdi_dir), uid)).st_mode & 0o777) == "0o644"
    assert [p.name for p in dra_node.cdi_dir.iterdir()] == [f"vcuda.io-claim_{uid}.json"]


def test_a_library_of_another_name_is_refused_since_its_directory_is_mounted() -> None:
    with pytest.raises(ValueError, match=r"the library /opt/libvcuda-2\.so must be named "
                                         r"libvcuda\.so"):
        cdi.spec("x", "/r", "/opt/libvcuda-2.so")


# --- podman ------------------------------------------------------------------------------------

def _podman_image(scratch: Path) -> str:
    require_podman("to apply CDI specs")
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode != 0:
        root = make_busybox_root(scratch / "rootfs", ("sh", "cat", "ls", "echo"))
        with tarfile.open(scratch / "rootfs.tar", "w") as tar:
            tar.add(root, arcname=".")
        subprocess.run(["podman", "import", "-q", str(scratch / "rootfs.tar"), IMAGE],
                       check=True, capture_output=True, timeout=120)
    return IMAGE


_SCRIPT = """
cat /etc/vcuda/limits; echo ---
cat /etc/ld.so.preload; echo ---
ls /usr/local/vcuda/lib; echo ---
echo "$NVIDIA_VISIBLE_DEVICES"; echo ---
(echo cores=100 > /etc/vcuda/limits) 2>&1; echo ---
mv /etc/vcuda /etc/vcuda.moved 2>&1 || echo still there; echo ---
echo from-the-container > /run/vcuda/probe && echo written
"""


def test_podman_applies_the_cdi_devices_prepare_returned_to_a_busybox_container(
        dra_node: DraNode, tmp_path: Path) -> None:
    image = _podman_image(tmp_path)
    if not Path(LIBRARY).is_file():
        pytest.skip(f"{LIBRARY} is not built (scripts/setup builds it)")
    claim = dra_node.claim("podman", cores="30", memory="10Gi")
    uid = claim["metadata"]["uid"]
    [device] = dra_node.kubelet.prepare(claim)[uid].devices
    gpu = GPU0 if device.device_name == device_name(GPU0) else GPU1
    write_nvidia_stand_in(dra_node.cdi_dir, (GPU0, GPU1))
    devices = [arg for cdi_id in device.cdi_device_ids for arg in ("--device", cdi_id)]
    # A private mount namespace in which the runtime's transient CDI directory is the
    # driver's; runc and cgroupfs, no network, and limits this machine's root may set.
    command = [*PODMAN, "run", "--rm", "--network", "none", *LIMITS, *devices, image,
               "sh", "-c", _SCRIPT]
    os.makedirs(cdi_files.DEFAULT_DIR, exist_ok=True)
    shell = f'mount --bind "$0" {cdi_files.DEFAULT_DIR} && exec "$@"'
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", shell,
                          str(dra_node.cdi_dir), *command],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr

    limits, preload, library, environment, write, move, probe = run.stdout.split("---\n")
    parsed = contract.parse_limits(limits)
    assert (parsed.memory, parsed.cores, parsed.devices) == (10 << 30, 30, (gpu,))
    assert preload == "/usr/local/vcuda/lib/libvcuda.so\n"
    assert "libvcuda.so" in library.split()
    assert environment == f"{gpu}\n"
    assert "Read-only file system" in write
    assert "resource busy" in move and move.endswith("still there\n")  # a mountpoint
    assert probe == "written\n"
    record = dra_node.state_dir / "containers" / f"claim-{uid}"
    assert (record / "account" / "probe").read_text() == "from-the-container\n"


def test_prepare_under_a_host_root_writes_the_spec_where_the_nodes_var_run_link_leads(
        tmp_path: Path) -> None:
    """The agent sees the node at /host; the node's /var/run is an absolute link to /run
    (Debian, Ubuntu), which must lead to the node's /run, not the agent container's."""
    if os.geteuid() != 0:
        pytest.skip("preparing a claim mounts its account tmpfs: needs root")
    root = tmp_path / "host"
    (root / "var").mkdir(parents=True)
    (root / "var" / "run").symlink_to("/run")
    state = root / "run" / "vcuda"
    state.mkdir(parents=True)
    contract.write_inventory(str(state / contract.INVENTORY_NAME),
                             [contract.Gpu(GPU0, 0, 16 << 30)])
    uid = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": device_name(GPU0),
              "consumedCapacity": {"cores": "30", "memory": "1Gi"}}
    claim = {"metadata": {"namespace": "team-a", "name": "linked", "uid": uid},
             "status": {"allocation": {"devices": {"results": [result]}}}}
    paths = Paths(str(root), "/run/vcuda", "/var/run/cdi", "/usr/local/vcuda/lib/libvcuda.so", 1)
    preparer = Preparer(paths, pool="node-1", sharing=Sharing())
    try:
        preparer.prepare(uid, claim)
        assert [p.name for p in (root / "run" / "cdi").iterdir()] == [
            f"vcuda.io-claim_{uid}.json"]
        preparer.unprepare(uid)
        assert list((root / "run" / "cdi").iterdir()) == []
    finally:
        unmount_below(root)
