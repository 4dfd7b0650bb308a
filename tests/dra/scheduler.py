"""The scheduler's consumable-capacity rules (KEP-5075), replayed over ResourceSlices.

What kube-scheduler's structured allocator does for a request on a device
with ``allowMultipleAllocations``: each of the device's capacities is
consumed by the amount the request names, or by the policy's ``default``
(the whole capacity when there is no policy) when it names none; a named
amount is rounded up to the policy (below ``min``: ``min``; else
``min + n * step``, the smallest at or above it; with ``validValues`` the
first at or above it); a consumed amount outside the policy's range makes
the device unusable for the request; and the device fits when, for every
capacity, what its allocations consumed plus this one stays within its
value. A device without ``allowMultipleAllocations`` is allocated once, whole.

:class:`Allocator` allocates claims first-fit over the slices and writes
their ``status.allocation`` as the scheduler does (``consumedCapacity``,
``shareID``, the claim's ``config`` marked ``FromClaim``), so tests get claims the way
kubelet's plugin reads them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from runtime_hook.node.dra.slices import quantity
from webhook.quantity import parse_quantity  # exact (a Fraction), as the scheduler's

Capacity = Mapping[str, Any]


def consumed(capacity: Capacity, requested: object | None) -> Fraction:
    """The amount of ``capacity`` a request consumes (``requested``: its quantity, or None)."""
    policy = capacity.get("requestPolicy") or {}
    if requested is None:
        return parse_quantity(policy.get("default", capacity["value"]))
    amount = parse_quantity(requested)
    valid_range = policy.get("validRange")
    if valid_range and "min" in valid_range:
        low = parse_quantity(valid_range["min"])
        if amount < low:
            return low
        if "step" not in valid_range:
            return amount
        step = parse_quantity(valid_range["step"])
        steps = -((low - amount) // step)  # ceil((amount - low) / step)
        return low + steps * step
    for value in (parse_quantity(v) for v in policy.get("validValues") or ()):
        if amount <= value:
            return value
    return amount


def violates(capacity: Capacity, amount: Fraction) -> bool:
    """Whether consuming ``amount`` breaks the capacity's request policy."""
    policy = capacity.get("requestPolicy") or {}
    valid_range = policy.get("validRange")
    if valid_range:
        if amount < parse_quantity(valid_range["min"]):
            return True
        return "max" in valid_range and amount > parse_quantity(valid_range["max"])
    values = policy.get("validValues")
    return bool(values) and amount not in {parse_quantity(v) for v in values}


class Allocator:
    """The scheduler's view of the devices of ``slices`` and what their allocations consumed."""

    def __init__(self, slices: Iterable[Mapping[str, Any]]) -> None:
        self.devices: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for item in slices:
            spec = item["spec"]
            for device in spec["devices"]:
                self.devices[(spec["driver"], spec["pool"]["name"], device["name"])] = device
        self.used: dict[tuple[str, str, str], dict[str, Fraction]] = {
            key: {} for key in self.devices}
        self.whole: set[tuple[str, str, str]] = set()

    def fit(self, key: tuple[str, str, str],
            requests: Mapping[str, object]) -> dict[str, Fraction] | None:
        """What a request for ``requests`` (capacity name -> quantity) would consume on device
        ``key``, or None when it does not fit there."""
        device = self.devices[key]
        if key in self.whole:
            return None
        if not device.get("allowMultipleAllocations"):
            return {} if not self.used[key] else None
        amounts = {}
        for name, capacity in (device.get("capacity") or {}).items():
            amount = consumed(capacity, requests.get(name))
            if violates(capacity, amount):
                return None
            if self.used[key].get(name, 0) + amount > parse_quantity(capacity["value"]):
                return None
            amounts[name] = amount
        if set(requests) - set(device.get("capacity") or {}):
            return None  # asks for a capacity the device does not have
        return amounts

    def allocate(self, claim: dict[str, Any]) -> bool:
        """Allocate every request of ``claim`` first-fit; write its status; False if none fits
        (then nothing is consumed)."""
        results = []
        taken: list[tuple[tuple[str, str, str], dict[str, Fraction]]] = []
        for request in claim["spec"]["devices"]["requests"]:
            exactly = request["exactly"]
            wanted = (exactly.get("capacity") or {}).get("requests") or {}
            for _ in range(exactly.get("count", 1)):
                choice = next(((key, amounts) for key in self.devices
                               if (amounts := self.fit(key, wanted)) is not None
                               and key not in {k for k, _ in taken}), None)
                if choice is None:
                    for key, amounts in taken:
                        self._release(key, amounts)
                    return False
                key, amounts = choice
                self._take(key, amounts)
                taken.append(choice)
                result = {"request": request["name"], "driver": key[0], "pool": key[1],
                          "device": key[2]}
                if self.devices[key].get("allowMultipleAllocations"):
                    result["shareID"] = str(uuid.uuid4())
                    result["consumedCapacity"] = {n: _quantity(a) for n, a in amounts.items()}
                results.append(result)
        devices: dict[str, Any] = {"results": results}
        config = [{"source": "FromClaim", **entry}
                  for entry in claim["spec"]["devices"].get("config") or []]
        if config:  # the claim's own config, as the scheduler copies it (no class config here)
            devices["config"] = config
        claim["status"] = {"allocation": {"devices": devices}}
        return True

    def release(self, claim: Mapping[str, Any]) -> None:
        """Give back what ``claim``'s allocation consumed."""
        for result in claim["status"]["allocation"]["devices"]["results"]:
            key = (result["driver"], result["pool"], result["device"])
            amounts = {n: parse_quantity(q) for n, q in
                       (result.get("consumedCapacity") or {}).items()}
            self._release(key, amounts)

    def _take(self, key: tuple[str, str, str], amounts: Mapping[str, Fraction]) -> None:
        if not self.devices[key].get("allowMultipleAllocations"):
            self.whole.add(key)
        for name, amount in amounts.items():
            self.used[key][name] = self.used[key].get(name, 0) + amount

    def _release(self, key: tuple[str, str, str], amounts: Mapping[str, Fraction]) -> None:
        self.whole.discard(key)
        for name, amount in amounts.items():
            self.used[key][name] -= amount


def _quantity(amount: Fraction) -> str:
    """As the scheduler writes a consumed amount: a binary-SI quantity."""
    if amount.denominator != 1:
        raise ValueError(f"{amount} is not whole")
    return quantity(int(amount), binary=True)
