"""A family is declared once, in its module, and every family of the registry has all its parts.

Its parts: the hooks (``FAMILY``), its modes and what each answers (a table
of :mod:`histoserve.wire.modes`, the one the client checks answers against:
referenced, never copied), its spec section and check, its package inputs
and outputs, its demo model and example inputs, a built-in spec, its
server test (``tests/integration/test_NAME_server.py``) and its place in
``docs/architecture.md`` (its module, or its package's folder). No module of the repository's code (tests aside:
they state expected values on their own) repeats a mode table, a family's
outputs or the list of families.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from histoserve.wire import modes as wire_modes
from predictor.families import FAMILIES, build_demo_model, check_consistency, server_model
from predictor.model.family import Family
from predictor.spec import BUILTIN_SPECS, ModelSpec

ROOT = Path(__file__).resolve().parents[3]
CODE = ("predictor", "histoserve", "harness", "bench", "scripts")
"""The folders scanned for copies (``tests/`` states expected values on purpose)."""
DECLARED_IN = ROOT / "histoserve" / "wire" / "modes.py"


def _wire_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    return {
        name: dict(value)
        for name, value in vars(wire_modes).items()
        if name.isupper() and isinstance(value, dict)
    }


def _wire_tuples() -> dict[str, tuple[str, ...]]:
    """Every output-name tuple the wire declares, by where it sits."""
    found = {
        name: value
        for name, value in vars(wire_modes).items()
        if name.isupper() and isinstance(value, tuple)
    }
    for table, value in _wire_tables().items():
        found.update({f"{table}[{mode!r}]": outputs for mode, outputs in value.items()})
    return found


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_of_the_registry_has_every_part(name: str) -> None:
    module = importlib.import_module(f"predictor.families.{name}")
    family = module.FAMILY
    assert issubclass(family, Family) and family.__module__ == module.__name__
    # modes: the wire's tuples, the very objects the client reads
    declared = {id(value) for value in _wire_tuples().values()}
    assert family.MODE_OUTPUTS, f"{name}: no modes"
    for mode, outputs in family.MODE_OUTPUTS.items():
        assert id(outputs) in declared, f"{name}: mode {mode!r} answers a copy, not the wire's"
    # its spec section: fields of the spec, its own check
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert set(family.SPEC_FIELDS) <= fields, f"{name}: {family.SPEC_FIELDS}"
    # inputs, outputs, the demo model and its inputs: the family's own, not the base's
    assert family.PACKAGE_INPUTS and family.PACKAGE_OUTPUTS
    for hook in ("build_demo", "example_inputs", "check_outputs", "outputs", "input_types"):
        assert getattr(family, hook) is not getattr(Family, hook), f"{name}: no {hook}"
    specs = [s for s in BUILTIN_SPECS.values() if s.family == name]
    assert specs, f"{name}: no built-in spec"
    for spec in specs:
        _check_demo(spec)
        model = server_model(spec, "absent.pt2", device="cpu")
        for mode in spec.modes:
            names = tuple(o.name for o in model.family.outputs(mode))
            assert names == family.MODE_OUTPUTS[mode], (spec.name, mode)
        assert model.family.input_types()
    # its tests and docs
    assert (ROOT / "tests" / "integration" / f"test_{name}_server.py").is_file()
    path = Path(module.__file__).relative_to(ROOT)
    named = path.parent if path.name == "__init__.py" else path  # a small package: its folder
    assert f"`{named}" in (ROOT / "docs" / "architecture.md").read_text(), named


def _check_demo(spec: ModelSpec) -> None:
    import torch

    from predictor.families import demo_example_inputs

    inputs = demo_example_inputs(spec, 3)
    with torch.no_grad():
        outputs = build_demo_model(spec, "tiny")(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if spec.family == "slide":  # one slide: attention's first axis is its N tiles
        check_consistency(spec, [tuple(o.shape) for o in outputs])
    else:
        check_consistency(spec, [tuple(o.shape[1:]) for o in outputs])


def test_the_families_sections_of_the_spec_do_not_overlap() -> None:
    owner: dict[str, str] = {}
    for name in FAMILIES:
        for field in importlib.import_module(f"predictor.families.{name}").FAMILY.SPEC_FIELDS:
            assert field not in owner, f"{field}: {owner[field]} and {name}"
            owner[field] = name


def _literals(tree: ast.AST) -> Iterator[tuple[ast.AST, tuple[str, ...] | dict | None]]:
    """Each tuple, list, set or dict literal of string constants, with its value."""
    spec_modes = set()  # a spec's own ``modes=`` (or ``"modes":``) is its choice, not a copy
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "modes":
            spec_modes.add(id(node.value))
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "modes":
                    spec_modes.add(id(value))
    for node in ast.walk(tree):
        if id(node) in spec_modes:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = _strings(node)
            if strings is not None and len(strings) >= 2:
                yield node, strings
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            values = [_strings(v) for v in node.values]
            if len(keys) == len(node.keys) and all(v is not None for v in values):
                yield node, dict(zip(keys, values, strict=True))


def _strings(node: ast.AST) -> tuple[str, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)
    return None


def copies(root: Path) -> list[str]:
    """Where the code under ``root`` repeats a family declaration of the wire or the registry."""
    tables = _wire_tables()
    mode_sets = [frozenset(t) for t in tables.values()]
    outputs = [  # a kind of model's outputs (SLIDE_OUTPUTS), not one mode's answer
        v for k, v in vars(wire_modes).items() if k.endswith("OUTPUTS") and isinstance(v, tuple)
    ]
    families = frozenset(FAMILIES)
    found = []
    for folder in CODE:
        for path in sorted((root / folder).rglob("*.py")):
            if path.relative_to(root) == DECLARED_IN.relative_to(ROOT):
                continue
            for node, value in _literals(ast.parse(path.read_text(encoding="utf-8"))):
                where = f"{path.relative_to(root)}:{node.lineno}"
                if isinstance(value, dict):
                    table = {k: tuple(v) for k, v in value.items()}
                    if any(
                        set(table) <= set(t)
                        and all(v == t[k] or v == t[k][:1] for k, v in table.items())
                        for t in tables.values()
                    ):
                        found.append(f"{where}: a mode table {table}")
                elif frozenset(value) in mode_sets:
                    found.append(f"{where}: a family's modes {value}")
                elif len(value) >= 2 and value in outputs:
                    found.append(f"{where}: a family's outputs {value}")
                elif frozenset(value) == families:
                    found.append(f"{where}: the registry's families {value}")
    return found


def test_no_family_declaration_is_copied() -> None:
    assert copies(ROOT) == []


def test_the_copy_check_sees_a_copy(tmp_path: Path) -> None:
    """Each kind of copy this repository once had (a second mode table, the families' list,
    a slide head's outputs) is found."""
    (tmp_path / "predictor").mkdir()
    (tmp_path / "predictor" / "copied.py").write_text(
        "BY_MODE = {'prediction': ('prediction',), 'embedding': ('embedding',),\n"
        "           'prediction_with_embedding': ('prediction', 'embedding')}\n"
        "FAMILIES = ('embedding', 'multimodal', 'segmentation', 'slide')\n"
        "OUTPUTS = ('prediction', 'attention', 'slide_embedding')\n"
        "MODES = ['prediction', 'embedding', 'attention']\n"
        "SPEC = dict(modes=('prediction', 'embedding', 'attention'))  # a spec's choice\n"
    )
    found = copies(tmp_path)
    assert [line.split(": ", 1)[1].split(" ", 2)[:2] for line in found] == [
        ["a", "mode"],
        ["the", "registry's"],
        ["a", "family's"],
        ["a", "family's"],
    ], found
