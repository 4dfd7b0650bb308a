"""JSON Patch operations are built one by one, with RFC 6901 escaping."""

from __future__ import annotations

import jsonpatch

from runtime_hook.contract import pointer_token
from webhook.patch import PatchBuilder


def test_escape_writes_tilde_and_slash_as_rfc_6901_says() -> None:
    assert pointer_token("nvidia.com/gpu.shared") == "nvidia.com~1gpu.shared"
    assert pointer_token("a~b/c") == "a~0b~1c"
    assert pointer_token("~1") == "~01"  # ~ first, so an escaped-looking name stays distinct


def test_put_adds_replaces_or_does_nothing_as_the_current_value_requires() -> None:
    builder = PatchBuilder()
    builder.put("/spec/runtimeClassName", None, "vcuda")
    builder.put("/spec/runtimeClassName", "nvidia", "vcuda")
    builder.put("/spec/runtimeClassName", "vcuda", "vcuda")
    assert builder.operations == [
        {"op": "add", "path": "/spec/runtimeClassName", "value": "vcuda"},
        {"op": "replace", "path": "/spec/runtimeClassName", "value": "vcuda"},
    ]


def test_built_operations_apply_with_a_standard_json_patch_library() -> None:
    document = {"metadata": {"annotations": {"a/b": "1", "x~y": "2"}}, "spec": {}}
    builder = PatchBuilder()
    builder.put("/metadata/annotations/" + pointer_token("a/b"), "1", "changed")
    builder.remove("/metadata/annotations/" + pointer_token("x~y"))
    builder.add("/spec/limits", {"nvidia.com/gpu": "1"})
    assert jsonpatch.apply_patch(document, builder.operations) == {
        "metadata": {"annotations": {"a/b": "changed"}},
        "spec": {"limits": {"nvidia.com/gpu": "1"}},
    }
