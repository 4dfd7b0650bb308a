"""The files of the OCI hook as nodes get them: the modules ``oci_hook.py`` imports, and no other.

The set is found by reading the hook's source, not listed by hand: every
``runtime_hook`` module that ``oci_hook.py`` imports, directly or through
others, at the top or inside a function. So the node copy holds exactly
the standard-library-only hook (not the agent, not ``vcuda-run``), and a
module added to the hook's imports is shipped with it.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGE = "runtime_hook"
ENTRY = "oci_hook"
SOURCE = Path(__file__).resolve().parent.parent


def modules(source: Path | None = None) -> list[str]:
    """Names of the package's modules the hook needs (``__init__`` included), sorted.

    ``source`` is the package's directory (default: this one's).
    """
    source = source or SOURCE
    needed = {"__init__"}
    todo = [ENTRY]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        tree = ast.parse((source / f"{name}.py").read_bytes(), f"{name}.py")
        todo += [m for m in _imported(tree) if (source / f"{m}.py").is_file()]
    return sorted(needed)


def files(source: Path | None = None) -> dict[str, bytes]:
    """The hook's files by path relative to the install's ``python`` dir (``runtime_hook/x.py``)."""
    source = source or SOURCE
    return {f"{PACKAGE}/{m}.py": (source / f"{m}.py").read_bytes() for m in modules(source)}


def digest(tree: dict[str, bytes]) -> str:
    """A short digest of ``tree``'s names and contents: the installed version's name."""
    hashed = hashlib.sha256()
    for name in sorted(tree):
        hashed.update(f"{name}\0{len(tree[name])}\0".encode())
        hashed.update(tree[name])
    return hashed.hexdigest()[:12]


def _imported(tree: ast.AST) -> list[str]:
    """The ``runtime_hook`` modules an AST imports: ``from runtime_hook import x``,
    ``from runtime_hook.x import y``, ``import runtime_hook.x``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                found += [alias.name for alias in node.names]
            elif node.module.startswith(PACKAGE + "."):
                found.append(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found += [
                alias.name.split(".")[1]
                for alias in node.names
                if alias.name.startswith(PACKAGE + ".")
            ]
    return found
