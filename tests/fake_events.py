"""Events on the fake API server, as ``events.k8s.io/v1`` serves them, for the fakes that
take them (:class:`ServesEvents`, a FakeKubeApi).

- ``POST /apis/events.k8s.io/v1/namespaces/<ns>/events``: 409 when the name is taken, 422
  without ``reason``, ``action``, ``regarding``, ``eventTime`` or a reporting controller and
  instance, with a field past the API's bound or a type but Normal and Warning, or about a
  cluster-scoped object in a namespace but default and kube-system, as the API validates
  Events;
- ``PATCH .../events/<name>`` with a JSON merge patch (404 when there is none).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.fake_kube_api import MERGE_PATCH, ApiError, FakeKubeApi, Streamed, json_body, merge_patch

_EVENTS = re.compile(r"/apis/events\.k8s\.io/v1/namespaces/([^/]+)/events(?:/([^/]+))?")


class ServesEvents(FakeKubeApi):
    """POST and PATCH of Events, and what is stored."""

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any] | Streamed]:
        events = _EVENTS.fullmatch(path)
        if events is None:
            return super().route(method, path, content_type, body)
        return self._event(method, path, content_type, body, *events.groups())

    def events(self) -> list[dict[str, Any]]:
        """The Events stored, oldest first."""
        with self.lock:
            return [copy.deepcopy(o) for p, o in self.objects.items() if "/events/" in p]

    def _event(self, method: str, path: str, content_type: str, body: bytes, namespace: str,
               name: str | None) -> tuple[int, dict[str, Any]]:
        if method == "POST" and name is None:
            self.authorize("create", "events.k8s.io", "events", namespace, None)
            created = json_body(body)
            name = (created.get("metadata") or {}).get("name") or ""
            missing = [f for f in ("reason", "action", "regarding", "eventTime",
                                   "reportingController", "reportingInstance")
                       if not created.get(f)]
            if missing or not name:
                raise ApiError(422, "Invalid", f"Event {name!r} is invalid: "
                               + ", ".join(missing or ["metadata.name"]) + ": Required value")
            too_long = [f for f, most in (("reason", 128), ("action", 128), ("note", 1024),
                                          ("reportingInstance", 128))
                        if len(str(created.get(f, "")).encode()) > most]
            if too_long or created.get("type") not in ("Normal", "Warning"):
                raise ApiError(422, "Invalid", f'Event "{name}" is invalid: '
                               + ", ".join(too_long or ["type"]) + ": Invalid value")
            if not created["regarding"].get("namespace") and namespace not in (
                    "default", "kube-system"):
                raise ApiError(422, "Invalid", f'Event "{name}" is invalid: involvedObject.'
                               'namespace: Invalid value: "": does not match event.namespace')
            item = f"{path}/{name}"
            with self.lock:
                if item in self.objects:
                    raise ApiError(409, "AlreadyExists", f'events.events.k8s.io "{name}" '
                                   "already exists")
                created["metadata"]["namespace"] = namespace
                self.store(item, created)
                return 201, copy.deepcopy(self.objects[item])
        if method == "PATCH" and name is not None:
            self.authorize("patch", "events.k8s.io", "events", namespace, name)
            if content_type.split(";")[0].strip() != MERGE_PATCH:
                raise ApiError(415, "UnsupportedMediaType",
                               f"this test server implements only {MERGE_PATCH} for Events")
            with self.lock:
                current = self.read(path, "events.events.k8s.io", name)
                self.store(path, merge_patch(current, json_body(body)))
                return 200, copy.deepcopy(self.objects[path])
        raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")
