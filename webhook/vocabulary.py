"""Volcano's and HAMi's request names, read as vcuda's own.

A team moving from Volcano's vGPU or from HAMi keeps its pod specs: the webhook
finds their names, checks them in their own terms (MiB, percent, per vGPU), and
rewrites the container's limits into vcuda's (``vcuda-core``, ``vcuda-memory``,
``vcuda-gpus``), which the rest of the review then checks as if the user had
written them. HAMi's names overlap NVIDIA's ``nvidia.com/gpu``, so they are read
only where the webhook's configuration sets ``hami_names``; ``nvidia.com/gpu``
alone keeps NVIDIA's meaning (whole GPUs) either way.
"""

from __future__ import annotations

from typing import Optional

from runtime_hook.contract import (
    CORES_PER_GPU,
    MAX_SHARED_GPUS,
    MEMORY_UNIT,
    SHARE_MAX,
    SHARE_MIN,
    SHARES,
)
from webhook.pod import Quantity
from webhook.quantity import QuantityError, parse_whole_quantity

_MIB = 1 << 20
_UNIT_MIB = MEMORY_UNIT // _MIB  # 256

VOLCANO_COUNT = "volcano.sh/vgpu-number"
VOLCANO_MEMORY = "volcano.sh/vgpu-memory"
VOLCANO_CORES = "volcano.sh/vgpu-cores"
VOLCANO_NAMES = frozenset((VOLCANO_COUNT, VOLCANO_MEMORY, VOLCANO_CORES))

HAMI_COUNT = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
# The names that make a container HAMi's: nvidia.com/gpu alone is NVIDIA's whole GPUs.
HAMI_MARKERS = frozenset((HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES))
HAMI_NAMES = HAMI_MARKERS | {HAMI_COUNT}

_Values = Optional[dict[str, Quantity]]
# Suffixes of a quantity written as bytes ("10Gi", "8G"), which a count of units is not.
_BINARY_BYTES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_BYTES = ("k", "M", "G", "T", "P", "E")


def is_byte_size(raw: Quantity) -> bool:
    """Whether ``raw`` is written as bytes ("10Gi", "8G") rather than as a plain count."""
    return isinstance(raw, str) and (raw[-1:] in _DECIMAL_BYTES or raw[-2:] in _BINARY_BYTES)


class Translation:
    """A container's request in vcuda's terms: the limits to review, and what to patch."""

    __slots__ = ("limits", "removed", "vocabulary", "warnings")

    def __init__(self, vocabulary: str, limits: dict[str, Quantity],
                 removed: tuple[str, ...], warnings: list[str]) -> None:
        self.vocabulary = vocabulary  # "Volcano" or "HAMi"
        self.limits = limits  # the container's limits with vcuda's names in place of theirs
        self.removed = removed  # their names, to take out of limits and requests
        self.warnings = warnings


def vocabulary_of(limits: _Values, requests: _Values, hami: bool) -> str:
    """Which foreign vocabulary a container writes: "Volcano", "HAMi" or ""."""
    names = set(limits or ()) | set(requests or ())
    volcano = not VOLCANO_NAMES.isdisjoint(names)
    hami_used = not HAMI_MARKERS.isdisjoint(names)
    if volcano and hami_used:
        return "Volcano and HAMi"
    if volcano:
        return "Volcano"
    if hami_used:
        return "HAMi" if hami else "HAMi (not enabled)"
    return ""


def translate(vocabulary: str, limits: _Values, who: str, keys: tuple[str, str, str],
              largest_memory: int, problems: list[str]) -> Translation | None:
    """Read ``limits`` of ``vocabulary`` as vcuda's ``keys`` (core, memory, gpus); None after a
    problem, which is appended in the user's own names."""
    limits = limits or {}
    if vocabulary == "Volcano":
        count_key, memory_key, cores_key, removed = (
            VOLCANO_COUNT, VOLCANO_MEMORY, VOLCANO_CORES, tuple(sorted(VOLCANO_NAMES)))
    else:
        count_key, memory_key, cores_key, removed = (
            HAMI_COUNT, HAMI_MEMORY, HAMI_CORES, tuple(sorted(HAMI_NAMES)))
    count_before = len(problems)
    count = _number(limits, count_key, who, problems, (1, MAX_SHARED_GPUS, " GPUs")) or 1
    cores = _number(limits, cores_key, who, problems)
    memory_mib = _memory_mib(vocabulary, limits, memory_key, who, largest_memory, problems)
    if len(problems) > count_before:
        return None
    if cores is None:
        problems.append(f"{who}: {cores_key} is required: vcuda holds every share to a part "
                        f"of its GPU's time; add {cores_key}: {SHARES} per GPU, or "
                        f"{CORES_PER_GPU} for whole GPUs")
        return None
    core_key, vcuda_memory_key, gpus_key = keys
    kept = {k: v for k, v in limits.items() if k not in removed}
    if cores == CORES_PER_GPU:  # whole GPUs: their memory is the whole GPU's
        return Translation(vocabulary, {**kept, core_key: str(CORES_PER_GPU * count)}, removed,
                           [f"{who}: {cores_key}: {CORES_PER_GPU} asks for whole GPUs; read as "
                            f"{core_key}: {CORES_PER_GPU * count}"])
    if not SHARE_MIN <= cores <= SHARE_MAX:
        problems.append(f"{who}: {cores_key}: {cores} is neither a share of a GPU ({SHARES}) "
                        f"nor a whole GPU ({CORES_PER_GPU}); write one of those")
        return None
    if memory_mib is None:
        problems.append(f"{who}: {cores_key}: {cores} shares a GPU, so {memory_key} is "
                        f"required; add {memory_key}: MiB per GPU (e.g. 3000)")
        return None
    units = -(-memory_mib // _UNIT_MIB)  # rounded up: never less memory than asked for
    translated = {**kept, core_key: str(cores), vcuda_memory_key: str(units)}
    if count > 1:
        translated[gpus_key] = str(count)
    warnings = [f"{who}: {vocabulary}'s names were read as {core_key}: {cores}, "
                f"{vcuda_memory_key}: {units}" + (f", {gpus_key}: {count}" if count > 1 else "")]
    if units * _UNIT_MIB != memory_mib:
        warnings.append(f"{who}: {memory_mib} MiB was rounded up to {units * _UNIT_MIB} MiB, "
                        "vcuda's memory counts units of 256 MiB")
    return Translation(vocabulary, translated, removed, warnings)


def _memory_mib(vocabulary: str, limits: dict[str, Quantity], memory_key: str, who: str,
                largest_memory: int, problems: list[str]) -> int | None:
    """The MiB per GPU asked for; from HAMi's percentage of the largest GPU where given."""
    largest_mib = largest_memory // _MIB
    if vocabulary == "HAMi" and HAMI_MEMORY_PERCENT in limits:
        if memory_key in limits:
            problems.append(f"{who}: {memory_key} and {HAMI_MEMORY_PERCENT} both give the "
                            f"memory; keep one")
            return None
        percent = _number(limits, HAMI_MEMORY_PERCENT, who, problems, (1, 100, " percent"))
        return None if percent is None else max(largest_mib * percent // 100, 1)
    mib = _number(limits, memory_key, who, problems, (1, None, " MiB"))
    if mib is None:
        return None
    if is_byte_size(limits[memory_key]):
        problems.append(f"{who}: {memory_key}: {limits[memory_key]} is a byte size, but "
                        f"{memory_key} counts MiB; write {memory_key}: {max(mib // _MIB, 1)}")
        return None
    if mib > largest_mib:
        problems.append(f"{who}: {memory_key}: {mib} MiB is more than the largest GPU "
                        f"({largest_mib} MiB); write at most {largest_mib}")
        return None
    return mib


def whole_limit(limits: dict[str, Quantity], key: str, who: str, problems: list[str],
                span: tuple[int, int | None, str] | None = None) -> int | None:
    """``limits[key]`` as a whole number within ``span`` (low, high or None, what it counts);
    None after a problem, appended with the fix."""
    try:
        value = parse_whole_quantity(limits[key])
    except QuantityError as exc:
        problems.append(f"{who}: {key}: {exc}; write a whole number")
        return None
    if span is not None:
        low, high, counted = span
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f"at least {low}"
            problems.append(f"{who}: {key}: {value} must be {bound}{counted}")
            return None
    return value


def _number(limits: dict[str, Quantity], key: str, who: str, problems: list[str],
            span: tuple[int, int | None, str] | None = None) -> int | None:
    """:func:`whole_limit`, or None when ``key`` is absent."""
    return whole_limit(limits, key, who, problems, span) if key in limits else None
