"""The webhook's policy settings: defaults, and loading them from a JSON file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec

from runtime_hook.contract import (
    DEFAULT_DOMAINS,
    MEMORY_UNIT,
    NVIDIA_SHARED_RESOURCE,
    SHARED_RESOURCE,
    ContractError,
    check_domains,
    gpus_resource,
    is_dns_subdomain,
    pointer_token,
    resource_names,
)
from webhook.errors import WebhookError
from webhook.json_errors import DECODE_ERRORS, unreadable
from webhook.quantity import QuantityError, parse_whole_quantity
from webhook.vocabulary import HAMI_MARKERS, VOLCANO_NAMES

_RESOURCE_NAME = re.compile(r"[a-z0-9.-]+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class ConfigError(WebhookError, ValueError):
    """The configuration is unusable; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Config:
    """What the policy accepts and what it writes into pods.

    Attributes:
        domains: resource domains whose ``<domain>/vcuda-core`` and
            ``<domain>/vcuda-memory`` requests vcuda handles.
        shared_resource: device-plugin resource a shared-mode container gets one of.
        exclusive_resource: device-plugin resource of whole GPUs.
        runtime_class: RuntimeClass set on pods with a shared-mode container.
        max_gpu_memory: bytes of the largest GPU; larger memory requests are denied.
        max_gpu_memory_from_nodes: whether the server replaces ``max_gpu_memory`` with
            the largest share vcuda's node agents publish, where it can read the Nodes
            (``max_gpu_memory`` then stands while none does); a configuration file that
            sets ``max_gpu_memory`` turns it off.
        scheduler_name: when set, the scheduler of pods that use GPUs
            (``vcuda-scheduler`` on clusters whose default scheduler cannot call
            vcuda's extender); None leaves ``spec.schedulerName`` alone.
        trusted_seccomp_profiles: the ``localhostProfile`` names of seccomp profiles on
            the nodes that refuse user namespaces, which a limited container may use
            instead of RuntimeDefault (the hook checks the filter again at start).
        hami_names: whether HAMi's ``nvidia.com/gpumem``, ``nvidia.com/gpumem-percentage``
            and ``nvidia.com/gpucores`` (with ``nvidia.com/gpu`` as their count) are read
            as vcuda requests; off by default, as they overlap NVIDIA's ``nvidia.com/gpu``.
    """

    domains: tuple[str, ...] = DEFAULT_DOMAINS
    shared_resource: str = NVIDIA_SHARED_RESOURCE
    exclusive_resource: str = "nvidia.com/gpu"
    runtime_class: str = "vcuda"
    max_gpu_memory: int = 80 << 30
    max_gpu_memory_from_nodes: bool = True
    scheduler_name: str | None = None
    trusted_seccomp_profiles: tuple[str, ...] = ()
    hami_names: bool = False

    def __post_init__(self) -> None:
        try:
            check_domains(self.domains)
        except ContractError as exc:
            raise ConfigError(f"domains: {exc}") from None
        for key in ("shared_resource", "exclusive_resource"):
            if not _RESOURCE_NAME.fullmatch(getattr(self, key)):
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not a resource name "
                                  "like 'nvidia.com/gpu'")
        if self.shared_resource == self.exclusive_resource:
            raise ConfigError("shared_resource and exclusive_resource must differ")
        if not is_dns_subdomain(self.runtime_class):
            raise ConfigError(f"runtime_class: {self.runtime_class!r} is not a RuntimeClass name")
        if self.scheduler_name is not None and not is_dns_subdomain(self.scheduler_name):
            raise ConfigError(f"scheduler_name: {self.scheduler_name!r} is not a scheduler name "
                              "like 'vcuda-scheduler'")
        if self.max_gpu_memory < MEMORY_UNIT:
            raise ConfigError(f"max_gpu_memory: must be at least 256Mi, got {self.max_gpu_memory}")

    @cached_property
    def vcuda_keys(self) -> tuple[tuple[str, str, str], ...]:
        """(domain, core resource, memory resource) for each domain."""
        return tuple((d, *resource_names(d)) for d in self.domains)

    @cached_property
    def gpus_keys(self) -> dict[str, str]:
        """The vcuda-gpus resource name beside each domain's vcuda-core resource name."""
        return {keys[1]: gpus_resource(keys[0]) for keys in self.vcuda_keys}

    @cached_property
    def max_memory_units(self) -> int:
        """The largest vcuda-memory request: the largest GPU's memory in 256 MiB units."""
        return self.max_gpu_memory // MEMORY_UNIT

    @cached_property
    def backend_resources(self) -> frozenset[str]:
        """The device-plugin resources vcuda writes."""
        return frozenset((self.shared_resource, self.exclusive_resource))

    @cached_property
    def escaped_resources(self) -> dict[str, str]:
        """The device-plugin resource names as JSON Pointer tokens."""
        names = (self.shared_resource, self.exclusive_resource)
        return {name: pointer_token(name) for name in names}

    @cached_property
    def shared_resources(self) -> frozenset[str]:
        """Every device-plugin resource of a shared GPU vcuda knows, whichever is configured:
        a container that asks for one itself would share a GPU without limits."""
        return frozenset((self.shared_resource, NVIDIA_SHARED_RESOURCE, SHARED_RESOURCE))

    @cached_property
    def watched_resources(self) -> frozenset[str]:
        """Every resource name that makes a container worth a closer look."""
        return (frozenset(k for keys in self.vcuda_keys for k in keys[1:])
                | frozenset(self.gpus_keys.values()) | self.shared_resources
                | VOLCANO_NAMES | HAMI_MARKERS)


_TYPES: dict[str, tuple[type, str]] = {
    "domains": (list, "a list of domain names"),
    "shared_resource": (str, "a resource name"),
    "exclusive_resource": (str, "a resource name"),
    "runtime_class": (str, "a RuntimeClass name"),
    "max_gpu_memory": (str, "a quantity such as \"80Gi\" or a number of bytes"),
    "deny_direct_shared": (bool, "true (a shared GPU asked for directly has no limits)"),
    "scheduler_name": (str, "a scheduler name such as \"vcuda-scheduler\", or null"),
    "trusted_seccomp_profiles": (list, "a list of localhostProfile names such as "
                                       "\"profiles/gpu.json\""),
    "hami_names": (bool, "true or false"),
}


def config_from_mapping(values: Any) -> Config:
    """Build a Config from parsed JSON; keys left out keep their defaults."""
    if not isinstance(values, dict):
        raise ConfigError("the configuration must be a JSON object")
    unknown = sorted(set(values) - set(_TYPES))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; known keys: {', '.join(_TYPES)}")
    settings: dict[str, Any] = {}
    for key, value in values.items():
        settings[key] = _convert(key, value)
    if settings.pop("deny_direct_shared", True) is not True:
        raise ConfigError("deny_direct_shared: false is no longer allowed: a container that asks "
                          "for a shared GPU's resource itself would run without limits; remove "
                          "the key")
    if "max_gpu_memory" in settings:  # set by the operator: it wins over what nodes publish
        settings["max_gpu_memory_from_nodes"] = False
    return Config(**settings)


def load_config(path: Path) -> Config:
    """Read and check a JSON configuration file; raise ConfigError naming the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    try:
        values = msgspec.json.decode(data)
    except DECODE_ERRORS:
        raise ConfigError(f"{path}: {unreadable(data)}") from None
    try:
        return config_from_mapping(values)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _convert(key: str, value: Any) -> Any:
    kind, wanted = _TYPES[key]
    if key == "max_gpu_memory":
        try:
            return parse_whole_quantity(value)
        except QuantityError:
            raise ConfigError(f"{key}: expected {wanted}, got {value!r}") from None
    if key in ("domains", "trusted_seccomp_profiles"):
        if not isinstance(value, list) or not all(isinstance(d, str) and d for d in value):
            raise ConfigError(f"{key}: expected {wanted}, got {value!r}")
        return tuple(value)
    if key == "scheduler_name" and value is None:
        return None  # null: leave pods' scheduler alone, the default
    if not isinstance(value, kind):
        raise ConfigError(f"{key}: expected {wanted}, got {value!r}")
    return value
