"""Which packages this host has loaded before: the load probe's host-local record.

``--load_probe auto`` (the default) probes a package in a child process
(:mod:`predictor.runtime.load_probe`) unless this host has loaded exactly that
package before: its SHA-256 (start-up hashes it anyway), on this device, with
this forward runner, this torch and this Python, on this host name. So the
first start of a package on a host pays for one child (``import torch``, the
load, one batch: docs/reliability.md gives the figure), and the common restart
pays nothing.

A probe that passes is remembered as one empty file named by that identity
in :func:`default_folder` (``$XDG_CACHE_HOME/histoserve/load-probes``, else
``~/.cache/...``; the chart's cache volume, which outlives a container
restart). The server's own load is guarded too: :meth:`ProbeRecord.loading`
leaves a marker for the length of the in-process load, so a load that killed
the server (a signal, ``_exit``) leaves it behind and the next start forgets
the package and probes it again, naming what went wrong. A folder that is a
symlink, another user's, or not writable is no record: every package is then
probed (never trusted on a planted record), and the log says so once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("histoserve")

FOLDER = Path("histoserve") / "load-probes"
_LOADING = ".loading"


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/histoserve/load-probes`` (``~/.cache`` when the variable is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / FOLDER


def probe_id(package_sha256: str, device: str, runner: str) -> str:
    """The identity a passed probe is remembered by (hex)."""
    import torch

    facts = (package_sha256, device, runner, torch.__version__, sys.executable, platform.node())
    return hashlib.sha256("\0".join(facts).encode()).hexdigest()


@dataclass(frozen=True)
class ProbeRecord:
    """A folder of passed probes (``folder`` ``None``: no usable record, every package probed)."""

    folder: Path | None

    @classmethod
    def open(cls, folder: Path | None = None) -> ProbeRecord:
        """The record in ``folder`` (default :func:`default_folder`), made ``0700`` if missing."""
        folder = Path(folder) if folder is not None else default_folder()
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = folder.lstat()
            usable = (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.getuid()
                and not info.st_mode & 0o022
                and os.access(folder, os.W_OK)
            )
        except OSError as exc:
            logger.info(
                "load probe: no record of probed packages (%s): every package is probed", exc
            )
            return cls(None)
        if not usable:
            logger.warning(
                "load probe: %s is a symlink, another user's, writable by others or read-only: "
                "not trusted as a record of probed packages; every package is probed",
                folder,
            )
            return cls(None)
        return cls(folder)

    def passed(self, identity: str) -> bool:
        """This host probed (or loaded) the package and it loaded; no load of it died since."""
        if self.folder is None:
            return False
        entry = self.folder / identity
        if (self.folder / (identity + _LOADING)).exists():
            logger.warning(
                "load probe: the last load of this package in a server on this host did not "
                "finish (it died while loading); probing it again"
            )
            self.forget(identity)
            return False
        return entry.is_file() and not entry.is_symlink()

    def remember(self, identity: str, package: Path) -> None:
        """Records a passed probe (atomically; best effort: a full disk only costs a probe)."""
        if self.folder is None:
            return
        staged = self.folder / f".{identity}.{os.getpid()}"
        with contextlib.suppress(OSError):
            staged.write_text(f"{package}\n", encoding="utf-8")
            os.replace(staged, self.folder / identity)

    def forget(self, identity: str) -> None:
        """Drops the package's record and its load marker."""
        if self.folder is None:
            return
        for name in (identity, identity + _LOADING):
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()

    @contextlib.contextmanager
    def loading(self, identity: str) -> Iterator[None]:
        """Marks the server's own load of the package for its length.

        The marker stays only when the process dies inside (a native crash,
        a signal, ``_exit``): :meth:`passed` then forgets the package.
        """
        marker = self.folder / (identity + _LOADING) if self.folder is not None else None
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.touch()
        try:
            yield
        finally:
            if marker is not None:
                with contextlib.suppress(OSError):
                    marker.unlink()
