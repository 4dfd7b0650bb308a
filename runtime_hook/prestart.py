"""The prestart stage: read the container's spec, decide whether it is limited, and if so apply."""

from __future__ import annotations

from runtime_hook.contract import LimitsFormatError, VcudaError
from runtime_hook.hook_cli import Flags
from runtime_hook.hook_errors import HookError
from runtime_hook.hook_log import HookLog
from runtime_hook.limits_decision import container_name, pod_of, requested_limits
from runtime_hook.oci_spec import Container, load_config, parse_state

# The limits the hook renders are the annotation's, checked, and the device plugin's GPUs.
_FIX_DEVICES = "check the device IDs the device plugin gives containers"


def run(state: bytes, flags: Flags, log: HookLog) -> None:
    """Run prestart for the container of the OCI ``state``; raise HookError to refuse it."""
    container = parse_state(state)
    try:
        container = load_config(container)
        log.tag = f"prestart {describe(container)}"
        request = requested_limits(container.annotations)
        if request is None:
            log.debug("no vcuda limits for this container")
            return
        # ctypes, the ledger and the mount work load only for limited containers.
        from runtime_hook import apply_limits

        apply_limits.apply(container, request, flags, log)
    except HookError as exc:
        exc.container = describe(container)
        raise
    except LimitsFormatError as exc:
        raise HookError(str(exc), _FIX_DEVICES, describe(container)) from None
    except VcudaError as exc:  # the inventory, the state dir: their errors carry the fix
        raise HookError(str(exc), exc.fix, describe(container)) from None


def describe(container: Container) -> str:
    """``namespace/pod/container (short id)``, as far as the annotations tell."""
    parts = (*pod_of(container.annotations), container_name(container.annotations))
    name = "/".join(p for p in parts if p)
    return f"{name} ({container.id[:12]})" if name else container.id[:12]
