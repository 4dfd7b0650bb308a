"""The container runtime's part of the install: which runtime the node has, and the files that
give it the ``vcuda`` handler, taken from ``manifests/node/``.

The files there are the source: CRI-O's configuration is copied as it is,
and the hook entries (containerd's base spec, CRI-O's hooks.d files) are
copied with only the node paths and flags of this install put in.
containerd's handler takes the node's cgroup driver (``SystemdCgroup`` of its
default runtime) and goes where that containerd reads it:

- containerd 2.x (configuration version 3) merges imported files key by key:
  the handler is a drop-in, and a main ``config.toml`` without ``imports``
  gets one line importing it (an empty ``imports`` list, which ``containerd
  config default`` writes, is commented out for it, and restored by uninstall);
- containerd 1.6 and 1.7 (version 2) let an imported file replace a plugin's
  whole section, so a drop-in would wipe the node's own CRI settings (its
  sandbox image, its ``runc`` runtime): the handler's lines are added to
  ``config.toml`` itself, with containerd's built-in ``runc`` runtime written
  out when the file configures no runtime (the first one configured replaces
  the built-in ones).

Every line added to ``config.toml`` carries a mark, so that uninstall removes
exactly those lines.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

from runtime_hook.contract import Sharing
from runtime_hook.hook_cli import DEFAULT_STATE_DIR, parse_args
from runtime_hook.hook_errors import NodeError, UsageError

DEFAULT_PREFIX = "/usr/local/vcuda"
RUNTIMES = ("containerd", "crio")
BASE_SPEC = "/etc/vcuda/base-runtime-spec.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN = "/etc/containerd/conf.d/vcuda.toml"
CRIO_CONF = "/etc/crio/crio.conf.d/90-vcuda.conf"
CRIO_HOOKS_DIR = "/etc/containers/oci/hooks.d"
_CONTAINERD_FILES = {2: "containerd-1.7-vcuda.toml", 3: "containerd-2-vcuda.toml"}
_CRI_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
_CRIO_HOOKS = ("crio-vcuda-prestart.json", "crio-vcuda-poststop.json")
_DEFAULT_RUNC = ('[plugins."{plugin}".containerd.runtimes.runc]\n'
                 '  runtime_type = "io.containerd.runc.v2"')
_MARK = "# added by vcuda-node install; vcuda-node uninstall removes this line"
# The prefix of a line of the node's that install commented out; uninstall restores it.
_SET_ASIDE = "# set aside by vcuda-node install; vcuda-node uninstall restores it: "
# `containerd config default` (2.x) writes an empty imports list; install replaces it.
_EMPTY_IMPORTS = re.compile(r"(?m)^[ \t]*imports[ \t]*=[ \t]*\[[ \t]*\][ \t]*(#.*)?\n?")
# Where NVIDIA's container runtime is found: its packages, the GPU Operator's toolkit.
NVIDIA_RUNTIMES = ("/usr/bin/nvidia-container-runtime",
                   "/usr/local/nvidia/toolkit/nvidia-container-runtime",
                   "/usr/local/bin/nvidia-container-runtime")
_BINARY_KEYS = re.compile(r'(?m)^(\s*(?:BinaryName|runtime_path)\s*=\s*)"[^"\n]*"')
_SHARE = "/usr/local/share/vcuda/node"  # where the image keeps manifests/node
_CHECKOUT = Path(__file__).resolve().parents[2] / "manifests" / "node"


class RuntimeConfigError(NodeError, RuntimeError):
    """The node's runtime configuration cannot be set up; the message says what to do."""


class HookCommand(NamedTuple):
    """What the hook command of this install differs in: the install prefix, the hook's
    state dir, and the node's settings for shared GPUs."""

    prefix: str
    state_dir: str
    sharing: Sharing


def source_dir(explicit: str | None = None) -> Path:
    """``manifests/node``: ``explicit``, this checkout's, or the image's copy."""
    for candidate in ([explicit] if explicit else [str(_CHECKOUT), _SHARE]):
        if (Path(candidate) / "base-runtime-spec.json").is_file():
            return Path(candidate)
    looked = explicit or f"{_CHECKOUT}, {_SHARE}"
    raise RuntimeConfigError(f"the node configuration files (manifests/node) are not at {looked}: "
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
        raise RuntimeConfigError(f"cannot tell the node's container runtime: it has {what}; "
                                 "name it with --runtime containerd or --runtime crio")
    return found[0]


def nvidia_runtime(host_root: str, explicit: str | None = None) -> str:
    """The node path of NVIDIA's container runtime: ``explicit``, else the first one found."""
    for candidate in [explicit] if explicit else NVIDIA_RUNTIMES:
        if os.path.lexists(os.path.join(host_root, candidate.lstrip("/"))):
            return candidate
    if explicit:
        raise RuntimeConfigError(f"--runtime-binary {explicit}: no such file on the node")
    raise RuntimeConfigError(
        f"NVIDIA's container runtime is not on this node (looked at {', '.join(NVIDIA_RUNTIMES)}):"
        " install the NVIDIA Container Toolkit, or name it with --runtime-binary")


def _with_binary(text: str, binary: str) -> str:
    """``manifests/node``'s handler text running ``binary`` (containerd's BinaryName, CRI-O's
    runtime_path)."""
    return _BINARY_KEYS.sub(lambda m: f'{m.group(1)}"{binary}"', text)


def files(runtime: str, host_root: str, source: Path, hook: HookCommand,
          binary: str) -> dict[str, bytes]:
    """The runtime's files of this install, by host path (containerd's ``config.toml`` aside:
    see :func:`edit_containerd_config`)."""
    if runtime == "containerd":
        config = _read_text(host_root, CONTAINERD_CONFIG)
        if config is None:
            raise RuntimeConfigError(
                f"containerd has no {CONTAINERD_CONFIG}: create it with 'containerd "
                f"config default > {CONTAINERD_CONFIG}', then install again")
        version = containerd_version(config)
        spec = json.loads((source / "base-runtime-spec.json").read_text())
        spec["hooks"] = {stage: [render_hook(h, hook) for h in entries]
                         for stage, entries in spec["hooks"].items()}
        found = {BASE_SPEC: _json(spec)}
        if version == 3:
            found[CONTAINERD_DROP_IN] = handler(source, config, binary).encode()
        return found
    found = {CRIO_CONF: _with_binary((source / "crio-vcuda.conf").read_text(), binary).encode()}
    for name in _CRIO_HOOKS:
        document = json.loads((source / name).read_text())
        document["hook"] = render_hook(document["hook"], hook)
        found[f"{CRIO_HOOKS_DIR}/{name}"] = _json(document)
    return found


def handler(source: Path, config: str, binary: str) -> str:
    """``manifests/node``'s containerd handler for the main configuration text ``config``, with
    the cgroup driver of the node's default runtime, running NVIDIA's runtime ``binary``."""
    version = containerd_version(config)
    text = _with_binary((source / _CONTAINERD_FILES[version]).read_text(), binary)
    systemd = "true" if _systemd_cgroup(_toml(config), version) else "false"
    rendered = re.sub(r"(?m)^(\s*SystemdCgroup\s*=\s*)\S+", rf"\g<1>{systemd}", text)
    if _vcuda_runtime(_toml(rendered), version) is None:  # a bug in manifests/node, not the node
        raise RuntimeConfigError(
            f"{_CONTAINERD_FILES[version]} has no vcuda runtime for containerd")
    return rendered


def edit_containerd_config(config: str, source: Path, host_root: str,
                           binary: str) -> str | None:
    """containerd's main configuration text as install leaves it, or None if it needs no change.

    Version 2 gets the handler's lines (each marked), replacing those an
    earlier install added; version 3 gets a line importing the drop-in when
    its ``imports`` do not cover it already.
    """
    version = containerd_version(config)
    if version == 3:
        return None if imports_drop_in(config) else _add_import(config)
    own = remove_added_lines(config)
    _refuse_imported_cri_settings(own, host_root)
    expected = _toml(own)
    if _vcuda_runtime(expected, version) is not None:
        raise RuntimeConfigError(
            f"{CONTAINERD_CONFIG} already has a vcuda runtime that vcuda-node did "
            "not add: remove it, then install again")
    text = handler(source, config, binary)
    lines = [line for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")
             and not re.match(r"\s*version\s*=", line)]
    runtimes = _runtimes(expected, version)
    if not runtimes:
        # containerd's built-in runc runtime exists only while no runtime is configured: keep it.
        lines[:0] = _DEFAULT_RUNC.format(plugin=_CRI_PLUGINS[version]).splitlines()
        runtimes["runc"] = {"runtime_type": "io.containerd.runc.v2"}
    runtimes["vcuda"] = _vcuda_runtime(_toml(text), version)
    block = "".join(f"{line}  {_MARK}\n" for line in lines)
    edited = own + ("" if own.endswith("\n") or not own else "\n") + block
    if _toml(edited) != expected:
        raise RuntimeConfigError(
            f"{CONTAINERD_CONFIG} could not be given the vcuda runtime (its last "
            "table takes the added lines): add the vcuda runtime by hand from "
            f"{_CONTAINERD_FILES[version]}, then install again")
    return None if edited == config else edited


def render_hook(entry: dict, hook: HookCommand) -> dict:
    """A hook entry of ``manifests/node`` with this install's node paths and flags."""
    moved = []
    for arg in entry["args"]:
        if arg == DEFAULT_STATE_DIR:
            arg = hook.state_dir
        elif arg.startswith(DEFAULT_PREFIX + "/"):
            arg = hook.prefix + arg[len(DEFAULT_PREFIX) :]
        moved.append(arg)
    moved += hook.sharing.flags()
    script = next(i for i, arg in enumerate(moved) if arg.endswith("/runtime_hook/oci_hook.py"))
    try:
        parse_args(moved[script + 1 :])
    except UsageError as exc:  # the manifests and the hook disagree: a bug, not a node problem
        raise RuntimeConfigError(f"the hook would refuse its own command line: {exc}") from None
    return {**entry, "args": moved}


def containerd_version(config: str) -> int:
    """The version (2 or 3) of containerd's main configuration text."""
    version = _toml(config).get("version", 1)
    if version not in _CONTAINERD_FILES:
        raise RuntimeConfigError(f"{CONTAINERD_CONFIG} has configuration version {version}; vcuda "
                                 "supports 2 (containerd 1.6 and 1.7) and 3 (containerd 2.x)")
    return version


def imports_drop_in(config: str) -> bool:
    """Whether containerd's main configuration text imports vcuda's drop-in."""
    base = os.path.dirname(CONTAINERD_CONFIG)
    return any(
        fnmatch.fnmatchcase(CONTAINERD_DROP_IN, os.path.join(base, pattern))
        for pattern in _toml(config).get("imports", [])
    )


def _refuse_imported_cri_settings(config: str, host_root: str) -> None:
    """RuntimeConfigError if a file that version-2 ``config`` imports configures the CRI
    plugin: that section would replace the main file's, vcuda's runtime with it."""
    base = os.path.dirname(CONTAINERD_CONFIG)
    for pattern in _toml(config).get("imports", []):
        pattern = os.path.join(base, pattern).lstrip("/")
        for match in sorted(glob.glob(os.path.join(host_root, pattern))):
            imported = "/" + os.path.relpath(match, host_root)
            if imported == CONTAINERD_DROP_IN:  # an earlier vcuda's drop-in, removed by this one
                continue
            if _CRI_PLUGINS[2] in _toml(_read_text(host_root, imported) or "",
                                        imported).get("plugins", {}):
                raise RuntimeConfigError(
                    f"{imported}, imported by {CONTAINERD_CONFIG}, configures the CRI plugin, "
                    f"which then replaces all of {CONTAINERD_CONFIG}'s CRI settings (containerd "
                    "1.x): keep the CRI settings in one file, then install again")


def _add_import(config: str) -> str:
    """``config`` with a marked line importing the drop-in; RuntimeConfigError if it imports
    other files. An empty ``imports`` line is set aside (commented out, marked) for it."""
    line = f"imports = [{json.dumps(CONTAINERD_DROP_IN)}]  {_MARK}\n"
    parsed = _toml(config)
    if "imports" in parsed:
        empty = _EMPTY_IMPORTS.search(config)
        if parsed["imports"] != [] or empty is None:
            raise RuntimeConfigError(f"{CONTAINERD_CONFIG} has an imports list without "
                                     f"{CONTAINERD_DROP_IN}: add it there, then install again")
        aside = _SET_ASIDE + empty.group(0).rstrip("\n") + "\n"
        edited = config[:empty.start()] + aside + line + config[empty.end():]
        return _checked_import(edited)
    lines = config.splitlines(keepends=True)
    # Top-level keys must come before the first table: right after `version`, or first.
    at = next((i + 1 for i, text in enumerate(lines) if re.match(r"\s*version\s*=", text)), 0)
    if at and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    return _checked_import("".join([*lines[:at], line, *lines[at:]]))


def _checked_import(edited: str) -> str:
    """``edited``, once it imports the drop-in; else RuntimeConfigError."""
    if not imports_drop_in(edited):
        raise RuntimeConfigError(
            f"{CONTAINERD_CONFIG} could not be made to import {CONTAINERD_DROP_IN}: "
            "add the import by hand, then install again")
    return edited


def remove_added_lines(config: str) -> str:
    """``config`` without the lines install added."""
    return "".join(line.removeprefix(_SET_ASIDE) for line in config.splitlines(keepends=True)
                   if _MARK not in line)


def has_added_lines(config: str) -> bool:
    """Whether ``config`` holds lines install added."""
    return _MARK in config or _SET_ASIDE in config


def _runtimes(config: dict, version: int) -> dict:
    """The CRI plugin's ``containerd.runtimes`` table of a parsed configuration (made if absent)."""
    plugin = config.setdefault("plugins", {}).setdefault(_CRI_PLUGINS[version], {})
    return plugin.setdefault("containerd", {}).setdefault("runtimes", {})


def _vcuda_runtime(config: dict, version: int) -> dict | None:
    plugin = config.get("plugins", {}).get(_CRI_PLUGINS[version], {})
    return plugin.get("containerd", {}).get("runtimes", {}).get("vcuda")


def _systemd_cgroup(config: dict, version: int) -> bool:
    """Whether the node's default runtime uses the systemd cgroup driver (containerd's default:
    no)."""
    plugin = config.get("plugins", {}).get(_CRI_PLUGINS[version], {}).get("containerd", {})
    default = plugin.get("runtimes", {}).get(plugin.get("default_runtime_name", "runc"), {})
    return bool(default.get("options", {}).get("SystemdCgroup", False))


def _toml(text: str, path: str = CONTAINERD_CONFIG) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.9 and 3.10
        raise RuntimeConfigError(
            "reading containerd's configuration needs Python 3.11 or later") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuntimeConfigError(f"{path} is not valid TOML: {exc}") from None


def _read_text(host_root: str, path: str) -> str | None:
    try:
        return Path(host_root, path.lstrip("/")).read_text()
    except FileNotFoundError:
        return None


def _json(document: dict) -> bytes:
    return (json.dumps(document, indent=2) + "\n").encode()
