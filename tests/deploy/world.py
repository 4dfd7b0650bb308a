"""A clock the tests move, and an in-memory cluster that keeps every version of what was written.

`World` holds the two objects `vcuda-certs` manages with the API's rules that
matter to it (resourceVersion conflicts, create of an existing Secret), and
can be told to stop the tool before its n-th write, like a killed process.
`assert_always_trusted` then checks the promise of the rotation over the
whole history, with real X.509 verification.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from webhook.certs.cluster import Conflict

SERVICE_NAMES = ("vcuda-webhook.vcuda-system.svc",
                 "vcuda-webhook.vcuda-system.svc.cluster.local")


class FakeClock:
    """Time that passes only when a test or a sleeping tool moves it."""

    def __init__(self, start: datetime) -> None:
        self.time = start

    def now(self) -> datetime:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += timedelta(seconds=seconds)

    def advance(self, delta: timedelta) -> None:
        self.time += delta


class Interrupted(Exception):
    """The tool was stopped before a write, as by a kill."""


@dataclass(frozen=True)
class Version:
    """One written state of an object and when it was written."""

    at: datetime
    content: bytes  # tls.crt for the Secret, the caBundle for the configuration


def webhook_config(names: tuple[str, ...] = ("pods.vcuda.io",)) -> dict[str, Any]:
    """A MutatingWebhookConfiguration as `kubectl apply -k manifests/` leaves it."""
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "vcuda-webhook", "resourceVersion": "1"},
            "webhooks": [{"name": n, "clientConfig": {"service": {
                "name": "vcuda-webhook", "namespace": "vcuda-system", "path": "/mutate"}}}
                for n in names]}


class World:
    """The Secret and the webhook configuration in memory, with their histories."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.secret: dict[str, Any] | None = None
        self.config = webhook_config()
        self.serving_history: list[Version] = []
        self.bundle_history: list[Version] = [Version(clock.now(), b"")]
        self.writes = 0
        self.stop_before_write: int | None = None
        self.foreign_writes_before_next = 0  # another writer bumps the Secret this many times

    def read_secret(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.secret)

    def read_webhook_config(self) -> dict[str, Any]:
        return copy.deepcopy(self.config)

    def create_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        self._before_write()
        if self.secret is not None:
            raise Conflict('secrets "vcuda-webhook-tls" already exists')
        return self._store_secret(secret)

    def replace_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        self._before_write()
        assert self.secret is not None
        if secret["metadata"].get("resourceVersion") != self.secret["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        return self._store_secret(secret)

    def write_ca_bundle(self, config: Mapping[str, Any], bundle: bytes) -> dict[str, Any]:
        self._before_write()
        if config["metadata"]["resourceVersion"] != self.config["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        for webhook in self.config["webhooks"]:
            webhook["clientConfig"]["caBundle"] = base64.b64encode(bundle).decode()
        _bump(self.config)
        self.bundle_history.append(Version(self.clock.now(), bundle))
        return self.read_webhook_config()

    def tls_cert(self) -> bytes:
        assert self.secret is not None
        return base64.b64decode(self.secret["data"]["tls.crt"])

    def bundle(self) -> bytes:
        return self.bundle_history[-1].content

    def _before_write(self) -> None:
        if self.stop_before_write is not None and self.writes >= self.stop_before_write:
            raise Interrupted(f"stopped before write {self.writes + 1}")
        if self.foreign_writes_before_next and self.secret is not None:
            self.foreign_writes_before_next -= 1
            _bump(self.secret)
        self.writes += 1

    def _store_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(secret))
        stored["metadata"]["resourceVersion"] = (self.secret or {"metadata": {
            "resourceVersion": "0"}})["metadata"]["resourceVersion"]
        _bump(stored)
        self.secret = stored
        cert = self.tls_cert()
        if not self.serving_history or self.serving_history[-1].content != cert:
            self.serving_history.append(Version(self.clock.now(), cert))
        return self.read_secret() or {}


def _bump(obj: dict[str, Any]) -> None:
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)


def verifies(leaf_pem: bytes, bundle_pem: bytes, at: datetime) -> bool:
    """Whether a client trusting ``bundle_pem`` accepts ``leaf_pem`` for the service at ``at``."""
    try:
        roots = x509.load_pem_x509_certificates(bundle_pem)
    except ValueError:
        return False
    leaf = x509.load_pem_x509_certificate(leaf_pem)
    verifier = PolicyBuilder().store(Store(roots)).time(at).build_server_verifier(
        x509.DNSName(SERVICE_NAMES[0]))
    try:
        verifier.verify(leaf, [])
    except x509.verification.VerificationError:
        return False
    return True


def assert_always_trusted(world: World, propagation: timedelta) -> None:
    """No moment at which the API server may hold a caBundle that rejects what a pod may serve.

    A Secret version may be served from its write until ``propagation`` after
    the next one; a caBundle version may be in use likewise. Every pair whose
    windows overlap must verify, at the start and the end of the overlap.
    caBundles replaced before the Secret first existed are left out: no
    webhook pod can run before its Secret exists.
    """
    end = world.clock.now() + propagation
    served = _windows(world.serving_history, end, propagation)
    bundles = _windows(world.bundle_history, end, propagation)
    first_secret = world.serving_history[0].at
    for cert, s0, s1 in served:
        for bundle, b0, b1 in bundles:
            if b1 - propagation <= first_secret:
                continue
            start, stop = max(s0, b0), min(s1, b1)
            if start >= stop:
                continue
            for moment in (start, stop - timedelta(seconds=1)):
                assert verifies(cert, bundle, moment), (
                    f"a serving certificate written at {s0} is not trusted at {moment} "
                    f"by the caBundle written at {b0}")


def _windows(history: list[Version], end: datetime,
             propagation: timedelta) -> list[tuple[bytes, datetime, datetime]]:
    stops = [v.at + propagation for v in history[1:]] + [end]
    return [(v.content, v.at, stop) for v, stop in zip(history, stops)]
