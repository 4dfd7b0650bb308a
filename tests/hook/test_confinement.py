"""The hook's judgement of a container's seccomp filter and capabilities, one filter at a time.

The filters under runc are in test_tenant_attacks; RuntimeDefault as containerd writes it is
in tests/cri.
"""

from __future__ import annotations

import pytest

from demo.node import NO_USER_NAMESPACES
from runtime_hook.confinement import CLONE_NEWUSER, escape_left_open

# Every CLONE_NEW* flag, as RuntimeDefault masks clone's flags.
_NEW_NAMESPACES = 0x7E020000


def _allow_list(*rules: dict) -> dict:
    """An allow-list filter, RuntimeDefault's shape: every call not named is refused."""
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
            "syscalls": [{"names": ["read", "write", "execve"], "action": "SCMP_ACT_ALLOW"},
                         *rules]}


def _clone(mask: int, datum: int = 0, action: str = "SCMP_ACT_ALLOW") -> dict:
    return {"names": ["clone"], "action": action,
            "args": [{"index": 0, "value": mask, "valueTwo": datum, "op": "SCMP_CMP_MASKED_EQ"}]}


RUNTIME_DEFAULT_LIKE = _allow_list(
    _clone(_NEW_NAMESPACES),
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38})


@pytest.mark.parametrize("seccomp", [RUNTIME_DEFAULT_LIKE, NO_USER_NAMESPACES,
                                     _allow_list(_clone(CLONE_NEWUSER))],
                         ids=["runtime-default", "deny-list", "clone-without-newuser"])
def test_filters_that_refuse_user_namespaces_leave_no_escape(seccomp: dict) -> None:
    assert escape_left_open(seccomp, {"bounding": ["CAP_KILL"]}) == ""


@pytest.mark.parametrize(("seccomp", "call"), [
    (_allow_list({"names": ["unshare"], "action": "SCMP_ACT_ALLOW"}), "unshare"),
    (_allow_list({"names": ["setns"], "action": "SCMP_ACT_ALLOW"}), "setns"),
    (_allow_list({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}), "clone3"),
    (_allow_list({"names": ["clone"], "action": "SCMP_ACT_ALLOW"}), "clone"),
    (_allow_list(_clone(0x00020000)), "clone"),  # masks CLONE_NEWNS only
    (_allow_list({"names": ["unshare"], "action": "SCMP_ACT_NOTIFY"}), "unshare"),
    (_allow_list({"names": ["unshare"], "action": "SCMP_ACT_LOG"}), "unshare"),
    ({"defaultAction": "SCMP_ACT_ALLOW"}, "unshare"),
    ({**NO_USER_NAMESPACES, "syscalls": NO_USER_NAMESPACES["syscalls"][1:]}, "unshare"),
    ({**NO_USER_NAMESPACES, "syscalls": [
        *NO_USER_NAMESPACES["syscalls"][:2],
        _clone(CLONE_NEWUSER | 0x00020000, CLONE_NEWUSER, "SCMP_ACT_ERRNO")]}, "clone"),
    (_allow_list({"names": ["setns"], "action": "SCMP_ACT_ALLOW",
                  "args": [{"index": 1, "value": 0, "op": "SCMP_CMP_EQ"}]}), "setns"),
], ids=["unshare", "setns", "clone3", "clone-any", "clone-mask-without-newuser",
        "notify", "log", "allow-all", "deny-list-without-unshare", "deny-list-narrow-clone",
        "setns-any-type"])
def test_a_filter_that_lets_one_call_reach_a_user_namespace_is_named(seccomp: dict,
                                                                     call: str) -> None:
    assert escape_left_open(seccomp, None) == (
        f"its seccomp filter lets {call} create or join a user namespace, from which it can "
        "mount over the limits")


def test_setns_into_a_fixed_other_namespace_type_is_no_escape() -> None:
    seccomp = _allow_list(_clone(_NEW_NAMESPACES), {
        "names": ["setns"], "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 1, "value": 0x40000000, "op": "SCMP_CMP_EQ"}]})  # CLONE_NEWNET
    assert escape_left_open(seccomp, None) == ""


@pytest.mark.parametrize("kind", ["bounding", "effective", "permitted", "ambient"])
def test_cap_sys_admin_in_any_set_is_an_escape(kind: str) -> None:
    assert escape_left_open(RUNTIME_DEFAULT_LIKE, {kind: ["CAP_SYS_ADMIN"]}) == (
        "its process holds CAP_SYS_ADMIN, with which it can unmount the limits")


def test_no_filter_is_an_escape() -> None:
    assert escape_left_open(None, None).startswith("it runs without a seccomp filter")
