"""One review from body to answer: parse, decide, render; the server adds only I/O."""

from __future__ import annotations

import msgspec

from webhook.config import Config
from webhook.policy import Decision, decide
from webhook.review import BadReview, ReviewRequest, parse_review, render_response

OUTCOMES = ("allowed", "patched", "denied", "invalid")


class Answer(msgspec.Struct, frozen=True):
    """The HTTP answer to one body, and what was decided, for metrics and the log.

    Attributes:
        status: 200, or 400 for a body with no review to answer.
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


def admit(body: bytes, config: Config) -> Answer:
    """Answer one AdmissionReview body."""
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
        decision = decide(request.pod, request.operation, request.old_pod, config)
    if not decision.allowed:
        outcome, reason = "denied", decision.message
    elif decision.patch:
        outcome, reason = "patched", "patched " + ", ".join([op["path"] for op in decision.patch])
    else:
        outcome, reason = "allowed", "nothing to change"
    return Answer(200, render_response(request.uid, decision), outcome, reason,
                  decision.warnings, request)


def refuse(message: str) -> Answer:
    """A 400 answer whose body is ``message``."""
    return Answer(400, f"bad AdmissionReview: {message}\n".encode(), "invalid", message)
