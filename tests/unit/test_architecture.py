"""The shape of the package: the layer contract, light codecs, composition over inheritance.

The import rules (layers, no circle, the client alone, the server on the
client's wire only) are ``import-linter`` contracts in ``pyproject.toml``:
:func:`test_the_import_contracts_hold` runs ``lint-imports`` on the checkout,
and :func:`test_a_broken_contract_fails` on a copy with a violating import.
What the tool cannot check stays here: the contracts' layers are
``docs/architecture.md``'s tables, a module named by string, the names the
server takes from the client's root, that no class of the server inherits
from two of the project's own. Sizes are not capped: modules split and merge
where a concept ends.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "predictor"
CLIENT = ROOT / "histoserve"
# docs/architecture.md's two layer tables: their header cell, their package.
TABLES = {"predictor": "| layer |", "histoserve": "| client layer |"}
# The folders lint-imports reads (pyproject.toml's root_packages), copied for the failing runs.
ROOTS = ("histoserve", "predictor", "bench", "harness", "tests", "scripts")


def _modules(packages: tuple[str, ...] = ("predictor", "histoserve")) -> dict[str, Path]:
    """Dotted module name -> file, for every ``*.py`` of ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the tree at ``root`` (its ``pyproject.toml``), no cache written."""
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


# Each breaks the contract named: an upward import at module level, an upward one inside
# a function, a circle closed inside a function, torch in the client, kserve imported outside
# predictor/kserve/, a folder in no layer.
VIOLATIONS = {
    "upward": ("server-layers", "predictor/codecs/base.py", "import predictor.model.base\n"),
    "upward, late": (
        "client-layers",
        "histoserve/wire/__init__.py",
        "def f():\n    import histoserve.api\n",
    ),
    "circle, late": (
        "no-circle",
        "bench/markdown.py",
        "def f():\n    import bench.triton.report\n",
    ),
    "torch": ("client-alone", "histoserve/text.py", "import torch\n"),
    "kserve outside its folder": (
        "kserve-in-one-place",
        "predictor/model/admission.py",
        "def f():\n    from kserve import Model\n",
    ),
    "unfiled": ("server-layers", "predictor/newroom/__init__.py", '"""In no layer."""\n'),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_a_broken_contract_fails(tmp_path, case):
    """The check can fail: a copy of the tree with one violating import is refused."""
    for name in ROOTS:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    contract, path, line = VIOLATIONS[case]
    target = tmp_path / path
    target.parent.mkdir(exist_ok=True)
    target.write_text((target.read_text() if target.exists() else "") + line)
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout[-2000:]
    assert f"{_contract(contract)['name']} BROKEN" in result.stdout, result.stdout[-3000:]


def _contract(contract_id: str) -> dict:
    """One contract's options as pyproject.toml declares them."""
    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (found,) = [c for c in contracts if c.get("id") == contract_id]
    return found


def _layer_table(package: str) -> list[tuple[str, ...]]:
    """A layer table of docs/architecture.md, top to bottom: each layer's folders and modules."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index(TABLES[package] + " folders and modules |") :].split("\n\n")[0]
    return [
        tuple(n.rstrip("/") for n in re.findall(r"`([\w/]+)`", line.strip("|").split("|")[1]))
        for line in table.splitlines()[2:]
    ]


def _contract_layers(package: str) -> list[tuple[str, ...]]:
    """The layers of ``package``'s contract in pyproject.toml, top to bottom."""
    layers = _contract({"predictor": "server-layers", "histoserve": "client-layers"}[package])
    return [tuple(name.strip() for name in layer.split(":")) for layer in layers["layers"]]


@pytest.mark.parametrize("package", sorted(TABLES))
def test_the_docs_layer_table_is_the_contract(package):
    """docs/architecture.md's table, row by row, is the layers contract lint-imports checks
    (exhaustive: every folder and top-level module of the package is in one layer)."""
    assert _layer_table(package) == _contract_layers(package)


# What the server takes from the client's root: the version and the wire module
# (the contract "server-uses-the-wire" forbids every other room of the client).
SERVER_NAMES_FROM_CLIENT_ROOT = {"__version__", "wire"}


def test_the_client_names_no_server_module():
    """No module of ``histoserve/`` names ``predictor.*`` by string but the console
    script's (``serve``, ``export``): imports are the contract's, strings are not."""
    crossing = []
    for name, path in _modules(("histoserve",)).items():
        if name == "histoserve.commands.main":
            continue
        strings = [
            n.value
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        crossing += [f"{name} names {s}" for s in strings if re.match(r"predictor\.\w", s)]
    assert not crossing, crossing


def test_the_server_takes_only_the_version_and_the_wire_from_the_clients_root():
    crossing = []
    for name, path in _modules(("predictor",)).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "histoserve":
                names = {a.name for a in node.names} - SERVER_NAMES_FROM_CLIENT_ROOT
                crossing += [f"{name} -> histoserve.{n}" for n in sorted(names)]
            elif isinstance(node, ast.Import) and any(a.name == "histoserve" for a in node.names):
                crossing.append(f"{name} imports the whole client")
    assert not crossing, crossing


def _package_folders(package: Path) -> list[Path]:
    """The package and its subpackages (folders with ``__init__.py``), as git would see them."""
    return [package, *sorted(p.parent for p in package.rglob("*/__init__.py"))]


@pytest.mark.parametrize("package", [PACKAGE, CLIENT], ids=["predictor", "histoserve"])
def test_each_folder_says_what_it_holds(package):
    for folder in _package_folders(package):
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


def _defined(path: Path, dotted: str) -> bool:
    """Whether ``dotted`` (``func``, ``Class``, ``Class.method`` or a module's ``TABLE``)
    is defined in ``path``."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    if "." not in dotted and any(
        isinstance(target, ast.Name) and target.id == dotted
        for node in scope
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
    ):
        return True
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


def _own_classes() -> set[str]:
    """The names of every class defined in the project's two packages."""
    return {
        node.name
        for path in _modules().values()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
    }


def test_no_server_class_inherits_from_two_of_the_projects_own():
    """Parts are composed, not mixed in: at most one base of ours per class of ``predictor/``."""
    own = _own_classes()
    mixed = {}
    for name, path in _modules(("predictor",)).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases]
                ours = [b for b in bases if b in own]
                if len(ours) > 1:
                    mixed[f"{name}.{node.name}"] = ours
    assert not mixed, mixed


def test_the_check_can_see_a_mixin():
    """The names above resolve: the served model's one base is KServe's, a family's one is ours."""
    own = _own_classes()
    assert {"BaseServerModel", "Family", "TileFamily", "SlideFamily"} <= own
    assert "Model" not in own  # KServe's


def test_the_slide_family_overrides_no_tile_hook():
    """A slide head is a family of its own, not a tile model with parts switched off."""
    from predictor.families.slide import SlideFamily
    from predictor.model.family import Family
    from predictor.model.tiles import TileFamily

    tile_hooks = {n for n in vars(TileFamily) if not n.startswith("__")} - set(vars(Family))
    assert {"batch_inputs", "output_to_host", "build_responses"} <= tile_hooks
    assert not issubclass(SlideFamily, TileFamily)
    assert not tile_hooks & set(vars(SlideFamily))
