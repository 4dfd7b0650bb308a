"""Whether a container is kept inside the mounts that hold its limits: seccomp and capabilities.

The shim's files are bind mounts in the container's root. A process that
creates a user namespace gets every capability over a new mount namespace,
where it can mount over ``/etc/ld.so.preload`` and ``/etc/vcuda`` and run
unlimited; one with CAP_SYS_ADMIN can do it in place. So a limited container
starts only when its seccomp filter refuses new user namespaces (``unshare``
and ``clone`` with CLONE_NEWUSER, ``clone3``, whose flags seccomp cannot read)
and joining one (``setns``), and its process lacks CAP_SYS_ADMIN. A mount
namespace alone, and the mount calls inside one (``mount``, ``open_tree``,
``move_mount``, ``fsopen``, ``pivot_root``), need CAP_SYS_ADMIN in the
namespace's owner, which such a process cannot get.

The filter is judged as the OCI spec gives it to the runtime (``linux.seccomp``)
and soundly: a rule that might allow a call counts as allowing it.
"""

from __future__ import annotations

import os

CLONE_NEWUSER = 0x10000000
# Actions under which a matched call goes ahead (a tracer or a listener may let it).
_PASSING = frozenset({"SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_NOTIFY"})
# The argument that holds clone's flags: the second on s390, the first elsewhere.
_CLONE_FLAGS_ARG = 1 if os.uname().machine.startswith("s390") else 0
_FLAGS_ARG = {"unshare": 0, "clone": _CLONE_FLAGS_ARG}
_ESCAPES = ("unshare", "clone", "clone3", "setns")


def escape_left_open(seccomp: object, capabilities: object) -> str:
    """What lets this container leave its limits' mounts; "" when nothing does.

    Args:
        seccomp: the OCI spec's ``linux.seccomp`` (None: no filter).
        capabilities: the OCI spec's ``process.capabilities`` (None: none).
    """
    if _holds_sys_admin(capabilities):
        return "its process holds CAP_SYS_ADMIN, with which it can unmount the limits"
    if not isinstance(seccomp, dict):
        return ("it runs without a seccomp filter, so it can create a user namespace and "
                "mount over the limits")
    passing_default = seccomp.get("defaultAction") in _PASSING
    rules = [r for r in seccomp.get("syscalls") or () if isinstance(r, dict)]
    for call in _ESCAPES:
        matching = [r for r in rules if call in (r.get("names") or ())]
        if _may_pass(call, matching, passing_default):
            return (f"its seccomp filter lets {call} create or join a user namespace, from "
                    "which it can mount over the limits")
    return ""


def _holds_sys_admin(capabilities: object) -> bool:
    if not isinstance(capabilities, dict):
        return False
    return any("CAP_SYS_ADMIN" in (capabilities.get(kind) or ())
               for kind in ("bounding", "effective", "permitted", "ambient", "inheritable"))


def _may_pass(call: str, rules: list, passing_default: bool) -> bool:
    """Whether some call of ``call`` that reaches a user namespace gets through ``rules``."""
    if passing_default:
        # A filter that allows by default holds only with a rule refusing every such call,
        # and no rule of the call's that lets one through.
        if any(r.get("action") in _PASSING for r in rules):
            return True
        return not any(_covers_every_escape(call, r) for r in rules)
    return any(r.get("action") in _PASSING and not _excludes_escape(call, r) for r in rules)


def _covers_every_escape(call: str, rule: dict) -> bool:
    """Whether a refusing ``rule`` matches every call of ``call`` into a user namespace."""
    args = rule.get("args") or ()
    if not args:
        return True
    index = _FLAGS_ARG.get(call)
    return (index is not None and len(args) == 1 and _masked(args[0], index)
            and args[0].get("value") == CLONE_NEWUSER
            and args[0].get("valueTwo") == CLONE_NEWUSER)


def _excludes_escape(call: str, rule: dict) -> bool:
    """Whether an allowing ``rule`` matches no call of ``call`` into a user namespace."""
    args = rule.get("args") or ()
    if call == "setns":  # nstype 0 joins whatever the descriptor names: only a fixed other type
        return any(isinstance(a, dict) and a.get("index") == 1 and a.get("op") == "SCMP_CMP_EQ"
                   and isinstance(a.get("value"), int) and a["value"] != 0
                   and not a["value"] & CLONE_NEWUSER for a in args)
    index = _FLAGS_ARG.get(call)
    if index is None:  # clone3: its flags are in memory that seccomp cannot read
        return False
    return any(_masked(a, index) and isinstance(a.get("value"), int)
               and isinstance(a.get("valueTwo", 0), int)
               and a["value"] & CLONE_NEWUSER and not a.get("valueTwo", 0) & CLONE_NEWUSER
               for a in args)


def _masked(arg: object, index: int) -> bool:
    return isinstance(arg, dict) and arg.get("index") == index and \
        arg.get("op") == "SCMP_CMP_MASKED_EQ"
