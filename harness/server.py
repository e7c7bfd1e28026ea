"""Server subprocesses on loopback: start, wait until ready, read logs, stop.

One implementation for the tests (``python -m predictor`` under test) and the
benchmark (histoserve with and without batching, and the naive baseline):
every server is a child process on free 127.0.0.1 ports whose output goes to
a log file, so a failed start can say why.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 180.0
FRONTENDS_ENV = "HISTOSERVE_TEST_FRONTENDS"
"""Set to N to start every test server with ``--frontends N`` (unless a test names its own)."""
_POLL_S = 0.2


class ServerFailed(RuntimeError):
    """A server exited during start-up or was not ready in time; carries its log tail."""


PORTS_FIRST, PORTS_END = 20000, 32000
"""Test servers' ports come from here: below Linux's ephemeral range (32768-60999),
so no client socket's local port, nor a ``bind(0)`` elsewhere, takes one between
:func:`free_port` and the server's own bind."""
_PORTS_PER_WORKER = 3000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, never one this process handed out recently.

    Each pytest-xdist worker (``PYTEST_XDIST_WORKER=gwN``) walks its own slice
    of :data:`PORTS_FIRST`..:data:`PORTS_END` from a random start, so two
    workers never race for one port and a process's consecutive calls differ
    (the first may not be bound yet when the second is asked for).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    slices = (PORTS_END - PORTS_FIRST) // _PORTS_PER_WORKER
    first = PORTS_FIRST + (int(worker) if worker.isdigit() else 0) % slices * _PORTS_PER_WORKER
    for _ in range(_PORTS_PER_WORKER):
        port = first + next(_PORT_STEPS) % _PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + _PORTS_PER_WORKER - 1}")


_PORT_STEPS = itertools.count(random.randrange(_PORTS_PER_WORKER))


@dataclass
class Server:
    """A running server subprocess and how to reach it.

    Attributes:
        proc: The child process.
        http_port: REST port on 127.0.0.1.
        grpc_port: gRPC port on 127.0.0.1.
        model_name: The served model's name in URLs; empty until
            :meth:`wait_ready` finds it when the server was started without one.
        log_path: Where the server's stdout and stderr go.
        args: The command line.
        kind: A label for messages and log names (``histoserve``, ``naive``, ...).
    """

    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    model_name: str
    log_path: Path
    args: list[str] = field(default_factory=list)
    kind: str = "histoserve"

    @property
    def processes(self) -> int:
        """Serving processes: the device owner, plus N front ends when ``--frontends N`` > 1."""
        flags = self.args
        n = int(flags[flags.index("--frontends") + 1]) if "--frontends" in flags else 1
        return 1 + n if n > 1 else 1

    @property
    def http_url(self) -> str:
        """``127.0.0.1:<http_port>`` (what tritonclient takes)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<http_port>``."""
        return f"http://{self.http_url}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:<grpc_port>``."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.proc.pid

    def log(self) -> str:
        """The server's whole log so far."""
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log()[-chars:]

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics``."""
        return httpx.get(f"{self.base}/metrics", timeout=10).text

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Polls V2 model readiness (finding the model's name first when unknown).

        Raises:
            ServerFailed: The process exited, or was not ready within
                ``timeout_s`` (it is stopped then); the message holds the log tail.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(
                    f"{self.kind} server exited {self.proc.returncode}:\n{self.tail()}"
                )
            if self._ready():
                return
            time.sleep(_POLL_S)  # polling a child process: there is no event to wait on
        self.stop()
        raise ServerFailed(f"{self.kind} server not ready in {timeout_s}s:\n{self.tail()}")

    def _ready(self) -> bool:
        try:
            if not self.model_name:
                models = httpx.get(f"{self.base}/v1/models", timeout=2).json()["models"]
                self.model_name = models[0]
            url = f"{self.base}/v2/models/{self.model_name}/ready"
            return httpx.get(url, timeout=2).status_code == 200
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return False

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the server drains), then SIGKILL after ``timeout_s``; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def spawn(
    args: Sequence[str],
    *,
    ports: tuple[int, int],
    log_dir: Path,
    model_name: str = "",
    env: Mapping[str, str] | None = None,
    kind: str = "histoserve",
    cwd: Path | None = None,
) -> Server:
    """Starts ``args`` from the repository root with output to ``log_dir`` (not yet ready).

    Args:
        args: The full command line.
        ports: ``(http_port, grpc_port)`` the command was told to use.
        log_dir: Folder for ``<kind>-<http_port>.log`` (created).
        model_name: The model's name, or empty to discover it when waiting.
        env: The child's environment (default: this one, unbuffered).
        kind: Label for the log name and messages.
        cwd: Where to start it (default: the repository root); ``python -m predictor``
            imports the ``predictor`` found there.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{ports[0]}.log"
    child_env = dict(env) if env is not None else dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            list(args), cwd=cwd or REPO, stdout=log, stderr=subprocess.STDOUT, env=child_env
        )
    return Server(proc, ports[0], ports[1], model_name, log_path, list(args), kind)


def predictor_command(model_dir: Path, ports: tuple[int, int], *flags: str) -> list[str]:
    """``python -m predictor --model_dir DIR --http_port P --grpc_port Q FLAGS...``."""
    return [
        sys.executable, "-m", "predictor", "--model_dir", str(model_dir),
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]), *flags,
    ]  # fmt: skip


def start_server(
    model_dir: Path, log_dir: Path, *flags: str, model_name: str | None = None, wait: bool = True
) -> Server:
    """The test suite's server: ``python -m predictor`` on CPU, 2 threads, 2 stage-1 workers.

    Args:
        model_dir: Folder holding the package.
        log_dir: Folder for the log.
        *flags: More server flags (``--max_batch_size 8``, ``--model_name x``...).
        model_name: The model's name when ``flags`` do not give it (else
            discovered from ``/v1/models``).
        wait: Wait for readiness (raises :class:`ServerFailed` on failure).

    ``$HISTOSERVE_TEST_FRONTENDS=N`` adds ``--frontends N`` when ``flags`` do
    not set it (the reliability suites with several front ends).
    """
    ports = (free_port(), free_port())
    cpu = ("--device", "cpu", "--preprocess_workers", "2")
    frontends = os.environ.get(FRONTENDS_ENV)
    if frontends and "--frontends" not in flags:
        flags = (*flags, "--frontends", frontends)
    args = predictor_command(model_dir, ports, *cpu, *flags)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    name = model_name or _flag(flags, "--model_name") or ""
    server = spawn(args, ports=ports, log_dir=log_dir, model_name=name, env=env, kind="server")
    if wait:
        server.wait_ready()
    return server


def _flag(flags: Sequence[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None
