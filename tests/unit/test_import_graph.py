"""Tests in their rooms, read from the repository's import graph (``grimp``, import-linter's
graph: every ``import`` statement, at the top, inside functions, under ``if TYPE_CHECKING``).

No module imports a test module, and nothing under ``tests/unit/`` uses a live-server
fixture (importing ``harness.server`` is the contract "unit-tests-start-no-server" in
``pyproject.toml``; no circle anywhere is the contract "no-circle", both run by
``tests/unit/test_architecture.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("histoserve", "predictor", "bench", "harness", "tests", "scripts")
# The live-server fixtures of tests/conftest.py and tests/reliability/conftest.py.
SERVER_FIXTURES = {"embedding_server", "limited_server", "multimodal_server"}


def import_graph() -> dict[str, set[str]]:
    """Module name -> the modules of ours it imports, anywhere in its code."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    return {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}


def test_the_graph_covers_the_repository_and_function_level_imports():
    graph = import_graph()
    assert {
        "predictor.cli",
        "bench.report.results_md",
        "harness.server",
        "scripts.install_helm",
    } <= set(graph)
    # The console script imports the embed CLI inside main() only: a function-level edge.
    assert "histoserve.commands.embed" in graph["histoserve.commands.main"]
    assert "bench.markdown" in graph["bench.triton.report"]


def test_no_module_imports_a_test_module():
    """Shared test code lives in ``harness/`` or a helper module, never in a ``test_*``/conftest."""
    graph = import_graph()
    found = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        for dep in deps
        if dep.rpartition(".")[2].startswith("test_") or dep.endswith(".conftest")
    ]
    assert not found, found


def test_unit_tests_use_no_server_fixture():
    """A test that starts a server (a live-server fixture) belongs in ``tests/integration/``."""
    uses_fixture = [
        f"{path.relative_to(ROOT)}:{node.name}"
        for path in sorted((ROOT / "tests" / "unit").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(a.arg in SERVER_FIXTURES for a in node.args.args)
    ]
    assert not uses_fixture, (
        f"start servers from tests/integration/, not tests/unit/: {uses_fixture}"
    )
