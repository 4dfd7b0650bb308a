"""The release's version: one source, and every command prints it with --version."""

from __future__ import annotations

import configparser
import importlib.metadata
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
