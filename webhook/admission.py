"""One review from body to answer: parse, decide, render; the server adds only I/O."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.config import Config
from webhook.policy import Decision, decide
from webhook.review import BadReview, ReviewRequest, parse_review, render_response


@dataclass(frozen=True)
class Answer:
    """The HTTP answer to one body, with what was decided for the log.

    ``request`` and ``decision`` are None exactly when the body was refused
    with a 400, and then ``error`` says why.
    """

    status: int
    body: bytes
    request: ReviewRequest | None = None
    decision: Decision | None = None
    error: str = ""


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
    return Answer(200, render_response(request.uid, decision), request, decision)


def refuse(message: str) -> Answer:
    """A 400 answer whose body is ``message``."""
    return Answer(400, f"bad AdmissionReview: {message}\n".encode(), error=message)
