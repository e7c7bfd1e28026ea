"""A reader's workspace in which the docs' commands run as written (the docs test's session).

Contract:

- :meth:`DocsSession.folder` is a folder of the reader's own (under a temp
  dir) where the checkout's ``.venv``, ``charts`` and ``manifests`` are links:
  a command written against the checkout (``.venv/bin/python``,
  ``charts/histoserve``) runs there unchanged, and what it writes
  (``v2.json``, ``features/``, ``model/``) stays in the temp dir;
- :meth:`DocsSession.local` is the one edit made to a command: the ports 8080
  and 8081 become the session's free ports (the checkout's own ``make serve``
  may be running on 8080);
- :meth:`DocsSession.shell` runs one command line with ``bash -c``, the
  venv's and ``.tools``' ``bin`` first on ``PATH`` (``histoserve``, ``helm``);
- :meth:`DocsSession.start` / :meth:`DocsSession.finish` run one in the
  background: an export compiles for ~40 s on two cores, mostly on one, so
  the three the docs run (two of their own, one in ``make serve``) overlap;
- :meth:`DocsSession.make_serve` starts the Makefile's ``make serve`` with
  ``HTTP_PORT``, ``GRPC_PORT`` and a temporary ``MODEL_DIR``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from harness.server import Server, free_port, spawn

REPO = Path(__file__).resolve().parents[1]
CHECKOUT_LINKS = (".venv", "charts", "manifests")
COMMAND_TIMEOUT_S = 300.0
EXPORT_TIMEOUT_S = 600.0
"""A cold export with two others beside it on a loaded 2-core machine."""


class DocsSession:
    """Folders, ports and background commands of one docs-test module.

    Args:
        root: An empty temp folder the session owns.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.http_port, self.grpc_port = free_port(), free_port()
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._background: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.server: Server | None = None
        self._ready = False
        path = os.pathsep.join([str(REPO / ".venv" / "bin"), str(REPO / ".tools" / "bin")])
        self.env = dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ.get('PATH', '')}")
        self.env["PYTHONUNBUFFERED"] = "1"

    def folder(self, name: str) -> Path:
        """``root/name`` with the checkout's :data:`CHECKOUT_LINKS` (created once)."""
        path = self.root / name
        if not path.exists():
            path.mkdir(parents=True)
            for link in CHECKOUT_LINKS:
                (path / link).symlink_to(REPO / link, target_is_directory=True)
        return path

    def local(self, command: str) -> str:
        """``command`` with the docs' ports 8080 (REST) and 8081 (gRPC) made this session's."""
        command = re.sub(r"(?<=:)8080\b", str(self.http_port), command)
        return re.sub(r"(?<=:)8081\b", str(self.grpc_port), command)

    def shell(
        self, command: str, folder: Path, *, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """Runs one command line in ``folder`` with bash; output captured as text."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=folder,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    def start(
        self, key: str, command: str, folder: Path, env: dict[str, str] | None = None
    ) -> None:
        """Starts ``command`` in the background under ``key``; its output goes to a log."""
        log_path = self.logs / f"background-{len(self._background)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=folder,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._background[key] = (proc, log_path)

    def finish(self, key: str, timeout_s: float = EXPORT_TIMEOUT_S) -> tuple[int, str]:
        """Waits for the background command ``key``; its exit status and output."""
        proc, log_path = self._background[key]
        proc.wait(timeout_s)
        return proc.returncode, log_path.read_text(errors="replace")

    def make_serve(self, model_dir: Path) -> Server:
        """``make serve`` from the checkout on this session's ports (not waited for).

        ``-o .venv/.installed`` keeps make from reinstalling the venv when
        ``pyproject.toml`` is newer (``make test`` has just made sure it is
        not); the recipe's export and serve steps run as they are.
        """
        args = ["make", "-o", ".venv/.installed", "serve"]
        args += [f"HTTP_PORT={self.http_port}", f"GRPC_PORT={self.grpc_port}"]
        args += [f"MODEL_DIR={model_dir}"]
        ports = (self.http_port, self.grpc_port)
        self.server = spawn(
            args, ports=ports, log_dir=self.logs, model_name="h0-mini", env=self.env, kind="make"
        )
        return self.server

    def serving(self) -> Server:
        """The ``make serve`` server once ready (its export compiles first: minutes at most)."""
        assert self.server is not None, "make_serve() was not called"
        if not self._ready:
            self.server.wait_ready(EXPORT_TIMEOUT_S)
            self._ready = True
        return self.server

    def python(self, code: str, folder: Path) -> subprocess.CompletedProcess:
        """Runs a Python program with the venv's interpreter in ``folder``."""
        return subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), "-c", code],
            cwd=folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )

    def close(self) -> None:
        """Stops ``make serve`` (it passes SIGTERM on) and any background command left."""
        if self.server is not None:
            self.server.stop()
        for proc, _ in self._background.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
