"""Turns on a node's ledger: one holder per node at a time, nodes apart, nothing kept idle."""

from __future__ import annotations

import asyncio

from extender.turns import NodeTurns


async def _hold(turns: NodeTurns, node: str, log: list[str], name: str) -> None:
    async with turns.of(node):
        log.append(f"{name} in")
        await asyncio.sleep(0.01)
        log.append(f"{name} out")


def test_holders_of_one_node_take_turns_and_other_nodes_do_not_wait() -> None:
    turns = NodeTurns()
    log: list[str] = []

    async def main() -> None:
        await asyncio.gather(_hold(turns, "n", log, "a"), _hold(turns, "n", log, "b"),
                             _hold(turns, "m", log, "c"))

    asyncio.run(main())
    assert log.index("b in") > log.index("a out")  # b waited for a's turn
    assert log.index("c in") < log.index("a out")  # c, on another node, did not
    assert len(turns) == 0


def test_a_turn_left_by_an_error_is_given_back() -> None:
    turns = NodeTurns()

    async def main() -> None:
        try:
            async with turns.of("n"):
                raise ValueError("the write failed")
        except ValueError:
            pass
        await asyncio.wait_for(_hold(turns, "n", [], "next"), 1)

    asyncio.run(main())
    assert len(turns) == 0
