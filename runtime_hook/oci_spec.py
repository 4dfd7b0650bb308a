"""Reads what the runtime hands a hook: the OCI state on stdin and the bundle's config.json.

runc and crun differ: runc's state says ``"status": "creating"`` at prestart
and has no ``root``; crun says ``"created"`` and adds a ``root`` that may be
relative. Neither field is used: the root comes from config.json's
``root.path``, resolved against the bundle as the runtime spec says.
"""

from __future__ import annotations

import os

from runtime_hook import fast_json
from runtime_hook.hook_errors import HookError
from runtime_hook.record import Record

_MAX_CONFIG = 16 << 20
_FIX_RUNTIME = "run the hook from an OCI runtime (runc, crun) as a prestart or poststop hook"


class Container(Record):
    """What the hook needs to know about one container.

    ``id``, ``pid`` and ``bundle`` from the state; ``annotations`` (dict);
    ``rootfs`` (host path), ``readonly`` (whether the runtime makes the root
    read-only), ``env`` (a tuple) and ``mounts`` (a tuple of
    ``(destination, source, is_bind)``), ``seccomp`` (``linux.seccomp``, None
    without a filter) and ``capabilities`` (``process.capabilities``) from config.json.
    """

    _fields = ("id", "pid", "bundle", "annotations", "rootfs", "readonly", "env", "mounts",
               "seccomp", "capabilities")
    __slots__ = _fields
    _defaults = ("", False, (), (), None, None)
    id: str
    pid: int
    bundle: str
    annotations: dict[str, str]
    rootfs: str
    readonly: bool
    env: tuple[str, ...]
    mounts: tuple[tuple[str, str, bool], ...]
    seccomp: dict | None
    capabilities: dict | None


def parse_state(raw: bytes) -> Container:
    """Parse the OCI state JSON; raise HookError when it is not one."""
    try:
        state = fast_json.loads(raw)
    except ValueError as exc:
        raise HookError(f"the OCI state on stdin is not JSON ({exc})", _FIX_RUNTIME) from None
    if not isinstance(state, dict):
        raise HookError("the OCI state on stdin is not a JSON object", _FIX_RUNTIME)
    cid, bundle, pid = state.get("id"), state.get("bundle"), state.get("pid", 0)
    if not isinstance(cid, str) or not _safe_id(cid):
        raise HookError(f"the OCI state has no usable container id ({cid!r})", _FIX_RUNTIME)
    if not isinstance(bundle, str) or not os.path.isabs(bundle):
        raise HookError(f"the OCI state has no absolute bundle path ({bundle!r})", _FIX_RUNTIME)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise HookError(f"the OCI state has a bad pid ({pid!r})", _FIX_RUNTIME)
    annotations = state.get("annotations")
    annotations = {} if annotations is None else annotations
    if not isinstance(annotations, dict):
        raise HookError("the OCI state's annotations are not an object", _FIX_RUNTIME)
    return Container(id=cid, pid=pid, bundle=bundle, annotations=annotations)


def _safe_id(cid: str) -> bool:
    # The id names a directory in the state dir: no separators, no dot names.
    return 0 < len(cid) <= 1024 and "/" not in cid and "\0" not in cid and cid not in (".", "..")


def load_config(container: Container) -> Container:
    """Return ``container`` completed from ``<bundle>/config.json``."""
    path = os.path.join(container.bundle, "config.json")
    try:
        with open(path, "rb") as src:
            config = fast_json.loads(src.read(_MAX_CONFIG))
    except OSError as exc:
        raise HookError(f"cannot read {path}: {exc.strerror}", _FIX_RUNTIME) from None
    except ValueError as exc:
        raise HookError(f"{path} is not JSON ({exc})", _FIX_RUNTIME) from None
    try:
        root = config["root"]["path"]
        annotations = config.get("annotations")
        annotations = {} if annotations is None else annotations
        process = config.get("process") or {}
        env = tuple(process.get("env") or ())
        mounts = tuple(_mount(m) for m in config.get("mounts") or ())
        if not isinstance(root, str) or not root or not isinstance(annotations, dict):
            raise TypeError("root.path or annotations")
        if not all(isinstance(v, str) for v in (*annotations.values(), *env)):
            raise TypeError("a string was expected")
    except (KeyError, TypeError, AttributeError) as exc:
        raise HookError(f"{path} is not a valid OCI config ({exc!r})", _FIX_RUNTIME) from None
    return Container(
        id=container.id,
        pid=container.pid,
        bundle=container.bundle,
        annotations=annotations,
        rootfs=os.path.normpath(os.path.join(container.bundle, root)),
        readonly=config["root"].get("readonly") is True,
        env=env,
        mounts=mounts,
        seccomp=(config.get("linux") or {}).get("seccomp"),
        capabilities=process.get("capabilities"),
    )


def _mount(mount: dict) -> tuple[str, str, bool]:
    """``(destination, source, is_bind)`` of one entry of config.json's ``mounts``."""
    destination, source = mount["destination"], mount.get("source", "")
    options = mount.get("options") or ()
    if not all(isinstance(v, str) for v in (destination, source, mount.get("type", ""), *options)):
        raise TypeError("a mount's fields must be strings")
    is_bind = mount.get("type") == "bind" or bool({"bind", "rbind"} & set(options))
    return destination, source, is_bind
