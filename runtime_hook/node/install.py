"""``vcuda-node install`` and ``uninstall``: libvcuda.so, the hook and the runtime's ``vcuda``
handler on the host.

What goes where (paths of the node; ``--host-root`` is where the node's
root is mounted in the agent's container)::

    <prefix>/lib/libvcuda.so                 the shim
    <prefix>/python-<digest>/runtime_hook/   the hook's modules (standard library only)
    <prefix>/python -> python-<digest>       what the runtime's hook command names
    <prefix>/installed.json                  what this install wrote, for uninstall
    containerd: /etc/vcuda/base-runtime-spec.json, /etc/containerd/conf.d/vcuda.toml
    CRI-O:      /etc/crio/crio.conf.d/90-vcuda.conf, /etc/containers/oci/hooks.d/crio-vcuda-*.json

The order makes every interruption safe: the record of what is about to be
written comes first, then the shim and the hook (checked with the node's own
Python before the link moves to them), and only then the runtime's files
that make the handler use them. Each file is replaced atomically
(:mod:`~runtime_hook.node.host_files`). The hook runs from the real path of
its link target, so a hook started before an upgrade finishes on the
version it started with; the version before the current one is kept for it.
Running install again finishes an interrupted one; uninstall removes
exactly what the record lists.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import subprocess
from pathlib import Path
from typing import NamedTuple

from runtime_hook.contract import Sharing
from runtime_hook.hook_cli import DEFAULT_LIBRARY
from runtime_hook.hook_errors import NodeError
from runtime_hook.node import hook_files, host_files, runtime_config
from runtime_hook.node.logs import event
from runtime_hook.node.runtime_config import CONTAINERD_CONFIG, HookCommand, RuntimeConfigError

RECORD = "installed.json"
MIN_KERNEL = (5, 12)
_KINDS = ("runtime_files", "edits", "files", "links", "trees", "dirs")
_UNITS = {"containerd": "containerd", "crio": "crio"}
_NODE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_CHECKOUT_LIBRARY = Path(__file__).resolve().parents[2] / "cshim" / "build" / "libvcuda.so"
# Run by the node's Python with the installed tree: every hook module must import there.
_PYTHON_CHECK = """\
import sys
if sys.version_info < (3, 9):
    sys.exit("Python %s is older than 3.9" % sys.version.split()[0])
sys.path.insert(0, sys.argv[1])
for name in sys.argv[2:]:
    __import__("runtime_hook." + name)
print(sys.version.split()[0])
"""


class InstallError(NodeError, RuntimeError):
    """The install cannot go on; the message says why and what to do."""


class Options(NamedTuple):
    """The command line of install and uninstall (uninstall uses host_root, prefix, restart)."""

    host_root: str
    prefix: str
    state_dir: str
    runtime: str
    library: str | None
    node_config: str | None
    sharing: Sharing
    restart: bool
    runtime_binary: str | None = None
    kernel: str = os.uname().release  # the node's: a container shares its host's kernel


def install(options: Options, log: logging.Logger) -> list[str]:
    """Install, or finish or update an earlier install; return the node paths it changed."""
    root = _Root(options.host_root)
    runtime = options.runtime
    _check_kernel(options.kernel)
    try:
        if runtime == "auto":
            runtime = runtime_config.detect(options.host_root)
        source = runtime_config.source_dir(options.node_config)
        hook = HookCommand(options.prefix, options.state_dir, options.sharing)
        binary = "" if runtime == "none" else \
            runtime_config.nvidia_runtime(options.host_root, options.runtime_binary)
        runtime_files = (
            {} if runtime == "none"
            else runtime_config.files(runtime, options.host_root, source, hook, binary)
        )
        python = _node_python(source)
        main_config = root.read_text(CONTAINERD_CONFIG) if runtime == "containerd" else None
        edited = None
        if main_config is not None:
            edited = runtime_config.edit_containerd_config(main_config, source,
                                                           options.host_root, binary)
    except RuntimeConfigError as exc:
        raise InstallError(str(exc)) from None
    library = _library(options.library)
    tree = hook_files.files()
    prefix = options.prefix
    tree_dir = f"{prefix}/python-{hook_files.digest(tree)}"
    link = f"{prefix}/python"

    previous = _Record.load(root, prefix)
    planned = _Record(
        runtime,
        runtime_files=list(runtime_files),
        files=[f"{prefix}/lib/libvcuda.so"],
        links=[link],
        trees=[tree_dir],
        edits=[CONTAINERD_CONFIG] if edited or _has_edit(main_config) else [],
    )
    planned.dirs = root.missing_dirs(
        [*planned.runtime_files, *planned.files, *planned.links, *planned.trees]
    )
    previous.merged(planned).save(root, prefix)  # first: a crash from here on is undoable

    changed: list[str] = []
    runtime_changed = False
    for directory in planned.dirs:
        root.make_dirs(directory)
    if host_files.write_file(root.path(f"{prefix}/lib/libvcuda.so"), library, 0o644):
        changed.append(f"{prefix}/lib/libvcuda.so")
    if host_files.write_tree(root.path(tree_dir), tree):
        changed.append(tree_dir)
    _check_python(root, python, tree_dir, log)
    old_target = root.readlink(link)
    if host_files.write_link(root.path(link), os.path.basename(tree_dir)):
        changed.append(link)
    for path, data in runtime_files.items():
        root.make_dirs(os.path.dirname(path))
        if host_files.write_file(root.path(path), data, 0o644):
            changed.append(path)
            runtime_changed = True
    if edited is not None:
        host_files.write_file(root.path(CONTAINERD_CONFIG), edited.encode(),
                              root.mode(CONTAINERD_CONFIG))
        changed.append(CONTAINERD_CONFIG)
        runtime_changed = True

    # What the earlier install had and this one has not, but the hook version just replaced.
    keep = f"{prefix}/{old_target}" if old_target and f"{prefix}/{old_target}" != tree_dir else None
    if keep in previous.trees:
        planned.trees.append(keep)
    stale = previous.minus(planned)
    runtime_changed |= _remove(root, stale, changed)
    planned.dirs = [d for d in previous.merged(planned).dirs if root.exists(d)]
    if runtime != "none" and (runtime_changed or previous.restart_pending):
        # Recorded until done: a restart that fails is made by the next install, which would
        # otherwise find nothing to change and leave the runtime without the handler.
        planned.restart_pending = True
        planned.save(root, prefix)
        _restart(root, runtime, options.restart, log)
        planned.restart_pending = False
    planned.save(root, prefix)
    event(log, logging.INFO, "installed", runtime=runtime, prefix=prefix, changed=changed,
          hook=tree_dir)
    return changed


def uninstall(options: Options, log: logging.Logger) -> list[str]:
    """Remove what install wrote, as its record lists; return the node paths removed."""
    root = _Root(options.host_root)
    record = _Record.load(root, options.prefix)
    if record.empty():
        event(log, logging.INFO, "nothing_installed", prefix=options.prefix)
        return []
    removed: list[str] = []
    runtime_changed = _remove(root, record, removed) or record.restart_pending
    if runtime_changed and record.runtime in _UNITS:
        # The record, down to what is left to do, stays until the runtime restarted: an
        # uninstall whose restart failed is finished by the next one (kubelet runs the
        # DaemonSet's init container again), not taken for a node with nothing installed.
        pending = _Record(record.runtime, dirs=record.dirs)
        pending.restart_pending = True
        pending.save(root, options.prefix)
        _restart(root, record.runtime, options.restart, log)
    root.remove(f"{options.prefix}/{RECORD}")
    for directory in sorted(record.dirs, key=len, reverse=True):
        root.remove_empty_dir(directory)
    event(log, logging.INFO, "uninstalled", prefix=options.prefix, removed=removed)
    return removed


class Installed(NamedTuple):
    """What an install wrote on the node, by its record: the ``runtime`` it configured
    (``containerd``, ``crio``, ``none``), the runtime's configuration it wrote or edited,
    and its other files; ``missing``: those of them no longer on the node."""

    runtime: str
    runtime_config: list[str]
    files: list[str]
    missing: list[str]


def installed(host_root: str, prefix: str) -> Installed | None:
    """What the install under ``prefix`` wrote; None when nothing is installed there.
    Raise InstallError when its record is damaged."""
    root = _Root(host_root)
    record = _Record.load(root, prefix)
    if record.empty():
        return None
    config = sorted({*record.runtime_files, *record.edits})
    files = sorted({*record.files, *record.links, *record.trees})
    return Installed(record.runtime or "none", config, files,
                     [p for p in (*config, *files) if not root.exists(p)])


class _Record:
    """The paths an install wrote, by kind, and whether the runtime still needs the restart
    that makes it load or drop the handler; saved as ``<prefix>/installed.json``."""

    runtime_files: list[str]  # one list per kind of _KINDS
    edits: list[str]
    files: list[str]
    links: list[str]
    trees: list[str]
    dirs: list[str]

    def __init__(self, runtime: str = "", **kinds: list[str]) -> None:
        self.runtime = runtime
        self.restart_pending = False
        for kind in _KINDS:
            setattr(self, kind, list(kinds.get(kind, [])))

    @classmethod
    def load(cls, root: _Root, prefix: str) -> _Record:
        """The record, with the one a crash left before renaming it (complete, or ignored)."""
        path = f"{prefix}/{RECORD}"
        record = cls._parse(root.read_text(path), path)
        try:
            pending = cls._parse(root.read_text(host_files.temp_path(path)), path)
        except InstallError:
            return record  # cut short while being written: the rename never happened
        return record.merged(pending)

    @classmethod
    def _parse(cls, text: str | None, path: str) -> _Record:
        if text is None:
            return cls()
        try:
            body = json.loads(text)
            record = cls(body.get("runtime", ""), **{k: [str(p) for p in body[k]] for k in _KINDS})
            record.restart_pending = body.get("restart_pending") is True
            return record
        except (ValueError, KeyError, TypeError) as exc:
            raise InstallError(f"{path} is damaged ({exc!r}): remove what vcuda installed by "
                               "hand, delete the file, then install again") from None

    def save(self, root: _Root, prefix: str) -> None:
        body = {"version": 1, "runtime": self.runtime, "restart_pending": self.restart_pending,
                **{kind: sorted(set(getattr(self, kind))) for kind in _KINDS}}
        root.make_dirs(prefix)
        host_files.write_file(root.path(f"{prefix}/{RECORD}"),
                              (json.dumps(body, indent=2) + "\n").encode())

    def merged(self, other: _Record) -> _Record:
        both = _Record(other.runtime or self.runtime,
                       **{k: [*getattr(self, k), *getattr(other, k)] for k in _KINDS})
        both.restart_pending = self.restart_pending or other.restart_pending
        return both

    def minus(self, other: _Record) -> _Record:
        return _Record(self.runtime, **{
            k: [p for p in getattr(self, k) if p not in getattr(other, k)] for k in _KINDS})

    def empty(self) -> bool:
        return not self.restart_pending and not any(getattr(self, kind) for kind in _KINDS)


class _Root:
    """The node's filesystem under the host root; every method takes node paths."""

    def __init__(self, host_root: str) -> None:
        self.host_root = host_root

    def path(self, node_path: str) -> str:
        return os.path.join(self.host_root, node_path.lstrip("/"))

    def read_text(self, node_path: str) -> str | None:
        data = host_files.read_bytes(self.path(node_path))
        return None if data is None else data.decode()

    def readlink(self, node_path: str) -> str | None:
        try:
            return os.readlink(self.path(node_path))
        except OSError:
            return None

    def exists(self, node_path: str) -> bool:
        return os.path.lexists(self.path(node_path))

    def mode(self, node_path: str) -> int:
        return stat.S_IMODE(os.stat(self.path(node_path)).st_mode)

    def missing_dirs(self, node_paths: list[str]) -> list[str]:
        missing = set()
        for node_path in node_paths:
            directory = os.path.dirname(node_path)
            while directory != "/" and not self.exists(directory):
                missing.add(directory)
                directory = os.path.dirname(directory)
        return sorted(missing, key=len)

    def make_dirs(self, node_path: str) -> None:
        host_files.make_dirs(self.path(node_path))

    def remove(self, node_path: str) -> bool:
        host_files.remove(self.path(host_files.temp_path(node_path)))  # a crash's leftover
        return host_files.remove(self.path(node_path))

    def remove_empty_dir(self, node_path: str) -> None:
        with contextlib.suppress(OSError):  # not empty (something not ours), or gone already
            os.rmdir(self.path(node_path))


def _remove(root: _Root, record: _Record, removed: list[str]) -> bool:
    """Undo ``record``'s entries, the runtime's first; return whether a runtime file went."""
    runtime_changed = False
    for path in record.edits:
        root.remove(host_files.temp_path(path))  # a crash's leftover
        text = root.read_text(path)
        if text is not None and runtime_config.has_added_lines(text):
            host_files.write_file(root.path(path), runtime_config.remove_added_lines(text).encode(),
                                  root.mode(path))
            removed.append(path)
            runtime_changed = True
    for path in [*record.runtime_files, *record.links, *record.trees, *record.files]:
        if root.remove(path):
            removed.append(path)
            runtime_changed |= path in record.runtime_files
    return runtime_changed


def _has_edit(config: str | None) -> bool:
    return config is not None and runtime_config.has_added_lines(config)


def _library(explicit: str | None) -> bytes:
    candidates = [explicit] if explicit else [str(_CHECKOUT_LIBRARY), DEFAULT_LIBRARY]
    for candidate in candidates:
        data = host_files.read_bytes(candidate)
        if data is not None:
            return data
    raise InstallError(f"libvcuda.so is not at {', '.join(candidates)}: build it with "
                       "'make -C cshim', or name it with --library")


def _node_python(source: Path) -> str:
    """The Python the runtime runs the hook with (the hook entries' ``path``)."""
    spec = json.loads((source / "base-runtime-spec.json").read_text())
    return spec["hooks"]["prestart"][0]["path"]


def _in_root(root: _Root, command: list[str]) -> subprocess.CompletedProcess:
    """Run a node program ``command`` inside the host root, never a container's."""

    def enter() -> None:
        if root.host_root != "/":
            os.chroot(root.host_root)
        os.chdir("/")

    try:
        return subprocess.run(command, preexec_fn=enter, capture_output=True, text=True,
                              timeout=120, check=False, env={"PATH": _NODE_PATH})
    except OSError as exc:
        return subprocess.CompletedProcess(command, 127, "", f"{command[0]}: {exc.strerror}")


def _check_kernel(release: str) -> None:
    """Refuse a kernel older than the hook's system calls (mount_setattr came in 5.12)."""
    numbers = [int(part) for part in release.split("-")[0].split(".")[:2] if part.isdigit()]
    if len(numbers) == 2 and tuple(numbers) < MIN_KERNEL:
        raise InstallError(
            f"the node runs Linux {release}, older than "
            f"{'.'.join(map(str, MIN_KERNEL))}, whose mount_setattr the hook needs to mount "
            "the limits read-only: upgrade the node's kernel (README.md, Prerequisites)")


def _check_python(root: _Root, python: str, tree_dir: str, log: logging.Logger) -> None:
    """Import every hook module with the node's Python, as the runtime will run it."""
    names = [n for n in hook_files.modules() if n != "__init__"]
    result = _in_root(root, [python, "-I", "-S", "-c", _PYTHON_CHECK, tree_dir, *names])
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"the node's {python} cannot run the hook ({reason}); the hook needs "
                           "Python 3.9 or later with its standard library at that path")
    event(log, logging.INFO, "hook_checked", python=python, version=result.stdout.strip())


def _restart(root: _Root, runtime: str, restart: bool, log: logging.Logger) -> None:
    unit = _UNITS[runtime]
    if not restart:
        event(log, logging.WARNING, "restart_needed", runtime=runtime,
              message=f"restart {unit} for the vcuda handler to change")
        return
    result = _in_root(root, ["systemctl", "restart", unit])
    if result.returncode != 0:
        raise InstallError(f"cannot restart {unit} ({result.stderr.strip() or result.returncode}):"
                           f" restart it on the node for the vcuda handler to change")
    event(log, logging.INFO, "runtime_restarted", unit=unit)
