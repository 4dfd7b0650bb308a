"""Runs the plan against the cluster: observe, decide, act, until done or waiting."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Protocol

from webhook.certs.act import Clock, Issuing, Writer, carry_out
from webhook.certs.cluster import ClusterError, Conflict
from webhook.certs.observe import observe
from webhook.certs.plan import Done, IntroduceCa, IssueServing, Policy, Wait, decide

MAX_STEPS = 20  # a full CA rotation takes 6; more means the state is being fought over
MAX_CONFLICTS = 5


class SystemClock:
    """The real time, in UTC."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Reader(Writer, Protocol):
    """The reads and writes of a run (`cluster.Cluster` or `cluster.DryRun`)."""

    def read_secret(self) -> dict[str, Any] | None: ...
    def read_webhook_config(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Outcome:
    """How a run ended: every step taken, and the last decision (Done or Wait)."""

    steps: tuple[str, ...]
    last: Done | Wait


def run(cluster: Reader, clock: Clock, policy: Policy, issuing: Issuing, log: Any,
        max_wait: float = 0.0) -> Outcome:
    """Take steps until nothing is due, sleeping through waits of at most ``max_wait`` seconds.

    A conflict (somebody else wrote meanwhile) means reading again and deciding
    afresh; every step is safe to repeat or to abandon, so that is always right.
    """
    steps: list[str] = []
    conflicts = 0
    while True:
        secret = cluster.read_secret()
        config = cluster.read_webhook_config()
        seen = observe(secret, config)
        now = clock.now()
        action = decide(seen, now, policy)
        if isinstance(action, Done):
            log.info("certificates_in_order", reason=action.reason,
                     next_due=action.next_due.isoformat() if action.next_due else None)
            return Outcome(tuple(steps), action)
        if isinstance(action, Wait):
            delay = (action.until - now).total_seconds()
            log.info("waiting", reason=action.reason, until=action.until.isoformat(),
                     seconds=round(delay, 1), will_sleep=delay <= max_wait)
            if delay > max_wait:
                return Outcome(tuple(steps), action)
            clock.sleep(delay)
            continue
        if len(steps) >= MAX_STEPS:
            raise ClusterError(f"gave up after {MAX_STEPS} steps ({', '.join(steps)}): is "
                               "another tool rewriting the Secret or the caBundle?")
        name = _snake(type(action).__name__)
        try:
            details = carry_out(action, seen, secret, config, issuing, cluster, clock)
        except Conflict as error:
            conflicts += 1
            log.warning("conflict_retrying", step=name, attempt=conflicts, error=str(error))
            if conflicts >= MAX_CONFLICTS:
                raise ClusterError(f"{error}; still conflicting after {conflicts} tries") from None
            clock.sleep(0.2 * conflicts)
            continue
        steps.append(name)
        log.info(name, **details)
        # A requested renewal is done once its step is; without this the next
        # loop would request it again.
        if isinstance(action, IntroduceCa) and policy.renew_ca:
            policy = replace(policy, renew_ca=False)
        if isinstance(action, IssueServing) and policy.renew_serving:
            policy = replace(policy, renew_serving=False)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
