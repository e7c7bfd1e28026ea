"""What a package file is can be read without torch: no module of ``predictor/packages/``
imports it when imported (the exporter's checks and start-up's choice read packages cheaply)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import predictor.packages

ROOT = Path(__file__).resolve().parents[3]
MODULES = sorted(
    f"predictor.packages.{m.name}" for m in pkgutil.iter_modules(predictor.packages.__path__)
)


def test_no_package_fact_module_imports_torch():
    assert "predictor.packages.metadata" in MODULES and "predictor.packages.host" in MODULES
    code = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'torch' not in sys.modules, name\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
