"""The release's version: one source, and every command prints it with --version."""

from __future__ import annotations

import configparser
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hook.contract import VERSION
from runtime_hook.node import hook_files

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _console_scripts() -> list[str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options.entry_points"]["console_scripts"].strip().splitlines()
    return [line.split("=")[0].strip() for line in lines]


def test_the_package_metadata_takes_its_version_from_the_contract() -> None:
    assert importlib.metadata.version("vcuda") == VERSION


def test_every_command_is_covered() -> None:
    assert sorted(_console_scripts()) == sorted(
        ["vcuda-webhook", "vcuda-certs", "vcuda-hook", "vcuda-run", "vcuda-node",
         "vcuda-scheduler-extender"])


@pytest.mark.parametrize("command", _console_scripts())
def test_version_flag_prints_the_command_and_the_release(command: str) -> None:
    result = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True,
                            timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{command} {VERSION}\n", "")


def test_the_hook_as_nodes_get_it_prints_the_release(tmp_path: Path) -> None:
    # The files vcuda-node install copies, run by the node's python as the runtime runs them:
    # no package metadata, nothing but the standard library.
    for name, content in hook_files.files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    result = subprocess.run(
        [python, "-I", "-S", str(tmp_path / "runtime_hook" / "oci_hook.py"), "--version"],
        capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout) == (0, f"vcuda-hook {VERSION}\n")


def _checkout(tmp_path: Path) -> Path:
    """A repository holding the script and the contract, one commit."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "runtime_hook").mkdir()
    shutil.copy(REPO / "scripts" / "image-tag", tmp_path / "scripts")
    shutil.copy(REPO / "runtime_hook" / "contract.py", tmp_path / "runtime_hook")
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                   "commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(tmp_path), *command], check=True, timeout=30)
    return tmp_path


def _image_tag(checkout: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(checkout / "scripts" / "image-tag")], capture_output=True,
                          text=True, timeout=30, check=False)


def test_the_image_tag_is_the_release_and_the_commit(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    result = _image_tag(checkout)
    assert (result.returncode, result.stdout) == (0, f"{VERSION}-{commit[:12]}\n")


def test_a_tree_with_uncommitted_changes_gets_no_image_tag(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    with (checkout / "runtime_hook" / "contract.py").open("a") as contract:
        contract.write("# changed\n")
    result = _image_tag(checkout)
    assert (result.returncode, result.stdout) == (1, "")
    assert "image-tag: the tree has uncommitted changes" in result.stderr
