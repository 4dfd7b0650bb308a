"""The AdmissionReview (admission.k8s.io/v1) wire format: parse a request, render a response."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from webhook.errors import WebhookError
from webhook.json_errors import DECODE_ERRORS, misfit, unreadable
from webhook.pod import Pod
from webhook.policy import Decision

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_BODY = 3 << 20  # the API server's own cap on a webhook request
_REVIEWED_OPERATIONS = ("CREATE", "UPDATE")


class BadReview(WebhookError, ValueError):
    """The body is not an AdmissionReview this server can answer (HTTP 400)."""


class ReviewRequest(msgspec.Struct, frozen=True):
    """What the webhook uses of one ``request``.

    Attributes:
        uid: the request's uid, echoed in the response.
        operation: CREATE, UPDATE, DELETE or CONNECT.
        namespace: ``request.namespace`` (a new pod may have only a generateName).
        name: the pod's name, or its generateName followed by ``*``, for logs.
        kind: the reviewed kind as text, e.g. ``v1 Pod``.
        is_pod: whether that kind is a core/v1 Pod.
        dry_run: ``request.dryRun``.
        pod: ``request.object``, None when absent or malformed.
        old_pod: ``request.oldObject``, None when absent or malformed.
        malformed: why the pod could not be read; empty when it could.
    """

    uid: str
    operation: str
    namespace: str
    name: str
    kind: str
    is_pod: bool
    dry_run: bool
    pod: Pod | None = None
    old_pod: Pod | None = None
    malformed: str = ""


class _GroupVersionKind(msgspec.Struct, frozen=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class _Request(msgspec.Struct, frozen=True, rename="camel"):
    uid: str
    kind: _GroupVersionKind
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: Pod | None = None
    old_object: Pod | None = None
    dry_run: bool | None = None


class _Review(msgspec.Struct, frozen=True, rename="camel"):
    api_version: Any = None
    kind: Any = None
    request: _Request | None = None


_DECODER = msgspec.json.Decoder(_Review)
_Request_ = TypeVar("_Request_")  # the request as decoded: a _Request, or a dict when malformed
_ENCODER = msgspec.json.Encoder()
_RESPONSE_START = f'{{"apiVersion":"{API_VERSION}","kind":"{KIND}","response":'.encode()


def parse_review(body: bytes) -> ReviewRequest:
    """Parse an AdmissionReview body; raise BadReview with a message for the client."""
    if len(body) > MAX_BODY:
        raise BadReview(body_too_large(len(body)))
    try:
        review = _DECODER.decode(body)
    except DECODE_ERRORS:
        return _parse_malformed(body)
    request, uid = _check_envelope(review.api_version, review.kind, review.request,
                                   review.request and review.request.uid)
    kind = request.kind
    name = request.name
    if not name and request.object:
        name = _display_name(request.object.metadata.name, request.object.metadata.generate_name)
    is_pod = kind.kind == "Pod" and not kind.group
    return ReviewRequest(
        uid=uid, operation=request.operation, namespace=request.namespace, name=name,
        kind="v1 Pod" if is_pod else _kind_text(kind.group, kind.version, kind.kind),
        is_pod=is_pod, dry_run=request.dry_run is True, pod=request.object,
        old_pod=request.old_object)


def body_too_large(size: int | None) -> str:
    """The message for a body over MAX_BODY (size None when not known)."""
    got = f"{size} bytes" if size is not None else "a larger body"
    return f"body is over the {MAX_BODY}-byte (3 MiB) limit of an AdmissionReview: got {got}"


def render_response(uid: str, decision: Decision) -> bytes:
    """Return the AdmissionReview answering request ``uid`` with ``decision``."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = _ENCODER.encode(decision.patch)  # bytes: encoded as base64
    if decision.warnings:
        response["warnings"] = decision.warnings
    return _RESPONSE_START + _ENCODER.encode(response) + b"}"


def _parse_malformed(body: bytes) -> ReviewRequest:
    """The slow path, for a body the typed decoder refused: find out what is wrong with it.

    A body without a review to answer raises BadReview; a review whose pod is
    malformed gives a ReviewRequest whose ``malformed`` says where.
    """
    try:
        review = msgspec.json.decode(body)
    except DECODE_ERRORS:
        raise BadReview(f"body is {unreadable(body)}") from None
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    found = review.get("request")
    request, uid = _check_envelope(review.get("apiVersion"), review.get("kind"), found,
                                   found.get("uid") if isinstance(found, dict) else None)
    kind = request.get("kind")
    kind = kind if isinstance(kind, dict) else {}
    operation = _text(request.get("operation"))
    metadata = _dict(_dict(request.get("object")).get("metadata"))
    return ReviewRequest(
        uid=uid, operation=operation, namespace=_text(request.get("namespace")),
        name=_text(request.get("name")) or _display_name(_text(metadata.get("name")),
                                                         _text(metadata.get("generateName"))),
        kind=_kind_text(*(_text(kind.get(k)) for k in ("group", "version", "kind"))),
        is_pod=kind.get("group") == "" and kind.get("kind") == "Pod",
        dry_run=request.get("dryRun") is True,
        malformed=_pod_misfit(request) if operation in _REVIEWED_OPERATIONS else "")


def _pod_misfit(request: dict) -> str:
    """Where the request (its pods, most often) does not have the shape vcuda reads."""
    return misfit(request, _Request, "request") or "it does not have the shape of a Pod"


def _check_envelope(api_version: Any, kind: Any, request: _Request_ | None,
                    uid: Any) -> tuple[_Request_, str]:
    """Return the request and its uid, once the envelope shows an AdmissionReview v1 with both."""
    if api_version != API_VERSION or kind != KIND:
        raise BadReview(f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                        f"{_shown(api_version)} and {_shown(kind)}")
    if request is None or not isinstance(request, (dict, _Request)):
        raise BadReview("request is missing or not an object")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    return request, uid


def _display_name(name: str | None, generate_name: str | None) -> str:
    if name:
        return name
    return generate_name + "*" if generate_name else ""


def _kind_text(group: str, version: str, kind: str) -> str:
    return f"{group}/{version} {kind}" if group else f"{version} {kind}"


def _shown(value: Any) -> str:
    return "nothing" if value is None else repr(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}
