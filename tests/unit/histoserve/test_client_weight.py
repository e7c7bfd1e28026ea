"""The client side without the server's weight: no torch, no kserve, in code and in packaging.

``pip install histoserve`` is the client (``HistoserveClient``, ``histoserve
embed``, the V2 wire format); ``histoserve[server]`` adds torch and kserve.
What each entry point loads is read from ``python -X importtime`` in a fresh
interpreter (every module Python imported, however deep or late), so a
function-level ``import torch`` on the way counts too. The one fake: torch and
kserve are installed in this venv, so "not installed" is simulated by a
``None`` in ``sys.modules`` (Python's own way to make an import fail).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[3]
SERVER_ONLY = {"torch", "kserve"}
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


def _loaded(code: str, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """Top-level names of every module that ``python -c CODE ARGS`` imported, and the run."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    return {m.split(".")[0] for m in _IMPORTED.findall(run.stderr)}, run


CLIENT_ENTRIES = {
    "import histoserve.remote.client": ("import histoserve.remote.client", ()),
    "import histoserve.embedding.pipeline": ("import histoserve.embedding.pipeline", ()),
    "python -m histoserve.commands.embed --help": (
        "import runpy; runpy.run_module('histoserve.commands.embed', run_name='__main__')",
        ("--help",),
    ),
    "histoserve embed --help": (
        "import sys; from histoserve.commands.main import main; sys.exit(main(['embed', '--help']))",
        (),
    ),
    "histoserve embed (a usage error)": (
        "import sys; from histoserve.commands.main import main; sys.exit(main(['embed']))",
        (),
    ),
}


@pytest.mark.parametrize("entry", sorted(CLIENT_ENTRIES))
def test_the_client_side_loads_neither_torch_nor_kserve(entry):
    code, args = CLIENT_ENTRIES[entry]
    loaded, run = _loaded(code, *args)
    assert "histoserve" in loaded, run.stderr[-2000:]
    assert "predictor" not in loaded, f"{entry} imports the server package"
    assert run.returncode in (0, 2), run.stderr[-2000:]
    assert not loaded & SERVER_ONLY, f"{entry} imports {sorted(loaded & SERVER_ONLY)}"


def test_the_embed_help_is_the_embed_help():
    _, run = _loaded(CLIENT_ENTRIES["histoserve embed --help"][0])
    assert run.returncode == 0
    assert run.stdout.startswith("usage: histoserve embed")


def test_the_import_probe_sees_a_late_kserve_import():
    """The probe can fail: building the serve parser imports kserve inside a function."""
    loaded, run = _loaded("from predictor.cli import build_parser; build_parser()")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "kserve" in loaded


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_is_the_client_and_the_server_is_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = _names(project["dependencies"])
    assert not base & SERVER_ONLY, f"pip install histoserve would pull {base & SERVER_ONLY}"
    assert {"numpy", "pillow", "httpx"} <= base
    server = _names(project["optional-dependencies"]["server"])
    assert {"torch", "kserve", "prometheus-client", "pyyaml"} <= server


@pytest.mark.parametrize("argv", [["serve", "--model_dir", "/nonexistent"], ["--help"], ["export"]])
def test_serving_without_the_server_extra_fails_in_one_line(argv):
    """torch and kserve made unimportable (see the module docstring): one clear line, exit 2."""
    code = (
        "import sys; sys.modules.update(torch=None, kserve=None); "
        "from histoserve.commands.main import main; sys.exit(main(sys.argv[1:]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert "install histoserve[server]" in line
    assert "torch" in line and "kserve" in line


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``pip install histoserve`` (the wheel built from this checkout) only."""
    root = tmp_path_factory.mktemp("client-install")
    wheels, venv = root / "wheels", root / "venv"

    def run(*cmd: str | Path) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]

    source = root / "source"  # what the Dockerfile copies: the build writes no file in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "histoserve", "predictor"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"ignore": IGNORED} if copy is shutil.copytree else {}))
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, source)
    run(sys.executable, "-m", "venv", venv)
    (wheel,) = wheels.glob("histoserve-*.whl")
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel)
    return venv


def test_pip_install_histoserve_imports_beside_a_users_own_predictor(client_venv, tmp_path):
    """The import name is the distribution's: a folder's own ``predictor.py`` changes nothing."""
    (tmp_path / "predictor.py").write_text(
        "raise SystemExit('the user predictor.py was imported')\n"
    )
    code = (
        "import sys; from histoserve import HistoserveClient, embed, read_features, wire; "
        "print(sorted({'torch', 'kserve', 'predictor'} & set(sys.modules)))"
    )
    python = client_venv / "bin" / "python"
    run = subprocess.run(
        [python, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert (run.returncode, run.stdout.strip()) == (0, "[]"), run.stderr[-2000:]
    missing = subprocess.run(
        [python, "-c", "import torch"], capture_output=True, text=True, timeout=60, check=False
    )
    assert missing.returncode == 1  # the fresh venv really has no torch


def test_the_installed_console_script_says_which_extra_serve_needs(client_venv, tmp_path):
    script = client_venv / "bin" / "histoserve"
    run = subprocess.run(
        [script, "serve"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert "install histoserve[server]" in line and "torch" in line
    helped = subprocess.run(
        [script, "embed", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: histoserve embed")
