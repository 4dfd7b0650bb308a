"""The hook's command line, run as nodes run it: exit codes, one-line errors, the fast exit."""

from __future__ import annotations

import configparser
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from demo.node import NO_USER_NAMESPACES
from runtime_hook.contract import Sharing
from runtime_hook.device_assignment import device_plugin_spec
from runtime_hook.hook_cli import parse_args
from runtime_hook.hook_log import HookLog
from runtime_hook.ledger import Entry, commit
from runtime_hook.node_state import StateDir
from tests.hook.bundles import (
    HOOK_SCRIPT,
    PYTHON,
    REPO,
    HookSetup,
    limits_annotation,
)

GIB = 1 << 30


def _hook(args: list[str], stdin: bytes | None = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-I", "-S", str(HOOK_SCRIPT), *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )


def _flags(hook: HookSetup) -> list[str]:
    return hook.args("prestart")[5:]  # the hook's own flags, without python, file and stage


def _state(tmp_path: Path, annotations: dict[str, str]) -> bytes:
    """Write a bundle whose config carries ``annotations`` and one GPU; return its OCI state."""
    annotations = {"io.kubernetes.cri.container-name": "train", **annotations}
    env, mounts = device_plugin_spec(["GPU-a"])
    config = {"root": {"path": "rootfs"}, "process": {"env": env}, "mounts": mounts,
              "annotations": annotations, "linux": {"seccomp": NO_USER_NAMESPACES}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(tmp_path), "annotations": annotations}
    return json.dumps(state).encode()


def test_help_explains_the_stages_and_flags_without_waiting_for_stdin() -> None:
    result = _hook(["--help"], stdin=None)
    out = result.stdout.decode()
    assert result.returncode == 0
    for word in ("prestart", "poststop", "--state-dir", "--library", "--inventory",
                 "--memory-scaling", "--cores-scaling", "--max-sharers", "--log-level",
                 "vcuda.io/limits"):  # fmt: skip
        assert word in out


@pytest.mark.parametrize("args", [[], ["start"], ["--state-dir", "/run/vcuda"]])
def test_a_command_line_without_a_stage_is_refused_without_waiting_for_stdin(
    args: list[str],
) -> None:
    result = _hook(args, stdin=None)
    assert result.returncode == 2
    assert "expected one stage, prestart or poststop" in result.stderr.decode()


def test_container_without_limits_exits_at_once_and_touches_nothing(hook: HookSetup) -> None:
    state = b'{"id":"c1","pid":1,"bundle":"/nonexistent","annotations":{"a":"b"}}'
    result = _hook(["prestart", *_flags(hook)], state)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert list(hook.state_dir.iterdir()) == [] and not hook.log_file.exists()


def test_container_without_limits_is_let_go_before_os_or_the_package_loads(
    hook: HookSetup,
) -> None:
    sandbox = (
        b'{"id":"c1","annotations":{"io.kubernetes.cri.container-type":"sandbox",'
        b'"vcuda.io/limits":"{}"}}'
    )
    for state in (b'{"id":"c1","pid":1,"bundle":"/b","annotations":{"a":"b"}}', sandbox):
        result = subprocess.run(
            [PYTHON, "-I", "-S", "-X", "importtime", str(HOOK_SCRIPT), "prestart", *_flags(hook)],
            input=state, capture_output=True, timeout=30, check=True, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        loaded = {line.split("|")[-1].strip() for line in result.stderr.decode().splitlines()}
        assert "__future__" in loaded  # the file's own import: the listing is complete
        assert "os" not in loaded and not any(m.startswith("runtime_hook") for m in loaded)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("vcuda-hook: ")
    return lines[0]


def test_malformed_state_fails_with_one_clear_line(hook: HookSetup) -> None:
    line = _one_error_line(_hook(["prestart", *_flags(hook)], b'{"vcuda.io/limits": '))
    assert "the OCI state on stdin is not JSON" in line
    assert "fix: run the hook from an OCI runtime" in line


def test_malformed_annotation_fails_naming_the_container(hook: HookSetup, tmp_path: Path) -> None:
    state = _state(tmp_path, {"vcuda.io/limits": '{"train": {"cores": 300}}'})
    line = _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert line.startswith("vcuda-hook: container train (c1): annotation vcuda.io/limits: cores")
    assert "let the vcuda webhook write" in line


def test_missing_library_fails_the_start_with_the_fix(hook: HookSetup, tmp_path: Path) -> None:
    hook.library.unlink()
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    line = _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert f"the vcuda library {hook.library} is missing on this node" in line
    assert not (hook.state_dir / "containers").exists()  # refused before anything was committed


def test_each_refused_start_is_counted_for_the_node_agent(hook: HookSetup, tmp_path: Path) -> None:
    hook.library.unlink()
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    for _ in range(3):
        _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert StateDir(str(hook.state_dir)).refused_starts() == 3
    _hook(["poststop", *hook.args("poststop")[5:]], state)  # a stop is no refused start
    _hook(["prestart", "--log-level", "loud"], state)  # nor a command line the parser refuses
    assert StateDir(str(hook.state_dir)).refused_starts() == 3


def test_a_refusal_that_cannot_be_counted_still_refuses_with_one_line(
    hook: HookSetup, tmp_path: Path
) -> None:
    hook.library.unlink()
    (hook.state_dir / "refused-starts").mkdir()  # the count cannot be opened for writing
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    line = _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert f"the vcuda library {hook.library} is missing on this node" in line


def test_a_refusal_logged_to_a_full_disk_is_still_one_line(hook: HookSetup, tmp_path: Path) -> None:
    hook.library.unlink()
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    args = ["prestart", *_flags(hook), "--log-file", "/dev/full"]  # every write: ENOSPC
    line = _one_error_line(_hook(args, state))
    assert f"the vcuda library {hook.library} is missing on this node" in line


def test_malformed_inventory_fails_the_start(hook: HookSetup, tmp_path: Path) -> None:
    hook.inventory.write_text("{")
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    line = _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert f"GPU inventory {hook.inventory} is malformed" in line
    assert "fix: restart the node agent" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="the hook mounts the account tmpfs as root")
def test_missing_inventory_is_logged_and_only_the_memory_check_skipped(
    hook: HookSetup, tmp_path: Path
) -> None:
    # Our own process stands in for the container; mounting then fails (no such root),
    # which shows the hook went past the memory check, and rolled its record back.
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    line = _one_error_line(_hook(["prestart", *_flags(hook)], state))
    assert "cannot reach the container's process or root" in line
    assert f"no GPU inventory at {hook.inventory}: GPU memory is not checked" in (
        hook.log_file.read_text()
    )
    assert list((hook.state_dir / "containers").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["start"], "expected one stage, prestart or poststop, got ['start']"),
        (["prestart", "poststop"], "expected one stage"),
        (["prestart", "--memory-scaling", "0"], "--memory-scaling: '0' is not a number in (0"),
        (["prestart", "--memory-scaling=lots"], "--memory-scaling: 'lots' is not a number"),
        (["prestart", "--memory-scaling", "nan"], "--memory-scaling: 'nan' is not a number"),
        (["prestart", "--memory-scaling", "inf"], "--memory-scaling: 'inf' is not a number"),
        (["prestart", "--cores-scaling", "0.9"], "--cores-scaling: '0.9' is not a number in [1"),
        (["prestart", "--max-sharers", "-1"], "--max-sharers: '-1' is not a whole number in 0"),
        (["prestart", "--account-mib", "nan"], "--account-mib: invalid literal"),
        (["prestart", "--account-mib", "-4"], "--account-mib: -4 is not a positive whole number"),
        (["prestart", "--log-level", "loud"], "--log-level: 'loud' is not one of debug, info"),
        (["prestart", "--state-dir"], "--state-dir needs a value"),
        (["prestart", "--statedir", "/x"], "unknown option --statedir"),
    ],
)
def test_bad_command_line_is_refused_by_the_parser(
    args: list[str], message: str, tmp_path: Path
) -> None:
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    result = _hook(args, state)
    assert result.returncode == 2
    assert f"vcuda-hook: error: {message}" in result.stderr.decode()


def test_poststop_of_a_container_never_limited_is_quiet(hook: HookSetup, tmp_path: Path) -> None:
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    flags = hook.args("poststop")[5:]
    result = _hook(["poststop", *flags], state)
    assert (result.returncode, result.stderr) == (0, b"")
    assert not (hook.state_dir / "containers").exists()


def test_poststop_releases_containers_that_are_gone(hook: HookSetup, tmp_path: Path) -> None:
    exited = subprocess.Popen(["true"])
    exited.wait()
    state_dir = StateDir(str(hook.state_dir))
    entry = Entry("gone1", "ns", "pod", "train", exited.pid, 1, GIB, 30, ("GPU-a",))
    with state_dir.locked(1):
        commit(state_dir, entry)
    state = _state(tmp_path, limits_annotation(train=(30, GIB)))
    result = _hook(["poststop", *hook.args("poststop")[5:]], state)
    assert (result.returncode, result.stderr) == (0, b"")
    assert os.listdir(state_dir.containers) == []
    assert "INFO poststop: released gone1" in hook.log_file.read_text()


def test_console_script_points_at_the_same_entry() -> None:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    scripts = setup["options.entry_points"]["console_scripts"]
    assert "vcuda-hook = runtime_hook.oci_hook:main" in scripts.splitlines()


def test_log_lines_of_a_fresh_node_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "fresh" / "state" / "hook.log"
    HookLog(str(log), "info", "prestart").warning("no GPU inventory")
    assert log.read_text().endswith("WARNING prestart: no GPU inventory\n")
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o755


def test_the_sharing_flags_make_the_nodes_settings_and_default_to_none_of_them() -> None:
    assert parse_args(["prestart"]).sharing == Sharing()
    flags = parse_args(["prestart", "--cores-scaling", "1.2", "--max-sharers=4"])
    assert flags.sharing == Sharing(1.0, 1.2, 4)
