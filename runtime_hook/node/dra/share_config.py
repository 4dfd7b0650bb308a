"""What a claim configures of its vcuda.io shares: the opaque parameters of driver vcuda.io
in its allocation's config, where the scheduler copies them from the claim and its
DeviceClass (docs/DRA.md, "Virtual device memory")::

    config:
      - requests: [gpu]            # the requests it applies to; none: all of them
        opaque:
          driver: vcuda.io
          parameters: {apiVersion: vcuda.io/v1alpha1, kind: ShareConfig, virtualMemory: true}

The claim is the tenant's: these parameters choose only how its own share is served, never
how large it is (its cores and memory are what the scheduler allocated).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from runtime_hook.node.dra.allocation import AllocationError, as_object, claim_name
from runtime_hook.node.dra.slices import DRIVER

API_VERSION = "vcuda.io/v1alpha1"
KIND = "ShareConfig"
_KEYS = ("apiVersion", "kind", "virtualMemory")
_FIX = 'write them as {"apiVersion": "vcuda.io/v1alpha1", "kind": "ShareConfig", ' \
       '"virtualMemory": true} (docs/DRA.md, "Virtual device memory")'


def virtual_memory_asked(claim: Mapping[str, Any], requests: Collection[str]) -> bool:
    """Whether the claim's config for vcuda.io asks for virtual memory on its shares of
    ``requests`` (the last entry that says so decides, as later configs take precedence);
    raise AllocationError for parameters vcuda cannot read."""
    allocation = as_object(as_object(claim.get("status")).get("allocation"))
    configs = as_object(allocation.get("devices")).get("config") or []
    asked = False
    for config in map(as_object, configs if isinstance(configs, list) else []):
        opaque = as_object(config.get("opaque"))
        applies = config.get("requests") or []
        if opaque.get("driver") != DRIVER or (applies and not set(applies) & set(requests)):
            continue
        asked = _virtual_memory(opaque.get("parameters"), claim, asked)
    return asked


def _virtual_memory(parameters: Any, claim: Mapping[str, Any], asked: bool) -> bool:
    """``parameters``' virtualMemory (``asked`` when they leave it out)."""
    where = f"claim {claim_name(claim)}: the parameters of driver {DRIVER}"
    if not isinstance(parameters, Mapping):
        raise AllocationError(f"{where} are not an object", _FIX)
    if (parameters.get("apiVersion"), parameters.get("kind")) != (API_VERSION, KIND):
        raise AllocationError(f"{where} are apiVersion {parameters.get('apiVersion')!r}, kind "
                              f"{parameters.get('kind')!r}; vcuda reads {API_VERSION} {KIND}",
                              _FIX)
    unknown = sorted(str(key) for key in parameters if key not in _KEYS)
    if unknown:
        raise AllocationError(f"{where} have no {', '.join(unknown)}: they take virtualMemory",
                              _FIX)
    value = parameters.get("virtualMemory", asked)
    if not isinstance(value, bool):
        raise AllocationError(f"{where}: virtualMemory must be true or false, got {value!r}",
                              _FIX)
    return value

