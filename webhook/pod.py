"""The parts of a Pod that vcuda reads, as typed values decoded straight from JSON.

Fields vcuda does not read are skipped by the decoder, unparsed; a field of
the wrong type fails the decoding with a message that gives its JSON path.
"""

from __future__ import annotations

from typing import Union

import msgspec

# A resource quantity as the API server serialises it ("40", "1k", "500m");
# numbers are accepted as Kubernetes itself accepts them.
Quantity = Union[str, int, float]


class Capabilities(msgspec.Struct, frozen=True):
    add: list[str] | None = None


class SeccompProfile(msgspec.Struct, frozen=True, rename="camel"):
    type: str | None = None
    localhost_profile: str | None = None


class SecurityContext(msgspec.Struct, frozen=True, rename="camel"):
    privileged: bool | None = None
    capabilities: Capabilities | None = None
    seccomp_profile: SeccompProfile | None = None


class PodSecurityContext(msgspec.Struct, frozen=True, rename="camel"):
    seccomp_profile: SeccompProfile | None = None


class Resources(msgspec.Struct, frozen=True):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(msgspec.Struct, frozen=True, rename="camel"):
    name: str
    resources: Resources | None = None
    security_context: SecurityContext | None = None


class PodSpec(msgspec.Struct, frozen=True, rename="camel"):
    containers: list[Container] = []
    init_containers: list[Container] | None = None
    runtime_class_name: str | None = None
    scheduler_name: str | None = None
    security_context: PodSecurityContext | None = None


class ObjectMeta(msgspec.Struct, frozen=True, rename="camel"):
    name: str | None = None
    generate_name: str | None = None
    annotations: dict[str, str] | None = None


class Pod(msgspec.Struct, frozen=True):
    metadata: ObjectMeta
    spec: PodSpec

