"""`vcuda-node install` and `uninstall` on fake nodes: what lands where, idempotence, undo."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
import tomllib

from runtime_hook.contract import Sharing
from runtime_hook.hook_cli import parse_args
from runtime_hook.node import hook_files, install
from tests.node.nodes import REPO, Node, make_node

NODE_CONFIG = REPO / "manifests" / "node"
PREFIX = "/usr/local/vcuda"
HOOK = f"{PREFIX}/python/runtime_hook/oci_hook.py"
TREE = f"{PREFIX}/python-{hook_files.digest(hook_files.files())}"
MARK = "  # added by vcuda-node install; vcuda-node uninstall removes this line"


def _install(node: Node, library: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return node.run("install", "--library", str(library), *extra)


def _ok(result: subprocess.CompletedProcess[str]) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stderr.splitlines()]


def _changed(result: subprocess.CompletedProcess[str]) -> list[str]:
    [done] = [e for e in _ok(result) if e["event"] == "installed"]
    return done["changed"]


def _hook_entries(node: Node) -> list[dict]:
    spec = json.loads(node.path("/etc/vcuda/base-runtime-spec.json").read_text())
    return [hook for stage in ("prestart", "poststop") for hook in spec["hooks"][stage]]


def test_install_puts_the_shim_the_hook_and_containerds_handler_on_the_node(
    node: Node, library: Path
) -> None:
    changed = _changed(_install(node, library))
    assert set(changed) == {f"{PREFIX}/lib/libvcuda.so", TREE, f"{PREFIX}/python",
                            "/etc/vcuda/base-runtime-spec.json", "/etc/containerd/config.toml"}
    assert node.path(f"{PREFIX}/lib/libvcuda.so").read_bytes() == library.read_bytes()
    assert os.readlink(node.path(f"{PREFIX}/python")) == Path(TREE).name
    # With the default paths, the base spec is manifests/node's, byte for byte.
    spec = node.path("/etc/vcuda/base-runtime-spec.json").read_bytes()
    assert spec == (NODE_CONFIG / "base-runtime-spec.json").read_bytes()
    # containerd 1.x: the handler goes into config.toml itself (a drop-in would replace the
    # node's CRI settings); this config names no runtime, so containerd's runc is written out.
    config = node.path("/etc/containerd/config.toml").read_text()
    assert config == 'version = 2\n\n[plugins."io.containerd.cri"]\n' + "".join(
        f"{line}{MARK}\n" for line in [
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
            '  runtime_type = "io.containerd.runc.v2"',
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vcuda]',
            '  runtime_type = "io.containerd.runc.v2"',
            '  pod_annotations = ["vcuda.io/*"]',
            '  base_runtime_spec = "/etc/vcuda/base-runtime-spec.json"',
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vcuda.options]',
            '  BinaryName = "/usr/bin/nvidia-container-runtime"',
            "  SystemdCgroup = false",
        ])
    assert not node.path("/etc/containerd/conf.d").exists()
    assert node.restarts() == ["restart containerd"]


def test_a_containerd_1_node_keeps_its_cri_settings_and_its_cgroup_driver(
    node: Node, library: Path
) -> None:
    own = ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:9"\n'
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
           '  runtime_type = "io.containerd.runc.v2"\n'
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
           "  SystemdCgroup = true\n")
    node.write("/etc/containerd/config.toml", own)
    _ok(_install(node, library))
    config = node.path("/etc/containerd/config.toml").read_text()
    assert config.startswith(own)
    cri = tomllib.loads(config)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "pause:9"
    runtimes = cri["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "vcuda"}
    assert runtimes["runc"] == tomllib.loads(own)["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]["runc"]
    assert runtimes["vcuda"]["options"] == {
        "BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True}
    _ok(node.run("uninstall"))
    assert node.path("/etc/containerd/config.toml").read_text() == own


def test_an_install_over_an_earlier_one_replaces_its_lines_in_config_toml(
    node: Node, library: Path
) -> None:
    _ok(_install(node, library))
    _ok(_install(node, library, "--state-dir", "/run/vcuda-2"))
    config = node.path("/etc/containerd/config.toml").read_text()
    assert config.count("runtimes.vcuda]") == 1
    tomllib.loads(config)  # still one valid document


def test_the_node_gets_exactly_the_modules_the_hook_imports(node: Node, library: Path) -> None:
    _ok(_install(node, library))
    installed = {p.name for p in node.path(f"{TREE}/runtime_hook").glob("*.py")}
    assert {"oci_hook.py", "hook_cli.py", "prestart.py", "apply_limits.py", "inroot.py",
            "syscalls.py", "ledger.py", "__init__.py"} <= installed
    assert "run.py" not in installed
    assert not node.path(f"{TREE}/runtime_hook/node").exists()
    for name in installed:
        source = (REPO / "runtime_hook" / name).read_bytes()
        assert node.path(f"{TREE}/runtime_hook/{name}").read_bytes() == source


def test_the_installed_hook_runs_with_an_isolated_system_python(node: Node, library: Path) -> None:
    _ok(_install(node, library))
    # As the runtime runs it: the node path of the link, then the real path of its target.
    [entry] = _hook_entries(node)[:1]
    script = entry["args"].index(HOOK)
    command = ["/usr/bin/python3", *entry["args"][1:script], str(node.path(HOOK)), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, check=False,
                            env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: vcuda-hook {prestart,poststop}")


def test_a_second_install_changes_nothing_and_restarts_nothing(node: Node, library: Path) -> None:
    _ok(_install(node, library))
    before = node.tree()
    assert _changed(_install(node, library)) == []
    assert node.tree() == before
    assert node.restarts() == ["restart containerd"]


def test_uninstall_leaves_the_node_as_it_was_before_install(node: Node, library: Path) -> None:
    node.write("/etc/containerd/conf.d/other.toml", "# the admin's own drop-in\n")
    pristine = node.tree()
    _ok(_install(node, library))
    _ok(node.run("uninstall"))
    after = node.tree()
    after.pop("var/log/systemctl.calls")
    assert after == {k: v for k, v in pristine.items() if k != "var/log/systemctl.calls"}
    assert node.restarts() == ["restart containerd", "restart containerd"]


def _failing_systemctl(node: Node) -> str:
    """systemctl that records its call and fails; returns the working one, to put back."""
    working = node.path("/usr/bin/systemctl").read_text()
    node.write("/usr/bin/systemctl", working + "echo 'Failed to restart' >&2\nexit 1\n")
    return working


def test_an_install_whose_restart_failed_is_restarted_by_the_next_install(
        node: Node, library: Path) -> None:
    working = _failing_systemctl(node)
    failed = _install(node, library)
    assert failed.returncode != 0 and "cannot restart containerd" in failed.stderr
    node.write("/usr/bin/systemctl", working)
    assert _changed(_install(node, library)) == []  # the files are in place: only the restart
    _ok(_install(node, library))
    assert node.restarts() == ["restart containerd"] * 2  # the failed one, then one, not more


def test_an_uninstall_whose_restart_failed_is_finished_by_the_next_uninstall(
        node: Node, library: Path) -> None:
    pristine = node.tree()
    _ok(_install(node, library))
    working = _failing_systemctl(node)
    failed = node.run("uninstall")
    assert failed.returncode != 0 and "cannot restart containerd" in failed.stderr
    node.write("/usr/bin/systemctl", working)
    events = _ok(node.run("uninstall"))
    assert [e["event"] for e in events] == ["runtime_restarted", "uninstalled"]
    assert node.restarts() == ["restart containerd"] * 3
    assert [e["event"] for e in _ok(node.run("uninstall"))] == ["nothing_installed"]
    after = node.tree()
    assert {k: v for k, v in after.items() if k != "var/log/systemctl.calls"} == {
        k: v for k, v in pristine.items() if k != "var/log/systemctl.calls"}


def test_uninstall_of_a_node_without_an_install_does_nothing(node: Node) -> None:
    before = node.tree()
    events = _ok(node.run("uninstall"))
    assert [e["event"] for e in events] == ["nothing_installed"]
    assert node.tree() == before


def test_a_containerd_2_node_gets_the_version_3_drop_in(node: Node, library: Path) -> None:
    node.write("/etc/containerd/config.toml",
               'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    changed = _changed(_install(node, library))
    drop_in = node.path("/etc/containerd/conf.d/vcuda.toml").read_text()
    # As shipped, with the cgroup driver of the node's runc (containerd's default: cgroupfs).
    shipped = (NODE_CONFIG / "containerd-2-vcuda.toml").read_text()
    assert drop_in == shipped.replace("SystemdCgroup = true", "SystemdCgroup = false")
    # Its imports already cover the drop-in: the main config is left alone.
    assert "/etc/containerd/config.toml" not in changed
    assert "vcuda-node" not in node.path("/etc/containerd/config.toml").read_text()


def test_an_empty_imports_list_is_set_aside_for_the_drop_in_and_uninstall_restores_it(
    node: Node, library: Path,
) -> None:
    # As `containerd config default` (2.x) writes it.
    own = "version = 3\nroot = '/var/lib/containerd'\nimports = []\n\n[grpc]\n  uid = 0\n"
    node.write("/etc/containerd/config.toml", own)
    assert "/etc/containerd/config.toml" in _changed(_install(node, library))
    edited = node.path("/etc/containerd/config.toml").read_text()
    assert tomllib.loads(edited) == {**tomllib.loads(own),
                                     "imports": ["/etc/containerd/conf.d/vcuda.toml"]}
    assert "/etc/containerd/config.toml" not in _changed(_install(node, library))
    _ok(node.run("uninstall"))
    assert node.path("/etc/containerd/config.toml").read_text() == own


@pytest.mark.parametrize("systemd", [True, False])
def test_the_handler_takes_the_cgroup_driver_of_the_nodes_default_runtime(
    node: Node, library: Path, systemd: bool
) -> None:
    plugin = '[plugins."io.containerd.cri.v1.runtime".containerd'
    node.write("/etc/containerd/config.toml", f'version = 3\n{plugin}]\n'
               f'  default_runtime_name = "crun"\n{plugin}.runtimes.crun.options]\n'
               f"  SystemdCgroup = {str(systemd).lower()}\n")
    _ok(_install(node, library))
    drop_in = tomllib.loads(node.path("/etc/containerd/conf.d/vcuda.toml").read_text())
    vcuda = drop_in["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["vcuda"]
    assert vcuda["options"]["SystemdCgroup"] is systemd


def test_a_crio_node_gets_the_handler_and_the_hooks_d_files(tmp_path: Path, node: Node,
                                                           library: Path) -> None:
    crio = make_node(tmp_path / "crio")
    crio.path("/etc/crio").mkdir(parents=True)
    changed = _changed(_install(crio, library))
    hooks = {f"/etc/containers/oci/hooks.d/crio-vcuda-{s}.json" for s in ("prestart", "poststop")}
    assert set(changed) >= {"/etc/crio/crio.conf.d/90-vcuda.conf", *hooks}
    for path in hooks:
        name = Path(path).name
        assert crio.path(path).read_bytes() == (NODE_CONFIG / name).read_bytes()
    assert not crio.path("/etc/vcuda").exists()
    assert crio.restarts() == ["restart crio"]


def test_prefix_state_dir_and_sharing_settings_reach_the_hooks_command_line(
    node: Node, library: Path
) -> None:
    _ok(_install(node, library, "--prefix", "/opt/vcuda", "--state-dir", "/run/gpu",
                 "--memory-scaling", "1.5", "--cores-scaling", "1.2", "--max-sharers", "8"))
    for hook in _hook_entries(node):
        args = hook["args"]
        script = args.index("/opt/vcuda/python/runtime_hook/oci_hook.py")
        flags = parse_args(args[script + 1 :])
        assert (flags.state_dir, flags.library, flags.sharing) == (
            "/run/gpu", "/opt/vcuda/lib/libvcuda.so", Sharing(1.5, 1.2, 8))
    assert node.path("/opt/vcuda/python/runtime_hook/oci_hook.py").is_file()


def test_without_restart_the_install_says_the_runtime_needs_one(node: Node, library: Path) -> None:
    events = _ok(_install(node, library, "--no-restart-runtime"))
    [warning] = [e for e in events if e["event"] == "restart_needed"]
    assert warning["message"] == "restart containerd for the vcuda handler to change"
    assert node.restarts() == []


def test_runtime_none_installs_only_the_shim_and_the_hook(node: Node, library: Path) -> None:
    changed = _changed(_install(node, library, "--runtime", "none"))
    assert set(changed) == {f"{PREFIX}/lib/libvcuda.so", TREE, f"{PREFIX}/python"}
    assert node.restarts() == []


def _hook_source(tmp_path: Path, version: str) -> Path:
    """A copy of the hook's modules that differs from the others by a comment."""
    source = tmp_path / f"hook-{version}"
    source.mkdir()
    for module in (REPO / "runtime_hook").glob("*.py"):
        (source / module.name).write_bytes(module.read_bytes() + f"# {version}\n".encode())
    return source


# Runs the installer with the hook from HOOK_SOURCE, killed by SIGKILL just before its
# KILL_AT-th rename (0: never); prints how many renames it made.
_VERSIONED = """
import os, signal, sys
from pathlib import Path
from runtime_hook.node import hook_files
from runtime_hook.node.cli import main
hook_files.SOURCE = Path(sys.argv.pop(1))
kill_at, renames = int(sys.argv.pop(1)), 0
def counted(rename):
    def call(*args, **kwargs):
        global renames
        renames += 1
        if renames == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(*args, **kwargs)
    return call
os.replace, os.rename = counted(os.replace), counted(os.rename)
status = main()
print(renames)
sys.exit(status)
"""


def _install_version(node: Node, library: Path, source: Path,
                     kill_at: int = 0) -> subprocess.CompletedProcess[str]:
    return node.run(str(source), str(kill_at), "install", "--library", str(library),
                    python=("-c", _VERSIONED))


def _tree_of(source: Path) -> str:
    return f"{PREFIX}/python-{hook_files.digest(hook_files.files(source))}"


def test_an_upgrade_moves_the_link_and_keeps_the_replaced_hook_for_hooks_still_running(
    tmp_path: Path, node: Node, library: Path
) -> None:
    sources = [_hook_source(tmp_path, str(n)) for n in range(3)]
    for source in sources:
        _ok(_install_version(node, library, source))
    assert os.readlink(node.path(f"{PREFIX}/python")) == Path(_tree_of(sources[2])).name
    assert node.path(_tree_of(sources[1])).is_dir()  # the one just replaced
    assert not node.path(_tree_of(sources[0])).exists()
    _ok(node.run("uninstall"))
    assert not node.path(PREFIX).exists()


def _comparable(tree: dict[str, tuple]) -> dict[str, tuple]:
    """A node's tree without what runs leave behind: bytecode and the restart log."""
    return {k: v for k, v in tree.items()
            if "__pycache__" not in k and k != "var/log/systemctl.calls"}


def test_an_install_killed_at_any_point_leaves_old_or_new_files_and_a_rerun_completes_it(
    tmp_path: Path, library: Path
) -> None:
    old_library, new_library = tmp_path / "old.so", library
    old_library.write_bytes(b"\x7fELF the library of the installed version\n")
    old, new = _hook_source(tmp_path, "old"), _hook_source(tmp_path, "new")

    def upgraded_node(name: str) -> Node:
        fake = make_node(tmp_path / name)
        fake.write("/etc/containerd/config.toml", "version = 2\n")
        _ok(_install_version(fake, old_library, old))
        return fake

    reference = upgraded_node("reference")
    old_state = _comparable(reference.tree())
    renames = int(_install_version(reference, new_library, new).stdout)
    new_state = _comparable(reference.tree())
    assert renames >= 4  # the record, the library, the hook, the link

    for kill_at in range(1, renames + 1):
        fake = upgraded_node(f"killed-{kill_at}")
        killed = _install_version(fake, new_library, new, kill_at)
        assert killed.returncode == -9, killed.stderr
        state = _comparable(fake.tree())
        for path in set(old_state) | set(new_state):
            assert state.get(path) in (old_state.get(path), new_state.get(path)), (kill_at, path)
        link = os.readlink(fake.path(f"{PREFIX}/python"))
        assert f"{PREFIX}/{link}" in (_tree_of(old), _tree_of(new))
        _ok(_install_version(fake, new_library, new))
        assert _comparable(fake.tree()) == new_state, kill_at


def test_uninstall_after_a_killed_install_leaves_nothing_of_vcuda(
    tmp_path: Path, library: Path
) -> None:
    source = _hook_source(tmp_path, "only")
    for kill_at in (1, 3, 5, 6):
        fake = make_node(tmp_path / f"node-{kill_at}")
        fake.write("/etc/containerd/config.toml", "version = 2\n")
        pristine = _comparable(fake.tree())
        assert _install_version(fake, library, source, kill_at).returncode == -9
        _ok(fake.run("uninstall"))
        assert _comparable(fake.tree()) == pristine, kill_at


# --- what the installer refuses, and what it says -----------------------------------------------

def _fails(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("vcuda-node install: ") and message in last, last


def test_a_node_without_python3_is_refused_before_the_runtime_is_touched(
    tmp_path: Path, node: Node, library: Path
) -> None:
    bare = make_node(tmp_path / "bare", python=False)
    bare.write("/etc/containerd/config.toml", "version = 2\n")
    _fails(_install(bare, library), "the node's /usr/bin/python3 cannot run the hook")
    assert not bare.path("/etc/containerd/conf.d/vcuda.toml").exists()
    assert not bare.path(f"{PREFIX}/python").exists()
    assert bare.restarts() == []
    _ok(bare.run("uninstall"))  # what it wrote is recorded and goes
    assert not bare.path(PREFIX).exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "containerd has no /etc/containerd/config.toml: create it with"),
        ("version = 1\n", "has configuration version 1; vcuda supports 2"),
        ("version = 3\nimports = ['/etc/other.toml']\n", "has an imports list without "
         "/etc/containerd/conf.d/vcuda.toml: add it there"),
        ("version = 2\nimports = ['conf.d/*.toml']\n", "/etc/containerd/conf.d/cri.toml, "
         "imported by /etc/containerd/config.toml, configures the CRI plugin, which then replaces "
         "all of /etc/containerd/config.toml's CRI settings (containerd 1.x): keep the CRI "
         "settings in one file"),
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vcuda]\n',
         "/etc/containerd/config.toml already has a vcuda runtime that vcuda-node did not add"),
        ("version = [2\n", "/etc/containerd/config.toml is not valid TOML"),
    ],
)
def test_a_containerd_config_it_cannot_use_is_refused_with_what_to_do(
    node: Node, library: Path, config: str | None, message: str
) -> None:
    if config is None:
        node.path("/etc/containerd/config.toml").unlink()
    else:
        node.write("/etc/containerd/config.toml", config)
    node.write("/etc/containerd/conf.d/cri.toml",
               '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:9"\n')
    before = node.tree()
    _fails(_install(node, library), message)
    assert node.tree() == before  # refused before the first write


def test_a_node_with_both_or_no_runtime_must_name_it(tmp_path: Path, node: Node,
                                                     library: Path) -> None:
    node.path("/etc/crio").mkdir()
    _fails(_install(node, library), "it has both /etc/containerd and /etc/crio; name it with "
           "--runtime containerd or --runtime crio")
    empty = make_node(tmp_path / "empty")
    _fails(_install(empty, library), "neither /etc/containerd nor /etc/crio")


def test_a_node_without_nvidias_runtime_is_refused_before_anything_is_written(
    tmp_path: Path, library: Path
) -> None:
    bare = make_node(tmp_path / "bare", nvidia_runtime=None)
    bare.write("/etc/containerd/config.toml", "version = 2\n")
    before = bare.tree()
    _fails(_install(bare, library), "NVIDIA's container runtime is not on this node (looked at "
           "/usr/bin/nvidia-container-runtime, /usr/local/nvidia/toolkit/nvidia-container-runtime"
           ", /usr/local/bin/nvidia-container-runtime): install the NVIDIA Container Toolkit, or "
           "name it with --runtime-binary")
    assert bare.tree() == before


def test_the_gpu_operators_runtime_is_found_and_run_by_the_handler(
    tmp_path: Path, library: Path
) -> None:
    operator = make_node(tmp_path / "operator",
                         nvidia_runtime="/usr/local/nvidia/toolkit/nvidia-container-runtime")
    operator.write("/etc/containerd/config.toml", "version = 2\n")
    _ok(_install(operator, library))
    config = tomllib.loads(operator.path("/etc/containerd/config.toml").read_text())
    vcuda = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vcuda"]
    assert vcuda["options"]["BinaryName"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"


def test_a_runtime_binary_named_by_flag_is_used_and_must_exist(node: Node, library: Path) -> None:
    _fails(_install(node, library, "--runtime-binary", "/opt/nv/runtime"),
           "--runtime-binary /opt/nv/runtime: no such file on the node")
    node.write("/opt/nv/runtime", "#!/bin/sh\n")
    _ok(_install(node, library, "--runtime-binary", "/opt/nv/runtime"))
    assert 'BinaryName = "/opt/nv/runtime"' in node.path("/etc/containerd/config.toml").read_text()


def test_crio_runs_the_runtime_found(tmp_path: Path, library: Path) -> None:
    crio = make_node(tmp_path / "crio",
                     nvidia_runtime="/usr/local/nvidia/toolkit/nvidia-container-runtime")
    crio.path("/etc/crio").mkdir(parents=True)
    _ok(_install(crio, library))
    conf = tomllib.loads(crio.path("/etc/crio/crio.conf.d/90-vcuda.conf").read_text())
    [runtime] = conf["crio"]["runtime"]["runtimes"].values()
    assert runtime["runtime_path"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"


@pytest.mark.parametrize("release", ["5.11.0-1-amd64", "4.18.0-553.el8_10.x86_64"])
def test_a_kernel_older_than_5_12_is_refused_before_anything_is_written(
    node: Node, library: Path, release: str
) -> None:
    before = node.tree()
    options = install.Options(host_root=str(node.root), prefix=PREFIX, state_dir="/run/vcuda",
                              runtime="auto", library=str(library), node_config=None,
                              sharing=Sharing(), restart=True, kernel=release)
    with pytest.raises(install.InstallError) as refused:
        install.install(options, logging.getLogger("test"))
    assert str(refused.value) == (
        f"the node runs Linux {release}, older than 5.12, whose mount_setattr the hook needs to "
        "mount the limits read-only: upgrade the node's kernel (README.md, Prerequisites)")
    assert node.tree() == before


def test_a_missing_library_is_named(node: Node, tmp_path: Path) -> None:
    _fails(_install(node, tmp_path / "nowhere.so"), f"libvcuda.so is not at {tmp_path}/nowhere.so")


def test_a_hook_directory_not_made_by_vcuda_is_not_replaced(node: Node, library: Path) -> None:
    node.write(f"{PREFIX}/python/runtime_hook/oci_hook.py", "# copied by hand\n")
    _fails(_install(node, library), f"{node.path(PREFIX)}/python is a directory, not vcuda's "
           "link: move it away first")
    assert node.path(f"{PREFIX}/python/runtime_hook/oci_hook.py").read_text() == \
        "# copied by hand\n"
    assert not node.path("/etc/containerd/conf.d/vcuda.toml").exists()


def test_a_damaged_install_record_stops_install_and_uninstall(node: Node, library: Path) -> None:
    node.write(f"{PREFIX}/installed.json", "{not json")
    _fails(_install(node, library), "/usr/local/vcuda/installed.json is damaged")
    result = node.run("uninstall")
    assert result.returncode == 1 and "installed.json is damaged" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory-scaling", "0"], "'0' is not a number in (0, 100]"),
        (["--prefix", "usr/local"], "'usr/local' is not an absolute path"),
        (["--runtime", "docker"], "invalid choice: 'docker'"),
    ],
)
def test_bad_install_flags_are_refused_with_the_rule(node: Node, args: list[str],
                                                     message: str) -> None:
    result = node.run("install", *args)
    assert result.returncode == 2 and message in result.stderr
