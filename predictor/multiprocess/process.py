"""What every process of a ``--frontends N`` pod sets up first: the count, metrics folder, log tag.

Light on purpose: the CLI calls these before ``prometheus_client`` (which
picks its value store at import) or anything heavy is imported.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def frontend_count(value: str, cpus: int) -> int:
    """``--frontends``: a number, or ``auto`` (the CPUs less one for the device owner, at least 1).

    Raises:
        ValueError: Neither ``auto`` nor a whole number >= 1.
    """
    if value == "auto":
        return max(1, cpus - 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"--frontends must be auto or a whole number >= 1, got {value!r}")
    return count


def prepare_metrics_dir() -> str:
    """Points ``PROMETHEUS_MULTIPROC_DIR`` at an empty folder (a fresh one unless set); its path.

    Must run before ``prometheus_client`` is imported: it picks its value
    store at import.
    """
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="histoserve-metrics-")
        atexit.register(shutil.rmtree, path, True)  # ours: gone when the pod's parent exits
    Path(path).mkdir(parents=True, exist_ok=True)
    for stale in Path(path).glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = path
    return path


def tag_log_lines(tag: str) -> None:
    """Prefixes every log line of this process with ``[tag]`` (children share one stderr)."""
    make = logging.getLogRecordFactory()

    def tagged(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.msg = f"[{tag}] {record.msg}"
        return record

    logging.setLogRecordFactory(tagged)


PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None) -> None:
    """Asks the kernel to SIGKILL this front end when its supervisor dies (``PR_SET_PDEATHSIG``).

    A front end that outlived its supervisor would hold the inherited port
    with no device owner behind it. If the supervisor ``parent_pid`` is
    already gone (it died before the request was made), exits at once.
    """
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
