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
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[3]
SERVER_ONLY = {"torch", "kserve"}
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
    "import predictor.client.histoserve": ("import predictor.client.histoserve", ()),
    "import predictor.client.embed.pipeline": ("import predictor.client.embed.pipeline", ()),
    "python -m predictor.client.embed.cli --help": (
        "import runpy; runpy.run_module('predictor.client.embed.cli', run_name='__main__')",
        ("--help",),
    ),
    "histoserve embed --help": (
        "import sys; from predictor.cli import main; sys.exit(main(['embed', '--help']))",
        (),
    ),
    "histoserve embed (a usage error)": (
        "import sys; from predictor.cli import main; sys.exit(main(['embed']))",
        (),
    ),
}


@pytest.mark.parametrize("entry", sorted(CLIENT_ENTRIES))
def test_the_client_side_loads_neither_torch_nor_kserve(entry):
    code, args = CLIENT_ENTRIES[entry]
    loaded, run = _loaded(code, *args)
    assert "predictor" in loaded, run.stderr[-2000:]
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
        "from predictor.cli import main; sys.exit(main(sys.argv[1:]))"
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
