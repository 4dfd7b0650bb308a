"""What one node's values cost the extender, counted rather than timed: the work of decoding
grows in step with what it decodes, and what is remembered of nodes stays within the memos'
budgets however large the values and however often they are rewritten."""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc
from collections.abc import Callable
from types import FrameType
from typing import Any

from extender import policy
from extender.memo import Memo
from extender.policy import Demand, placement
from runtime_hook import placement as formats
from runtime_hook.contract import INVENTORY_ANNOTATION, LEDGER_ANNOTATION
from tests.extender.cluster import GIB, NOW

_MEMOS = ("_nodes", "_inventories", "_gpu_sets", "_ledgers", "_states", "_answers")


def _inventory(gpus: int, heartbeat: int, tag: str = "") -> str:
    return json.dumps({"version": 1, "heartbeat": heartbeat, "gpus": [
        {"uuid": f"MIG-{tag}{i:05d}-" + "f" * (118 - len(tag)), "index": i % 256,
         "memory": 80 * GIB} for i in range(gpus)]}, separators=(",", ":"))


def _lines_run(work: Callable[[], Any]) -> int:
    """How many lines of Python ``work`` runs."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def test_decoding_twice_the_gpus_takes_twice_the_steps_not_four_times() -> None:
    # The old duplicate check compared each GPU with every one before it.
    one = _lines_run(lambda: formats.decode_inventory(_inventory(120, int(NOW))))
    two = _lines_run(lambda: formats.decode_inventory(_inventory(240, int(NOW))))
    assert 1.9 * one < two < 2.1 * one


def test_an_inventory_of_4000_gpus_is_refused_before_it_is_decoded() -> None:
    text = _inventory(4000, int(NOW))  # about 250 KiB, as in the attack
    steps = _lines_run(lambda: policy.unreadable({INVENTORY_ANNOTATION: text}))
    assert policy.unreadable({INVENTORY_ANNOTATION: text}) == (
        f"vcuda.io/gpus has {len(text)} characters, more than the 65536 allowed")
    assert steps < 100


def test_one_content_is_decoded_once_however_often_it_is_sent(monkeypatch: Any) -> None:
    decoded: list[str] = []
    decode = policy.decode_inventory
    monkeypatch.setattr(policy, "decode_inventory", lambda text: decoded.append(text)
                        or decode(text))
    text = _inventory(8, int(NOW), "once")
    for _ in range(320):  # as watch events and filters bring it again, as a new string
        annotations = {INVENTORY_ANNOTATION: "".join(text)}
        assert policy.unreadable(annotations) is None
        placement("n", annotations, Demand(10, GIB, 0), "binpack", NOW, 120)
    assert decoded == [text]


def _ledger(pods: int, tag: str) -> str:
    return json.dumps({"version": 1, "pods": {
        f"{tag}-{i:06d}-0000-0000-0000-000000000000": {
            "pod": f"team/{tag}-{i}", "at": int(NOW),
            "shared": [f"MIG-{tag}{i % 256:05d}-" + "f" * (118 - len(tag)), 1, GIB]}
        for i in range(pods)}}, separators=(",", ":"))


def test_a_node_rewriting_its_largest_values_holds_the_memos_to_their_budgets(
        monkeypatch: Any) -> None:
    # A sixteenth of each budget, so that a few dozen rewrites fill them all (and fast).
    memos = [Memo(getattr(policy, name).budget // 16) for name in _MEMOS]
    for name, memo in zip(_MEMOS, memos):
        monkeypatch.setattr(policy, name, memo)
    budgets = sum(memo.budget for memo in memos)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for rewrite in range(48):  # a new heartbeat, new GPUs and a new full ledger each time
            tag = f"r{rewrite}"
            annotations = {INVENTORY_ANNOTATION: _inventory(256, int(NOW) + rewrite, tag),
                           LEDGER_ANNOTATION: _ledger(1100, tag)}
            assert len(annotations[INVENTORY_ANNOTATION]) <= formats.MAX_INVENTORY_CHARS
            assert len(annotations[LEDGER_ANNOTATION]) <= formats.MAX_LEDGER_CHARS
            for cores in (10, 20):
                placement("n", annotations, Demand(cores, GIB, 0), "binpack", NOW + rewrite, 120)
            del annotations
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(memo.charged <= memo.budget for memo in memos)
    # The memos are full by now; what each charges covers what its entries hold.
    assert sum(memo.charged for memo in memos) > 0.8 * budgets
    assert grown <= 1.1 * sum(memo.charged for memo in memos) <= 1.1 * budgets
