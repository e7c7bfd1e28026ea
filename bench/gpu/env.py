"""What the GPU check needs around its stages: the carried wheels, the machine's facts, a deadline.

* :func:`bootstrap`: on a machine without KServe (the lent GPU), the wheels
  carried in ``.gpu-wheels/`` are unpacked into ``WORK/site`` (a wheel is a
  zip: nothing but Python is needed, not even pip) and the check runs again
  with that folder first on ``PYTHONPATH``, so the carried grpcio wins over
  an older preinstalled one and every child process (servers, load
  generator, exports) sees the same.
* :func:`machine_facts`: ``nvidia-smi -q`` and ``pip list`` into ``$OUT``.
* :class:`Deadline`: the whole check's limit; past it the running stage is
  interrupted (``SIGALRM``), recorded as an error, and nothing more starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".gpu-wheels"
MARK = "HISTOSERVE_GPU_CHECK_SITE"
NEEDED = ("kserve", "tritonclient", "aiohttp")


def missing_modules(names: tuple[str, ...] = NEEDED) -> list[str]:
    """The modules of ``names`` this interpreter cannot import."""
    return [n for n in names if importlib.util.find_spec(n) is None]


def unpack_wheels(wheels: Path, site: Path) -> int:
    """Unpacks every ``*.whl`` under ``wheels`` into ``site`` (``.data/purelib|platlib`` lifted); the count."""
    site.mkdir(parents=True, exist_ok=True)
    count = 0
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        count += 1
    for data in site.glob("*.data"):
        for kind in ("purelib", "platlib"):
            lib = data / kind
            if lib.is_dir():
                shutil.copytree(lib, site, dirs_exist_ok=True)
    return count


def bootstrap(argv: list[str], work: Path) -> None:
    """Unpacks the carried wheels and re-runs the check with them, once; returns when nothing is missing."""
    if os.environ.get(MARK) or not missing_modules() or not WHEELS.is_dir():
        return
    site = work / "site"
    started = time.monotonic()
    count = unpack_wheels(WHEELS, site)
    print(
        f"gpu-check: {count} wheels unpacked into {site} in {time.monotonic() - started:.1f} s",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    paths = [str(site), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), **{MARK: str(site)})
    os.execve(sys.executable, [sys.executable, "-m", "bench.gpu.check", *argv], env)


def machine_facts(out: Path) -> dict[str, Any]:
    """``nvidia-smi -q`` and ``pip list`` (``python -m pip list``, else the site's dists) into ``out``."""
    facts: dict[str, Any] = {}
    smi = shutil.which("nvidia-smi")
    commands = {
        "nvidia-smi-q.txt": [smi, "-q"] if smi else None,
        "pip-list.txt": [sys.executable, "-m", "pip", "list", "--disable-pip-version-check"],
    }
    for name, command in commands.items():
        if command is None:
            facts[name] = "not available"
            continue
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            (out / name).write_text(done.stdout + done.stderr)
            facts[name] = f"exit {done.returncode}"
        except (OSError, subprocess.SubprocessError) as exc:
            facts[name] = f"failed: {exc}"
    return facts


class DeadlineReached(Exception):
    """The check's total deadline passed while a stage ran."""


class Deadline:
    """The check's total deadline: :meth:`left` seconds, and ``SIGALRM`` interrupting at the end."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def left(self) -> float:
        """Seconds until the deadline (negative past it)."""
        return self.seconds - (time.monotonic() - self.started)

    def arm(self) -> None:
        """Raises :class:`DeadlineReached` in the main thread when the deadline passes."""

        def fire(signum: int, frame: Any) -> None:
            raise DeadlineReached(f"the check's {self.seconds:.0f} s deadline passed")

        signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, self.left()))

    def disarm(self) -> None:
        """No interruption any more (the report is being written)."""
        signal.setitimer(signal.ITIMER_REAL, 0)
