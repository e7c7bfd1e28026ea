"""The repository's own import graph, read from source (nothing is imported).

Shared by ``tests/unit/test_architecture.py`` (the layer rules read top-level
imports only: the CLI dispatches to ``embed`` lazily, on purpose) and
``tests/unit/test_import_graph.py`` (no circle anywhere, function-level
imports included).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``*.py`` under ``root/<package>``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _statements(tree: ast.Module, top_level_only: bool) -> Iterator[ast.AST]:
    yield from _run_at_import(tree) if top_level_only else ast.walk(tree)


def _run_at_import(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` that runs when the module is imported: blocks and class
    bodies too, never a function's body or an ``if TYPE_CHECKING`` block (type hints only)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for branch in child.orelse:
                yield branch
                yield from _run_at_import(branch)
            continue
        yield child
        yield from _run_at_import(child)


def imports(
    path: Path, name: str, known: dict[str, Path], *, top_level_only: bool = False
) -> set[str]:
    """Modules of ``known`` that ``path`` (module ``name``) imports.

    ``top_level_only``: only what runs when the module is imported (not inside
    functions, not under ``if TYPE_CHECKING``); else every import statement.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text(encoding="utf-8")), top_level_only):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def graph(
    root: Path, packages: Iterable[str], *, top_level_only: bool = False
) -> dict[str, set[str]]:
    """Module name -> the modules of ours it imports."""
    known = modules(root, packages)
    return {n: imports(p, n, known, top_level_only=top_level_only) for n, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (top := stack.pop()) != node:
                group.append(top)
            group.append(node)
            if len(group) > 1 or node in edges.get(node, ()):
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)
