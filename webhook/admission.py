"""One review from body to answer: parse, decide, render; the server adds only I/O."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from webhook.config import Config
from webhook.pod import Pod
from webhook.policy import Decision, decide
from webhook.review import BadReview, ReviewRequest, parse_review, render_response

# invalid: a 400 (no review to answer); refused: a body not read (too slow, server
# full: 408, 503); error: the webhook failed (500).
OUTCOMES = ("allowed", "patched", "denied", "invalid", "refused", "error")


class Answer(msgspec.Struct, frozen=True):
    """The HTTP answer to one body, and what was decided, for metrics and the log.

    Attributes:
        status: 200; 400 for a body with no review to answer; 408 or 503 for a body not
            read; 500 when the webhook failed.
        body: the AdmissionReview response, or the 400's message.
        outcome: one of OUTCOMES; "allowed" means allowed without a patch.
        reason: the denial's message, the patched paths, or why the body was refused.
        warnings: the warnings returned to the user.
        request: the parsed request; None for a 400.
    """

    status: int
    body: bytes
    outcome: str
    reason: str
    warnings: tuple[str, ...] = ()
    request: ReviewRequest | None = None


Decide = Callable[[Pod | None, str, Pod | None, Config], Decision]


def admit(body: bytes, config: Config, decide_pod: Decide = decide) -> Answer:
    """Answer one AdmissionReview body, its pod judged by ``decide_pod`` (the policy's
    ``decide``, or the same remembered: ``webhook.remembered``)."""
    try:
        request = parse_review(body)
    except BadReview as exc:
        return refuse(str(exc))
    if not request.is_pod:
        decision = Decision.deny(f"vcuda reviews pods only, and this is {request.kind}; the "
                                 "MutatingWebhookConfiguration should send it pods only")
    elif request.malformed:
        decision = Decision.deny(f"the pod is malformed: {request.malformed}")
    else:
        decision = decide_pod(request.pod, request.operation, request.old_pod, config)
    if not decision.allowed:
        outcome, reason = "denied", decision.message
    elif decision.patch:
        outcome, reason = "patched", "patched " + ", ".join([op["path"] for op in decision.patch])
    else:
        outcome, reason = "allowed", "nothing to change"
    return Answer(200, render_response(request.uid, decision), outcome, reason,
                  decision.warnings, request)


def refuse(message: str, status: int = 400) -> Answer:
    """An answer of HTTP ``status`` (400, 408, 500, 503) whose body is ``message``."""
    outcome = {400: "invalid", 500: "error"}.get(status, "refused")
    text = f"bad AdmissionReview: {message}" if status == 400 else f"not reviewed: {message}"
    return Answer(status, f"{text}\n".encode(), outcome, message)
