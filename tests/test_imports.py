"""Imports flow one way: from entry points to settings and libraries, from every component to
the contract, never in a circle, and never from the node side into the webhook."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("webhook", "runtime_hook", "extender", "demo")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _runtime_imports(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The project modules whose import runs (at the top or in a function), with the packages
    above them, which Python imports first; imports under ``if TYPE_CHECKING:`` are for the
    type checker only."""
    names: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo += node.orelse
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        todo += ast.iter_child_nodes(node)
    return {
        ".".join(parts[:end])
        for parts in (name.split(".") for name in names)
        for end in range(1, len(parts) + 1)
    } & set(modules)


def _graph() -> dict[str, set[str]]:
    """Project module -> the project modules that importing it runs (not the packages above it,
    which Python has imported before it)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        above = {name.rsplit(".", depth)[0] for depth in range(name.count(".") + 1)}
        graph[name] = _runtime_imports(ast.parse(path.read_bytes(), str(path)), modules) - above
    return graph


GRAPH = _graph()


def _entry_points() -> set[str]:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    scripts = setup["options.entry_points"]["console_scripts"].split("\n")
    return {line.split("=")[1].strip().split(":")[0] for line in scripts if "=" in line}


def _cycle() -> list[str] | None:
    """One import cycle, as the modules around it, or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name):], name]
        if name in done:
            return None
        for target in sorted(GRAPH[name]):
            found = visit(target, [*path, name])
            if found:
                return found
        done.add(name)
        return None

    for name in sorted(GRAPH):
        found = visit(name, [])
        if found:
            return found
    return None


def test_the_graph_sees_the_imports_it_checks() -> None:
    # A graph that missed imports would pass every test below.
    assert "runtime_hook.contract" in GRAPH["webhook.policy"]
    assert "runtime_hook.prestart" in GRAPH["runtime_hook.hook_main"]  # inside a function
    assert {"runtime_hook.node.cli", "webhook.server"} <= _entry_points()


def test_no_module_imports_itself_back_through_others() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or ())


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if n.startswith("runtime_hook")))
def test_the_hook_and_the_node_agent_never_import_the_webhook_the_extender_or_the_demo(
    name: str,
) -> None:
    assert not {t for t in GRAPH[name] if t.startswith(("webhook", "extender", "demo"))}


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if n.startswith("webhook")))
def test_the_webhook_takes_only_the_contract_from_the_node_side(name: str) -> None:
    taken = {t for t in GRAPH[name] if t.startswith("runtime_hook")}
    assert taken <= {"runtime_hook", "runtime_hook.contract"}


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if not n.startswith("demo")))
def test_nothing_installed_imports_the_demo(name: str) -> None:
    assert not {t for t in GRAPH[name] if t.startswith("demo")}


@pytest.mark.parametrize("entry", sorted(_entry_points()))
def test_no_module_imports_an_entry_point(entry: str) -> None:
    """Entry points import settings and libraries, never the reverse; only their own package's
    ``__init__`` and ``__main__`` may name them."""
    package = entry.rpartition(".")[0]
    allowed = {package, f"{package}.__main__"}
    assert {name for name, targets in GRAPH.items() if entry in targets} <= allowed
