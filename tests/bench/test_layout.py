"""``bench/`` in folders: each says what it holds, and what runs a module by name or path finds it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bench.gpu import check
from bench.triton import baseline

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def test_every_bench_folder_says_what_it_holds() -> None:
    folders = sorted(p.parent for p in BENCH.rglob("__init__.py"))
    assert len(folders) >= 8, folders
    for folder in folders:
        init = folder / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), (
            f"{init}: no docstring"
        )


def test_the_gpu_sessions_command_runs_the_gpu_check() -> None:
    """``python3 -m bench.gpu_check`` is what GPU sessions call: it runs :mod:`bench.gpu.check`."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "python3 -m bench.gpu.check" in proc.stdout and "--dry_run" in proc.stdout


def test_every_gpu_check_stage_names_a_function() -> None:
    for stage in check.STAGES:
        assert callable(check._function(stage.target)), stage


def test_the_triton_scripts_are_where_the_baseline_runs_them() -> None:
    for script in ("server.py", "embedding_check.py"):
        assert (baseline.SCRIPTS / script).is_file(), script
