"""Decisions on pod creations, remembered by what they were decided on.

The pods of one template (a Deployment's replicas, a Job's completions) reach the webhook
alike in every field the policy reads: their names, uids and service-account volumes
differ, but the policy reads none of them. Such a pod would be decided exactly as the one
before it, so the decision is kept, keyed by the JSON of the fields read (the annotations
and the spec as decoded) under the settings it was made with.
"""

from __future__ import annotations

import msgspec

from webhook.config import Config
from webhook.pod import Pod
from webhook.policy import Decision, decide

ENTRIES = 1024
# Larger pods are decided every time, so the keys held stay under 4 MiB whatever is sent.
KEY_BYTES = 4096


class RememberedDecisions:
    """``decide`` for CREATE reviews, answered from memory for a pod seen before."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._entries = entries
        self._decisions: dict[bytes, Decision] = {}
        self._config: Config | None = None
        self._encode = msgspec.json.Encoder().encode

    def decide(self, pod: Pod | None, operation: str, old_pod: Pod | None,
               config: Config) -> Decision:
        """What ``webhook.policy.decide`` answers, decided once per pod and settings."""
        if operation != "CREATE" or pod is None:
            return decide(pod, operation, old_pod, config)
        if config is not self._config:  # new settings (the Nodes' largest GPU): decide anew
            self._decisions.clear()
            self._config = config
        key = self._encode((pod.metadata.annotations, pod.spec))
        decision = self._decisions.get(key)
        if decision is None:
            decision = decide(pod, operation, old_pod, config)
            if len(key) <= KEY_BYTES:
                if len(self._decisions) >= self._entries:  # the oldest goes first
                    del self._decisions[next(iter(self._decisions))]
                self._decisions[key] = decision
        return decision

    def __len__(self) -> int:
        return len(self._decisions)
