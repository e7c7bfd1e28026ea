"""``histoserve embed`` as tests and the benchmark run it: a real subprocess, real files.

- :func:`embed_command` / :func:`run_embed`: ``histoserve embed`` in its own
  interpreter, so its ``tritonclient.grpc`` never meets the test process's kserve,
  and with ``torch`` and ``kserve`` unimportable there: every run proves the
  client side works without the server's dependencies (``pip install histoserve``);
- :func:`run_aggregate`: ``histoserve aggregate`` the same way, from any
  working folder, with an optional fault injected into that very process;
- :func:`read_output`: one ``<slide_id>.h5`` as plain numpy arrays and attributes;
- :func:`tiles_served`: a server's ``histoserve_tiles_total`` by outcome, from ``/metrics``;
- :func:`independent_tiles`: tiles read straight from OpenSlide and resized with
  PIL (bicubic, as the specs say), independently of ``histoserve``,
  for numerical truth.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
EMBED_TIMEOUT_S = 300.0
_TILES = re.compile(r"^histoserve_tiles_total\{([^}]*)\}\s+([0-9.e+]+)", re.MULTILINE)


# The console script's own path (`histoserve embed` is `histoserve.commands.main:main`), in an
# interpreter where importing torch or kserve raises ImportError: they are
# installed in this venv, and a `None` in sys.modules is how Python spells "not
# installed" without uninstalling them.
_WITHOUT_SERVER = (
    "import sys; sys.modules.update({blocked}); "
    "from histoserve.commands.main import main; sys.exit(main(['embed', *sys.argv[1:]]))"
)


def embed_command(*args: str | Path) -> list[str]:
    """``histoserve embed ARGS`` with this interpreter, torch and kserve unimportable.

    ``--layout clam`` writes CLAM's ``pt_files/<id>.pt`` with torch, the one
    case the client imports it: there only kserve is made unimportable.
    """
    words = list(map(str, args))
    clam = any(pair == ("--layout", "clam") for pair in itertools.pairwise(words))
    blocked = "kserve=None" if clam else "torch=None, kserve=None"
    return [sys.executable, "-c", _WITHOUT_SERVER.format(blocked=blocked), *words]


def run_embed(
    *args: str | Path, timeout_s: float = EMBED_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs the CLI to completion (progress ``plain`` unless given); output captured as text.

    ``env``: the child's whole environment (default: this process's).
    """
    extra = () if "--progress" in args else ("--progress", "plain")
    return subprocess.run(
        embed_command(*args, *extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )


_MEASURE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(f'peak_rss_kb={peak}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def run_embed_measured(
    *args: str | Path, timeout_s: float = EMBED_TIMEOUT_S, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """:func:`run_embed`, and the embed process's peak resident memory in MB.

    The CLI runs as the only child of a small wrapper, whose children's peak is
    then the CLI's alone (this test process's other children do not count).
    """
    extra = () if "--progress" in args else ("--progress", "plain")
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *embed_command(*args, *extra)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )
    peak_kb = int(done.stderr.rsplit("peak_rss_kb=", 1)[1].split()[0])
    return done, peak_kb / 1024


def run_aggregate(
    *args: str | Path, cwd: Path = REPO, before: str = "", timeout_s: float = EMBED_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """``histoserve aggregate ARGS`` run from ``cwd``, torch and kserve unimportable; output as text.

    ``before``: Python run first in that interpreter (a fault put into the
    very process, e.g. a drawing step that kills it with ``os._exit``).
    """
    code = (
        "import sys; sys.modules.update(torch=None, kserve=None)\n"
        f"{before}\n"
        "from histoserve.commands.main import main; sys.exit(main(['aggregate', *sys.argv[1:]]))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env,
    )  # fmt: skip


def read_output(path: Path) -> dict[str, Any]:
    """Datasets (numpy arrays), ``attrs`` (file attributes) and ``coords_attrs`` of one file."""
    import h5py

    with h5py.File(path, "r") as f:
        out: dict[str, Any] = {name: f[name][()] for name in f}
        out["attrs"] = {k: _plain(v) for k, v in f.attrs.items()}
        out["coords_attrs"] = {k: _plain(v) for k, v in f["coords"].attrs.items()}
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def tiles_served(base_url: str) -> dict[str, float]:
    """``histoserve_tiles_total`` summed by outcome (``ok``, ``failed``, ...) from ``/metrics``."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    totals: dict[str, float] = {}
    for labels, value in _TILES.findall(text):
        outcome = re.search(r'outcome="([^"]*)"', labels)
        key = outcome.group(1) if outcome else ""
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def independent_tiles(
    path: Path, coords: np.ndarray, level: int, read_size: int, tile_size: int
) -> np.ndarray:
    """Tiles at level-0 ``coords`` read with OpenSlide at ``level`` and resized with PIL bicubic.

    Written from the issue's definition (read ``read_size`` px at ``level``,
    composite on white, antialiased resize to ``tile_size`` with the
    interpolation every model spec names, bicubic: ``predictor.spec``), not from
    ``histoserve``'s code.
    """
    import openslide
    from PIL import Image

    out = np.empty((len(coords), tile_size, tile_size, 3), np.uint8)
    with openslide.OpenSlide(str(path)) as slide:
        for i, (x, y) in enumerate(np.asarray(coords)):
            rgba = slide.read_region((int(x), int(y)), level, (read_size, read_size))
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            rgb = Image.alpha_composite(white, rgba).convert("RGB")
            if read_size != tile_size:
                rgb = rgb.resize((tile_size, tile_size), Image.Resampling.BICUBIC)
            out[i] = np.asarray(rgb)
    return out


def status_rows(out_dir: Path) -> list[dict[str, str]]:
    """``status.csv`` as dicts (empty when missing)."""
    import csv

    path = Path(out_dir) / "status.csv"
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def by_status(rows: Sequence[dict[str, str]]) -> dict[str, list[str]]:
    """Slide ids per status, in file order."""
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["status"], []).append(row["slide_id"])
    return out
