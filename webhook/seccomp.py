"""A limited container's seccomp profile: RuntimeDefault where it has none, never Unconfined.

A process that can create a user namespace gets every capability over a new
mount namespace, where it can mount over the files that hold its limits. The
runtime's default profile refuses that; Kubernetes applies no profile unless
asked (and Pod Security ``baseline`` does not ask). So every container that
shares a GPU gets ``seccompProfile: RuntimeDefault`` when neither it nor its
pod names one, ``Unconfined`` is refused, and so is a ``Localhost`` profile the
cluster has not listed as trusted. The hook checks the filter itself at start.
"""

from __future__ import annotations

from typing import Any

from webhook.config import Config
from webhook.pod import Container, SeccompProfile

RUNTIME_DEFAULT = "RuntimeDefault"


def seccomp_problem(profile: SeccompProfile | None, whose: str, who: str,
                    config: Config) -> str:
    """Why ``profile`` cannot hold ``who``, a limited container; "" when it can (or is None).

    Args:
        profile: the profile that applies, the container's own or else the pod's.
        whose: where it is written, for the message: "its" or "the pod's".
        who: the container as messages name it.
        config: the policy settings (the trusted Localhost profiles).
    """
    if profile is None or profile.type == RUNTIME_DEFAULT:
        return ""
    fix = ("remove it, and vcuda sets RuntimeDefault, which refuses them" if whose == "its"
           else "give the container seccompProfile type RuntimeDefault, which refuses them")
    if profile.type == "Localhost":
        name = profile.localhost_profile or ""
        if name in config.trusted_seccomp_profiles:
            return ""
        trusted = ", ".join(config.trusted_seccomp_profiles) or "none"
        return (f"{who} shares a GPU, and {whose} seccompProfile Localhost {name!r} is not one "
                f"that this cluster trusts to refuse user namespaces (trusted: {trusted}); "
                f"{fix}, or have the administrator add the profile to trusted_seccomp_profiles "
                "in vcuda's configuration")
    return (f"{who} shares a GPU, and {whose} seccompProfile {profile.type} lets it create a user "
            f"namespace, from which it could drop its limits; {fix}")


def default_profile(container: Container, container_path: str) -> tuple[str, dict[str, Any]]:
    """Where to add what, in a JSON Patch, to give ``container`` (at ``container_path``,
    ending in ``/``) the runtime's default profile."""
    profile = {"type": RUNTIME_DEFAULT}
    if container.security_context is None:
        return f"{container_path}securityContext", {"seccompProfile": profile}
    return f"{container_path}securityContext/seccompProfile", profile
