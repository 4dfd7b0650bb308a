"""The container runtime's part of the install: which runtime the node has, and the files that
give it the ``vcuda`` handler, taken from ``manifests/node/``.

The files there are the source: containerd's drop-in and CRI-O's
configuration are copied as they are, and the hook entries (containerd's
base spec, CRI-O's hooks.d files) are copied with only the node paths and
flags of this install put in. containerd reads a drop-in only when its main
``config.toml`` imports it: when that file has no ``imports``, one line is
added (marked, so that uninstall removes exactly it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from runtime_hook.hook_cli import DEFAULT_STATE_DIR, UsageError, parse_args

DEFAULT_PREFIX = "/usr/local/vcuda"
RUNTIMES = ("containerd", "crio")
BASE_SPEC = "/etc/vcuda/base-runtime-spec.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN = "/etc/containerd/conf.d/vcuda.toml"
CRIO_CONF = "/etc/crio/crio.conf.d/90-vcuda.conf"
CRIO_HOOKS_DIR = "/etc/containers/oci/hooks.d"
_CONTAINERD_FILES = {2: "containerd-1.7-vcuda.toml", 3: "containerd-2-vcuda.toml"}
_CRIO_HOOKS = ("crio-vcuda-prestart.json", "crio-vcuda-poststop.json")
_IMPORT_MARK = "# added by vcuda-node install; vcuda-node uninstall removes this line"
_SHARE = "/usr/local/share/vcuda/node"  # where the image keeps manifests/node
_CHECKOUT = Path(__file__).resolve().parents[2] / "manifests" / "node"


class ConfigError(RuntimeError):
    """The node's runtime configuration cannot be set up; the message says what to do."""


class HookCommand(NamedTuple):
    """What the hook command of this install differs in: the install prefix, the hook's
    state dir, and its ``--memory-scaling``."""

    prefix: str
    state_dir: str
    memory_scaling: float


def source_dir(explicit: str | None = None) -> Path:
    """``manifests/node``: ``explicit``, this checkout's, or the image's copy."""
    for candidate in ([explicit] if explicit else [str(_CHECKOUT), _SHARE]):
        if (Path(candidate) / "base-runtime-spec.json").is_file():
            return Path(candidate)
    looked = explicit or f"{_CHECKOUT}, {_SHARE}"
    raise ConfigError(f"the node configuration files (manifests/node) are not at {looked}: "
                      "name their directory with --node-config")


def detect(host_root: str) -> str:
    """The node's runtime, ``containerd`` or ``crio``, from its configuration directories."""
    found = [
        name
        for name, marker in (("containerd", "etc/containerd"), ("crio", "etc/crio"))
        if os.path.isdir(os.path.join(host_root, marker))
    ]
    if len(found) != 1:
        what = "both /etc/containerd and /etc/crio" if found else "neither /etc/containerd nor " \
            "/etc/crio"
        raise ConfigError(f"cannot tell the node's container runtime: it has {what}; "
                          "name it with --runtime containerd or --runtime crio")
    return found[0]


def files(runtime: str, host_root: str, source: Path, hook: HookCommand) -> dict[str, bytes]:
    """The runtime's files of this install, by host path."""
    if runtime == "containerd":
        version = containerd_version(_read_text(host_root, CONTAINERD_CONFIG))
        spec = json.loads((source / "base-runtime-spec.json").read_text())
        spec["hooks"] = {stage: [render_hook(h, hook) for h in entries]
                         for stage, entries in spec["hooks"].items()}
        return {
            BASE_SPEC: _json(spec),
            CONTAINERD_DROP_IN: (source / _CONTAINERD_FILES[version]).read_bytes(),
        }
    found = {CRIO_CONF: (source / "crio-vcuda.conf").read_bytes()}
    for name in _CRIO_HOOKS:
        document = json.loads((source / name).read_text())
        document["hook"] = render_hook(document["hook"], hook)
        found[f"{CRIO_HOOKS_DIR}/{name}"] = _json(document)
    return found


def render_hook(entry: dict, hook: HookCommand) -> dict:
    """A hook entry of ``manifests/node`` with this install's node paths and flags."""
    moved = []
    for arg in entry["args"]:
        if arg == DEFAULT_STATE_DIR:
            arg = hook.state_dir
        elif arg.startswith(DEFAULT_PREFIX + "/"):
            arg = hook.prefix + arg[len(DEFAULT_PREFIX) :]
        moved.append(arg)
    if hook.memory_scaling != 1:
        moved += ["--memory-scaling", f"{hook.memory_scaling:g}"]
    script = next(i for i, arg in enumerate(moved) if arg.endswith("/runtime_hook/oci_hook.py"))
    try:
        parse_args(moved[script + 1 :])
    except UsageError as exc:  # the manifests and the hook disagree: a bug, not a node problem
        raise ConfigError(f"the hook would refuse its own command line: {exc}") from None
    return {**entry, "args": moved}


def containerd_version(config: str | None) -> int:
    """The version (2 or 3) of containerd's main configuration text."""
    if config is None:
        raise ConfigError(f"containerd has no {CONTAINERD_CONFIG}: create it with "
                          f"'containerd config default > {CONTAINERD_CONFIG}', then install again")
    version = _toml(config).get("version", 1)
    if version not in _CONTAINERD_FILES:
        raise ConfigError(f"{CONTAINERD_CONFIG} has configuration version {version}; vcuda "
                          "supports 2 (containerd 1.7) and 3 (containerd 2.x)")
    return version


def imports_drop_in(config: str) -> bool:
    """Whether containerd's main configuration text imports vcuda's drop-in."""
    base = os.path.dirname(CONTAINERD_CONFIG)
    return any(
        fnmatch.fnmatchcase(CONTAINERD_DROP_IN, os.path.join(base, pattern))
        for pattern in _toml(config).get("imports", [])
    )


def add_import(config: str) -> str:
    """``config`` with a marked line importing the drop-in; ConfigError if it has ``imports``."""
    if "imports" in _toml(config):
        raise ConfigError(f"{CONTAINERD_CONFIG} has an imports list without "
                          f"{CONTAINERD_DROP_IN}: add it there, then install again")
    line = f"imports = [{json.dumps(CONTAINERD_DROP_IN)}]  {_IMPORT_MARK}\n"
    lines = config.splitlines(keepends=True)
    # Top-level keys must come before the first table: right after `version`, or first.
    at = next((i + 1 for i, text in enumerate(lines) if re.match(r"\s*version\s*=", text)), 0)
    if at and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    edited = "".join([*lines[:at], line, *lines[at:]])
    if not imports_drop_in(edited):
        raise ConfigError(f"{CONTAINERD_CONFIG} could not be made to import {CONTAINERD_DROP_IN}: "
                          "add the import by hand, then install again")
    return edited


def remove_import(config: str) -> str:
    """``config`` without the line :func:`add_import` added."""
    return "".join(line for line in config.splitlines(keepends=True) if _IMPORT_MARK not in line)


def has_added_import(config: str) -> bool:
    """Whether ``config`` holds the line :func:`add_import` adds."""
    return _IMPORT_MARK in config


def _toml(text: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.9 and 3.10
        raise ConfigError("reading containerd's configuration needs Python 3.11 or later") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{CONTAINERD_CONFIG} is not valid TOML: {exc}") from None


def _read_text(host_root: str, path: str) -> str | None:
    try:
        return Path(host_root, path.lstrip("/")).read_text()
    except FileNotFoundError:
        return None


def _json(document: dict) -> bytes:
    return (json.dumps(document, indent=2) + "\n").encode()
