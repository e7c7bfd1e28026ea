"""The shape of the package: no import circle, light codecs, small modules and classes."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.import_graph import circles, imports, modules

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "predictor"
CLIENT = ROOT / "histoserve"
MAX_LINES = 400
MAX_METHODS = 20
MAX_MODULES_PER_CLIENT_FOLDER = 10
# docs/architecture.md's two layer tables: their header cell, their package.
TABLES = {"predictor": "| layer |", "histoserve": "| client layer |"}


def _modules(packages: tuple[str, ...] = ("predictor", "histoserve")) -> dict[str, Path]:
    return modules(ROOT, packages)


def _top_level_imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """Modules of ours that ``path`` imports when it is imported (not inside functions)."""
    return imports(path, name, known, top_level_only=True)


def test_no_import_circle_among_the_package_modules():
    modules = _modules()
    graph = {name: _top_level_imports(path, name, modules) for name, path in modules.items()}
    assert graph["predictor.startup"] >= {"predictor.serving.model", "predictor.package.loader"}
    assert not circles(graph), f"import circles: {circles(graph)}"


def _layer_table(package: str = "predictor") -> list[tuple[str, tuple[str, ...]]]:
    """A layer table of docs/architecture.md, top to bottom: (layer, module prefixes)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index(TABLES[package] + " folders and modules |") :].split("\n\n")[0]
    rows = []
    for line in table.splitlines()[2:]:
        layer, cell = (c.strip() for c in line.strip("|").split("|")[:2])
        names = re.findall(r"`([\w/]+)`", cell)
        rows.append((layer, tuple(f"{package}." + n.rstrip("/").replace("/", ".") for n in names)))
    return rows


def _layer(module: str, table: list[tuple[str, tuple[str, ...]]]) -> str | None:
    for layer, prefixes in table:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


@pytest.mark.parametrize("package", sorted(TABLES))
def test_every_module_is_in_one_layer_by_its_folder(package):
    table = _layer_table(package)
    first = {"predictor": ["entry", "server edge"], "histoserve": ["command", "run"]}[package]
    assert [layer for layer, _ in table][:2] == first
    own = _modules((package,))
    unfiled = [m for m in own if m != package and _layer(m, table) is None]
    assert not unfiled, f"modules in no layer of docs/architecture.md: {unfiled}"
    top = [m for m in own if m.count(".") == 1 and not (ROOT / package / m.split(".")[1]).is_dir()]
    assert len(top) <= 12, top


@pytest.mark.parametrize("package", sorted(TABLES))
def test_imports_point_down_the_layers(package):
    table = _layer_table(package)
    order = [layer for layer, _ in table]
    modules = _modules()
    upward = []
    for name, path in _modules((package,)).items():
        here = _layer(name, table)
        for dep in _top_level_imports(path, name, modules):
            there = _layer(dep, table)
            if here is None or there is None:
                continue
            if order.index(there) < order.index(here):
                upward.append(f"{name} -> {dep}")
    assert _layer(f"{package}.errors", table) in ("foundations", "basics")
    assert not upward, upward


# What the server may use of the client: the wire format, the version, and the
# extra check below both packages' commands (stdlib only), asked by
# `predictor.cli:serve` when it runs. Never the client's commands.
SERVER_USES_OF_CLIENT = {"histoserve.wire", "histoserve", "histoserve.extras"}
SERVER_NAMES_FROM_CLIENT_ROOT = {"__version__", "wire"}


def test_the_client_never_imports_the_server():
    """No ``predictor`` import anywhere in ``histoserve/`` (functions included), and no
    module named by string but the console script's (``serve``, ``export``)."""
    modules = _modules()
    crossing = []
    for name, path in _modules(("histoserve",)).items():
        deps = imports(path, name, modules)  # every import statement, not only the top
        crossing += [f"{name} -> {d}" for d in deps if d.split(".")[0] == "predictor"]
        if name != "histoserve.commands.main":
            strings = [
                n.value
                for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            crossing += [f"{name} names {s}" for s in strings if re.match(r"predictor\.\w", s)]
    assert not crossing, crossing


def test_the_server_uses_only_the_clients_wire():
    """Of ``histoserve``, ``predictor/`` imports the wire format and the version, anywhere."""
    modules = _modules()
    crossing = []
    for name, path in _modules(("predictor",)).items():
        for dep in imports(path, name, modules):
            allowed = dep in SERVER_USES_OF_CLIENT
            if (
                dep.startswith("histoserve")
                and not allowed
                and not dep.startswith("histoserve.wire.")
            ):
                crossing.append(f"{name} -> {dep}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "histoserve":
                names = {a.name for a in node.names} - SERVER_NAMES_FROM_CLIENT_ROOT
                crossing += [f"{name} -> histoserve.{n}" for n in sorted(names)]
            elif isinstance(node, ast.Import) and any(a.name == "histoserve" for a in node.names):
                crossing.append(f"{name} imports the whole client")
    assert not crossing, crossing
    uses_wire = {
        n for n, p in modules.items() if "histoserve.wire" in _top_level_imports(p, n, modules)
    }
    assert "predictor.codecs.binary" in uses_wire


def _package_folders(package: Path) -> list[Path]:
    """The package and its subpackages (folders with ``__init__.py``), as git would see them."""
    return [package, *sorted(p.parent for p in package.rglob("*/__init__.py"))]


def test_no_client_folder_over_ten_modules_and_each_says_what_it_holds():
    for folder in _package_folders(CLIENT):
        count = len(list(folder.glob("*.py")))
        assert count <= MAX_MODULES_PER_CLIENT_FOLDER, f"{folder}: {count} modules"
        init = folder / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), (
            f"{init}: no docstring"
        )


@pytest.mark.parametrize(
    "module",
    [
        "predictor.codecs.v1",
        "predictor.codecs.v2",
        "predictor.codecs.base",
        "predictor.codecs.samples",
    ],
)
def test_a_codec_imports_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


def test_no_module_over_the_line_limit():
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_class_with_too_many_methods():
    big = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                if len(methods) > MAX_METHODS:
                    big[f"{name}.{node.name}"] = len(methods)
    assert not big, big


def _defined(path: Path, dotted: str) -> bool:
    """Whether ``dotted`` (``func``, ``Class`` or ``Class.method``) is defined in ``path``."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = [
            n
            for n in scope
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == part
        ]
        if not found:
            return False
        scope = getattr(found[0], "body", [])
    return True


def test_the_architecture_walk_names_real_code():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    refs = set(re.findall(r"((?:predictor|histoserve)/[\w/]+\.py):([A-Za-z_][\w.]*\w)", text))
    walk = text[text.index("## The walk") : text.index("### One layout")]
    steps = re.findall(r"^\s*(\d+)\. ", walk, flags=re.MULTILINE)
    assert steps == [str(i) for i in range(1, 11)]  # ten steps, in order
    assert len(refs) >= 20
    missing = sorted(f"{f}:{name}" for f, name in refs if not _defined(ROOT / f, name))
    assert not missing, missing
