"""The admission policy: from a pod and the operation to a decision and a JSON Patch."""

from __future__ import annotations

from typing import Optional

import msgspec

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    CORES_PER_GPU,
    LIMITS_ANNOTATION,
    MAX_SHARED_GPUS,
    MEMORY_UNIT,
    SHARE_MAX,
    SHARE_MIN,
    SHARES,
    VIRTUAL_MEMORY_ANNOTATION,
    pointer_token,
    render_limits_annotation,
)
from webhook.config import Config
from webhook.patch import Operation, PatchBuilder
from webhook.pod import Container, ObjectMeta, Pod, Quantity, SeccompProfile, SecurityContext
from webhook.quantity import QuantityError, parse_whole_quantity
from webhook.seccomp import default_profile, seccomp_problem
from webhook.vocabulary import is_byte_size, translate, vocabulary_of, whole_limit

_ANNOTATIONS_PATH = "/metadata/annotations"
_LIMITS_ANNOTATION_PATH = f"{_ANNOTATIONS_PATH}/{pointer_token(LIMITS_ANNOTATION)}"
_ASSIGNMENT_ANNOTATION_PATH = f"{_ANNOTATIONS_PATH}/{pointer_token(ASSIGNMENT_ANNOTATION)}"
_RUNTIME_CLASS_PATH = "/spec/runtimeClassName"
_SCHEDULER_NAME_PATH = "/spec/schedulerName"
_DEFAULT_SCHEDULER = "default-scheduler"
_ESCALATING_CAPABILITIES = frozenset({"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"})
_Values = Optional[dict[str, Quantity]]


class Decision(msgspec.Struct, frozen=True):
    """What the webhook answers: allowed or not, why, warnings, and the patch."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[Operation, ...] = ()

    @classmethod
    def deny(cls, message: str) -> Decision:
        """A denial whose message tells the user what to write instead."""
        return cls(allowed=False, message=message)


_UNCHANGED = Decision(allowed=True)


def decide(pod: Pod | None, operation: str, old_pod: Pod | None, config: Config) -> Decision:
    """Review one pod.

    Args:
        pod: the pod as sent by the API server (``request.object``).
        operation: ``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT``.
        old_pod: the stored pod on UPDATE (``request.oldObject``), else None.
        config: the policy settings.
    """
    if operation == "CREATE":
        if pod is None:
            return Decision.deny("the review holds no pod: request.object is missing")
        return _review_create(pod, config)
    if operation == "UPDATE":
        if pod is None or old_pod is None:
            return Decision.deny("the review of an UPDATE needs request.object and "
                                 "request.oldObject")
        return _review_update(pod, old_pod)
    if operation in ("DELETE", "CONNECT"):
        return _UNCHANGED
    return Decision.deny(f"unknown operation {operation!r}; expected CREATE or UPDATE")


class _Findings:
    """What the review of one pod's containers found, gathered before deciding."""

    __slots__ = ("limits", "patch", "pod_seccomp", "problems", "uses_gpus", "vocabularies",
                 "warnings")

    def __init__(self, pod_seccomp: SeccompProfile | None = None) -> None:
        self.pod_seccomp = pod_seccomp  # the pod's own seccompProfile, for containers without
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.limits: dict[str, dict[str, int]] = {}
        self.patch = PatchBuilder()
        self.uses_gpus = False  # some container asks for a share or whole GPUs
        self.vocabularies: dict[str, str] = {}  # names a container wrote ("vcuda", ...) -> who


# How one container uses GPUs: the device-plugin resource it gets, how many, and its
# entry of the limits annotation (None for whole GPUs).
_Mode = tuple[str, int, Optional[dict[str, int]]]


def _review_create(pod: Pod, config: Config) -> Decision:
    spec = pod.spec
    watched = config.watched_resources
    findings = _Findings(spec.security_context.seccomp_profile if spec.security_context else None)
    for list_name, label, containers in (("initContainers", "init container",
                                          spec.init_containers),
                                         ("containers", "container", spec.containers)):
        for index, container in enumerate(containers or ()):
            resources = container.resources
            if resources is None:
                continue
            limits, requests = resources.limits, resources.requests
            # Most containers name no resource vcuda cares about: skip them at C speed.
            if (limits and not watched.isdisjoint(limits)) or \
                    (requests and not watched.isdisjoint(requests)):
                _review_container(container, limits, requests,
                                  f"/spec/{list_name}/{index}/resources/", label, config,
                                  findings)
    if len(findings.vocabularies) > 1:
        findings.problems.append(_mixed_vocabularies(findings.vocabularies, config))
    _ask_virtual_memory(pod.metadata, findings)
    if findings.problems:
        return Decision.deny("; ".join(findings.problems))
    _write_pod_fields(pod, config, findings)
    if not findings.patch.operations and not findings.warnings:
        return _UNCHANGED
    return Decision(allowed=True, warnings=tuple(findings.warnings),
                    patch=tuple(findings.patch.operations))


def _review_update(pod: Pod, old_pod: Pod) -> Decision:
    new_value = _annotation(pod.metadata)
    old_value = _annotation(old_pod.metadata)
    if new_value != old_value:
        was = "absent" if old_value is None else f"'{old_value}'"
        return Decision.deny(
            f"{LIMITS_ANNOTATION} is written by vcuda when the pod is created and cannot be "
            f"changed afterwards; keep it as it was ({was}). To change a pod's GPU limits, "
            "create a new pod with other vcuda-core and vcuda-memory limits")
    new_value = _annotation(pod.metadata, ASSIGNMENT_ANNOTATION)
    old_value = _annotation(old_pod.metadata, ASSIGNMENT_ANNOTATION)
    if new_value != old_value:
        was = "absent" if old_value is None else f"'{old_value}'"
        return Decision.deny(
            f"{ASSIGNMENT_ANNOTATION} is written by vcuda's scheduler when it binds the pod, "
            f"and by nothing else; keep it as it was ({was})")
    return _UNCHANGED


def _review_container(container: Container, limits: _Values, requests: _Values,
                      resources_path: str, label: str, config: Config,
                      findings: _Findings) -> None:
    """Check one container; record its limits and the patch of its resources."""
    problems = findings.problems
    who = f'{label} "{container.name}"'
    vocabulary = vocabulary_of(limits, requests, config.hami_names)
    if vocabulary:
        translated = _translated(vocabulary, limits, requests, resources_path, who, config,
                                 findings)
        if translated is None:
            return
        limits, requests = translated
    keys = _vcuda_keys(limits, requests, config, who, problems)
    if keys is None:
        return
    findings.vocabularies.setdefault(vocabulary or "vcuda", who)
    gpus_key = config.gpus_keys[keys[0]]
    if not container.name:
        problems.append(f"a {label} without a name asks for {keys[0]}; name it")
        return
    count_before = len(problems)
    if requests and not config.watched_resources.isdisjoint(requests):
        _check_requests_match_limits(limits, requests, (*keys, gpus_key), who, problems)
    mode = _mode(container, limits, keys, who, config, findings)
    if mode is None or not limits:  # a mode comes from limits: they are there
        return
    backend, count, shares = mode
    backends = config.backend_resources
    if not backends.isdisjoint(limits) or (requests and not backends.isdisjoint(requests)):
        _check_backend(limits, requests, backend, count, who, keys[0], config, problems)
    foreign = _shared_asked_directly(limits, requests, config, but=config.shared_resource)
    if foreign:
        problems.append(f"{who} asks for {keys[0]} and for {foreign} as well, a shared GPU "
                        f"that vcuda does not give here and would not limit; remove {foreign}")
    if len(problems) > count_before:
        return
    # A backend resource already present agrees (checked above), so only add.
    token = config.escaped_resources[backend]
    if backend not in limits:
        findings.patch.add(f"{resources_path}limits/{token}", str(count))
    if requests and keys[0] in requests and backend not in requests:
        findings.patch.add(f"{resources_path}requests/{token}", str(count))
    _canonical_domain(limits, requests, keys, resources_path, who, config, findings)
    if not vocabulary:  # the count lives in the annotation: no node advertises vcuda-gpus
        for field, values in (("limits", limits), ("requests", requests)):
            if values and gpus_key in values:
                findings.patch.remove(f"{resources_path}{field}/{pointer_token(gpus_key)}")
    findings.uses_gpus = True
    if shares is not None:
        if container.name in findings.limits:
            problems.append(f'{who}: the name "{container.name}" is used by two containers; '
                            "give each container its own name")
        findings.limits[container.name] = shares
        _hold_seccomp(container, resources_path.removesuffix("resources/"), who, config,
                      findings)


def _hold_seccomp(container: Container, container_path: str, who: str, config: Config,
                  findings: _Findings) -> None:
    """A limited container keeps a profile that refuses user namespaces, or gets RuntimeDefault."""
    context = container.security_context
    own = context.seccomp_profile if context else None
    profile, whose = (own, "its") if own is not None else (findings.pod_seccomp, "the pod's")
    if profile is None:
        findings.patch.add(*default_profile(container, container_path))
        return
    problem = seccomp_problem(profile, whose, who, config)
    if problem:
        findings.problems.append(problem)


def _canonical_domain(limits: _Values, requests: _Values, keys: tuple[str, str],
                      resources_path: str, who: str, config: Config,
                      findings: _Findings) -> None:
    """Move vcuda resources of another accepted domain to the first one, which alone is
    advertised and accounted: a node's GPUs are not counted once per domain."""
    canonical = config.vcuda_keys[0][1:]
    if keys == canonical:
        return
    for field, values in (("limits", limits), ("requests", requests)):
        for key, target in zip(keys, canonical):
            if values and key in values:
                findings.patch.remove(f"{resources_path}{field}/{pointer_token(key)}")
                findings.patch.add(f"{resources_path}{field}/{pointer_token(target)}",
                                   str(values[key]))
    findings.warnings.append(f"{who}: {keys[0]} and {keys[1]} were written as {canonical[0]} and "
                             f"{canonical[1]}, the names vcuda accounts")


def _translated(vocabulary: str, limits: _Values, requests: _Values, resources_path: str,
                who: str, config: Config, findings: _Findings) -> tuple[_Values, _Values] | None:
    """The container's limits and requests with Volcano's or HAMi's names read as vcuda's, and
    the patch that rewrites them; None after a problem."""
    problems = findings.problems
    core_key, memory_key = config.vcuda_keys[0][1:]
    own = f"{core_key}: {SHARES}, {memory_key}: N (units of 256 MiB)"
    if vocabulary == "Volcano and HAMi":
        problems.append(f"{who} mixes Volcano's and HAMi's names; keep one of them, or write "
                        f"vcuda's own ({own})")
        return None
    if vocabulary == "HAMi (not enabled)":
        problems.append(f"{who} asks for HAMi's nvidia.com/gpumem, gpumem-percentage or "
                        "gpucores, which this webhook reads only where its ConfigMap sets "
                        f"hami_names: true; set it, or write vcuda's own names ({own})")
        return None
    if _vcuda_keys(limits, requests, config, who, []) is not None:
        problems.append(f"{who} mixes {vocabulary}'s names and vcuda's; keep vcuda's "
                        f"({core_key}, {memory_key}) and remove {vocabulary}'s")
        return None
    keys = (core_key, memory_key, config.gpus_keys[core_key])
    translation = translate(vocabulary, limits, who, keys, config.max_gpu_memory, problems)
    if translation is None:
        return None
    new_limits = translation.limits
    for field, values in (("limits", limits), ("requests", requests)):
        for name in translation.removed:
            if values and name in values:
                findings.patch.remove(f"{resources_path}{field}/{pointer_token(name)}")
    for name in (core_key, memory_key):
        if name in new_limits:
            findings.patch.add(f"{resources_path}limits/{pointer_token(name)}", new_limits[name])
    findings.warnings.extend(translation.warnings)
    kept_requests = {k: v for k, v in (requests or {}).items() if k not in translation.removed}
    return new_limits, kept_requests


def _mixed_vocabularies(vocabularies: dict[str, str], config: Config) -> str:
    core_key, memory_key = config.vcuda_keys[0][1:]
    written = "; ".join(f"{who} writes {name}'s names" for name, who in vocabularies.items())
    return (f"the pod mixes request names ({written}); write every container in one of them, "
            f"best vcuda's own ({core_key}, {memory_key})")


def _vcuda_keys(limits: _Values, requests: _Values, config: Config, who: str,
                problems: list[str]) -> tuple[str, str] | None:
    """Return the (core, memory) resource names the container uses, or None if none."""
    gpus = config.gpus_keys
    used = [keys for keys in config.vcuda_keys
            if (limits and (keys[1] in limits or keys[2] in limits or gpus[keys[1]] in limits))
            or (requests and (keys[1] in requests or keys[2] in requests
                              or gpus[keys[1]] in requests))]
    if len(used) == 1:
        return used[0][1:]
    if used:
        problems.append(
            f"{who} mixes vcuda resources of {' and '.join(k[0] for k in used)}; "
            f"write all of them under one domain, e.g. {used[0][1]} and {used[0][2]}")
    else:
        direct = _shared_asked_directly(limits, requests, config)
        if direct:
            core_key, memory_key = config.vcuda_keys[0][1:]
            problems.append(
                f"{who} asks for {direct} directly, which would give it a shared GPU without "
                f"limits; ask for {core_key}: {SHARES} and {memory_key}: N (units of 256 MiB) "
                "instead")
    return None


def _shared_asked_directly(limits: _Values, requests: _Values, config: Config,
                           but: str = "") -> str:
    """The first shared-GPU resource other than ``but`` that ``limits`` or ``requests`` name,
    "" when none does."""
    for values in (limits, requests):
        for name in sorted(config.shared_resources.intersection(values or ()) - {but}):
            return name
    return ""


def _check_requests_match_limits(limits: _Values, requests: dict[str, Quantity],
                                 keys: tuple[str, ...], who: str, problems: list[str]) -> None:
    for key in keys:
        if key not in requests:
            continue
        if not limits or key not in limits:
            problems.append(f"{who}: {key} is in requests but not in limits; vcuda needs "
                            "only limits: move it to resources.limits")
            continue
        try:
            equal = parse_whole_quantity(requests[key]) == parse_whole_quantity(limits[key])
        except QuantityError:
            continue  # the limit's own check reports the bad value
        if not equal:
            problems.append(f"{who}: requests {key} ({requests[key]}) differs from limits "
                            f"({limits[key]}); vcuda needs only limits: remove it from "
                            "requests or make it equal")


def _mode(container: Container, limits: _Values, keys: tuple[str, str], who: str,
          config: Config, findings: _Findings) -> _Mode | None:
    """Work out shared or exclusive mode from the container's limits; None after a problem."""
    core_key, memory_key = keys
    problems = findings.problems
    if not limits or core_key not in limits:
        problems.append(f"{who}: {memory_key} needs {core_key}; add {core_key}: {SHARES} to "
                        f"share one GPU, or {core_key}: {CORES_PER_GPU} for a whole GPU")
        return None
    cores = whole_limit(limits, core_key, who, problems)
    if cores is None:
        return None
    if SHARE_MIN <= cores <= SHARE_MAX:
        if container.security_context is not None:
            _check_unprivileged(container.security_context, who, core_key, problems)
        memory = _shared_memory(limits, keys, cores, who, config, problems)
        gpus = _gpu_count(limits, (config.gpus_keys[core_key], config.shared_resource), who,
                          problems)
        if memory is None or gpus is None:
            return None
        entry = {"cores": cores, "memory": memory}
        if gpus > 1:
            entry["gpus"] = gpus
        return config.shared_resource, gpus, entry
    gpus_key = config.gpus_keys[core_key]
    if gpus_key in limits:
        problems.append(f"{who}: {gpus_key} goes with a share of each GPU ({core_key}: {SHARES}); "
                        f"for whole GPUs write {core_key}: 100 per GPU and no {gpus_key}")
        return None
    if cores >= CORES_PER_GPU and cores % CORES_PER_GPU == 0:
        if memory_key in limits:
            findings.warnings.append(f"{who}: {memory_key} is ignored with whole GPUs "
                                     f"({core_key}: {cores})")
        return config.exclusive_resource, cores // CORES_PER_GPU, None
    problems.append(f"{who}: {core_key}: {cores} is neither a share of one GPU ({SHARES}) "
                    "nor whole GPUs (100, 200, ...); write one of those")
    return None


def _gpu_count(limits: dict[str, Quantity], keys: tuple[str, str], who: str,
               problems: list[str]) -> int | None:
    """How many distinct GPUs a share is of: its vcuda-gpus; without it, the shared-GPU
    resource vcuda writes from it; else 1. None after a problem. The webhook's own output thus
    asks for what its input did: the API server reviews a pod again when a later webhook
    changed it (reinvocationPolicy IfNeeded), and vcuda-gpus is gone by then."""
    key = next((key for key in keys if key in limits), None)
    if key is None:
        return 1
    return whole_limit(limits, key, who, problems,
                       (1, MAX_SHARED_GPUS, " (distinct GPUs, each with the vcuda-core and "
                                            "vcuda-memory given)"))


def _shared_memory(limits: dict[str, Quantity], keys: tuple[str, str], cores: int, who: str,
                   config: Config, problems: list[str]) -> int | None:
    """Return the bytes a shared-mode container may use, or None after a problem."""
    core_key, memory_key = keys
    if memory_key not in limits:
        problems.append(f"{who}: {core_key}: {cores} shares a GPU, so {memory_key} is "
                        f"required; add {memory_key}: N in units of 256 MiB (40 = 10 GiB)")
        return None
    units = whole_limit(limits, memory_key, who, problems)
    if units is None:
        return None
    largest = config.max_memory_units
    if units < 1:
        problems.append(f"{who}: {memory_key}: {units} must be at least 1 (256 MiB); "
                        "write N in units of 256 MiB (40 = 10 GiB)")
        return None
    raw = limits[memory_key]
    if is_byte_size(raw):
        meant = max(units // MEMORY_UNIT, 1)
        problems.append(f"{who}: {memory_key}: {raw} is a byte size, but {memory_key} counts "
                        f"units of 256 MiB; write {memory_key}: {meant} for "
                        f"{_gib(meant * MEMORY_UNIT)}")
        return None
    if units > largest:
        problems.append(f"{who}: {memory_key}: {units} ({_gib(units * MEMORY_UNIT)}) is more "
                        f"than the largest GPU ({_gib(config.max_gpu_memory)}); write at most "
                        f"{largest}")
        return None
    return units * MEMORY_UNIT


def _check_unprivileged(context: SecurityContext, who: str, core_key: str,
                        problems: list[str]) -> None:
    added = context.capabilities.add if context.capabilities else None
    escalating = sorted({c for c in added or () if c.upper() in _ESCALATING_CAPABILITIES})
    if context.privileged:
        reason = "is privileged"
    elif escalating:
        reason = f"adds capability {escalating[0]}"
    else:
        return
    problems.append(f"{who} {reason} and shares a GPU, which would let it lift its own limits; "
                    f"drop that from securityContext, or ask for whole GPUs ({core_key}: 100)")


def _check_backend(limits: _Values, requests: _Values, backend: str, count: int, who: str,
                   core_key: str, config: Config, problems: list[str]) -> None:
    """The device-plugin resources already present must agree with what vcuda writes."""
    other = (config.exclusive_resource if backend == config.shared_resource
             else config.shared_resource)
    for kind, values in (("limits", limits), ("requests", requests)):
        if not values:
            continue
        if other in values:
            problems.append(f"{who}: {kind} has {other}, which does not go with {core_key}; "
                            f"remove {other}: vcuda writes the device-plugin resource itself")
        if backend in values:
            try:
                agrees = parse_whole_quantity(values[backend]) == count
            except QuantityError:
                agrees = False
            if not agrees:
                problems.append(f"{who}: {kind} {backend}: {values[backend]} disagrees with "
                                f"{core_key}; remove {backend}: vcuda writes it itself")


def _write_pod_fields(pod: Pod, config: Config, findings: _Findings) -> None:
    """Patch the annotations, the runtime class and the scheduler to what the containers need."""
    annotations = pod.metadata.annotations
    patch = findings.patch
    if annotations and ASSIGNMENT_ANNOTATION in annotations:
        patch.remove(_ASSIGNMENT_ANNOTATION_PATH)
        findings.warnings.append(f"{ASSIGNMENT_ANNOTATION} was removed: only vcuda's scheduler "
                                 "writes it, when it binds the pod")
    if findings.uses_gpus and config.scheduler_name:
        _write_scheduler_name(pod, config.scheduler_name, findings)
    _write_limits(pod, config, findings)


def _write_scheduler_name(pod: Pod, wanted: str, findings: _Findings) -> None:
    current = pod.spec.scheduler_name
    findings.patch.put(_SCHEDULER_NAME_PATH, current, wanted)
    if current not in (None, _DEFAULT_SCHEDULER, wanted):
        findings.warnings.append(f"schedulerName {current} was replaced by {wanted}, which "
                                 "places vcuda pods on a GPU that can hold them")


def _write_limits(pod: Pod, config: Config, findings: _Findings) -> None:
    annotations = pod.metadata.annotations
    given = annotations.get(LIMITS_ANNOTATION) if annotations else None
    patch = findings.patch
    if not findings.limits:
        if given is not None:
            patch.remove(_LIMITS_ANNOTATION_PATH)
            findings.warnings.append(f"{LIMITS_ANNOTATION} was removed: only vcuda writes it, "
                                     "and no container shares a GPU")
        return
    value = render_limits_annotation(findings.limits)
    if annotations is None:
        patch.add(_ANNOTATIONS_PATH, {LIMITS_ANNOTATION: value})
    else:
        patch.put(_LIMITS_ANNOTATION_PATH, given, value)
    if given is not None and given != value:
        findings.warnings.append(f"{LIMITS_ANNOTATION} was replaced: only vcuda writes it")
    runtime_class = pod.spec.runtime_class_name
    patch.put(_RUNTIME_CLASS_PATH, runtime_class, config.runtime_class)
    if runtime_class is not None and runtime_class != config.runtime_class:
        findings.warnings.append(f"runtimeClassName {runtime_class} was replaced by "
                                 f"{config.runtime_class}, which shared GPUs need")


def _ask_virtual_memory(metadata: ObjectMeta, findings: _Findings) -> None:
    """The pod's opt-in to virtual device memory, written into each share's entry: the node
    decides how much of it may live in host memory (none where it does not scale memory)."""
    value = _annotation(metadata, VIRTUAL_MEMORY_ANNOTATION)
    if value is None or value == "false":
        return
    if value != "true":
        findings.problems.append(
            f'{VIRTUAL_MEMORY_ANNOTATION} is "{value[:64]}": write "true" to let the part of '
            'each GPU share\'s memory past the node\'s scaled share live in host memory, or '
            '"false"')
        return
    for entry in findings.limits.values():
        entry["virtual"] = True


def _annotation(metadata: ObjectMeta, key: str = LIMITS_ANNOTATION) -> str | None:
    annotations = metadata.annotations
    return annotations.get(key) if annotations else None


def _gib(size: int) -> str:
    return f"{size / (1 << 30):g} GiB"
