"""No import circle anywhere in the repository, none hidden inside a function; tests in their rooms.

The graph covers every module of ``histoserve/``, ``predictor/``, ``bench/``, ``harness/``,
``tests/`` and ``scripts/``, and every ``import`` statement in them: at the top,
inside functions and methods, under ``if TYPE_CHECKING`` and ``try``. A
function-level import that closes a circle still couples two modules both
ways; it only postpones the failure to the first call. (The layer rules of
``test_architecture.py`` read top-level imports only, on purpose: the console
script dispatches to ``embed`` lazily.) The same graph keeps the tests in their rooms:
no module imports a test module, and nothing under ``tests/unit/`` starts a
server.
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness.import_graph import circles, graph, imports

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("histoserve", "predictor", "bench", "harness", "tests", "scripts")
# The live-server fixtures of tests/conftest.py and tests/reliability/conftest.py.
SERVER_FIXTURES = {"embedding_server", "limited_server", "multimodal_server"}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module name -> the modules of ours it imports, anywhere in its code."""
    return graph(root, PACKAGES)


def test_the_graph_covers_the_repository_and_function_level_imports():
    graph = import_graph()
    assert {"predictor.cli", "bench.report_md", "harness.server", "scripts.install_helm"} <= set(
        graph
    )
    # The console script imports the embed CLI inside main() only: a function-level edge.
    assert "histoserve.commands.embed" in graph["histoserve.commands.main"]
    assert "bench.markdown" in graph["bench.report_triton"]


def test_no_import_circle_anywhere():
    found = circles(import_graph())
    assert not found, "import circles (function-level imports count): " + "; ".join(
        " <-> ".join(group) for group in found
    )


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


def test_unit_tests_start_no_server():
    """A test that starts a server (``harness.server``) belongs in ``tests/integration/``."""
    graph = import_graph()
    found = [
        name
        for name, deps in graph.items()
        if name.startswith("tests.unit.") and any(d.startswith("harness.server") for d in deps)
    ]
    uses_fixture = [
        f"{path.relative_to(ROOT)}:{node.name}"
        for path in sorted((ROOT / "tests" / "unit").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(a.arg in SERVER_FIXTURES for a in node.args.args)
    ]
    assert not found + uses_fixture, (
        f"start servers from tests/integration/, not tests/unit/: {found + uses_fixture}"
    )
    assert any("harness.server" in deps for deps in graph.values())  # the check sees servers


def test_a_circle_hidden_in_a_function_is_found(tmp_path):
    """The check can fail: two modules whose circle is closed by a function-level import."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "a.py").write_text("from bench.b import g\n\ndef f():\n    return g()\n")
    (tmp_path / "bench" / "b.py").write_text("def g():\n    from bench import a\n    return a\n")
    (tmp_path / "bench" / "c.py").write_text("from . import a\n")
    assert circles(import_graph(tmp_path)) == [["bench.a", "bench.b"]]


def test_top_level_imports_are_what_runs_at_import(tmp_path):
    """Blocks, handlers and class bodies run at import; functions and TYPE_CHECKING do not."""
    source = (
        "import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "try:\n    import d\nexcept ImportError:\n    import e\n"
        "    def late():\n        import f\nwith x:\n    import g\nfor i in y:\n    import h\n"
        "class K:\n    import i\n    def m(self):\n        import j\ndef fn():\n    import k\n"
    )
    (tmp_path / "m.py").write_text(source)
    known = {n: tmp_path / f"{n}.py" for n in "abcdefghijk"}
    assert imports(tmp_path / "m.py", "m", known, top_level_only=True) == set("acdeghi")
    assert imports(tmp_path / "m.py", "m", known) == set("abcdefghijk")


def test_the_circle_finder():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert circles({"a": {"a"}}) == [["a"]]
