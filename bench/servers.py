"""Server subprocesses on loopback: histoserve (batching on or off) and the naive baseline.

Every server gets the same environment (``OMP_NUM_THREADS`` = the profile's
thread count) so the limit, the baselines and histoserve use the CPU alike.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_env(threads: int) -> dict[str, str]:
    """Environment for every benchmark process: pinned thread counts, unbuffered output."""
    return dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
        PYTHONWARNINGS="ignore",
    )


@dataclass
class ServerProcess:
    """A running server subprocess and how to reach it."""

    kind: str
    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    model: str
    log_path: Path
    args: list[str]

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Polls V2 readiness; raises with the log tail if the server dies or times out."""
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.http}/v2/models/{self.model}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} server exited {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.kind} server not ready in {timeout_s}s:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _spawn(
    kind: str, args: list[str], model: str, ports: tuple[int, int], log_dir: Path, threads: int
) -> ServerProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{ports[0]}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=bench_env(threads)
        )
    return ServerProcess(kind, proc, ports[0], ports[1], model, log_path, args)


def start_histoserve(
    package: Path,
    *,
    model: str,
    device: str,
    max_batch_size: int,
    max_latency_ms: float,
    max_queue_size: int,
    workers: int,
    threads: int,
    log_dir: Path,
    kind: str = "histoserve",
) -> ServerProcess:
    """``python -m predictor`` serving ``package`` with the given batching (not yet ready)."""
    ports = (free_port(), free_port())
    args = [
        sys.executable, "-m", "predictor",
        "--model_dir", str(package.parent), "--checkpoint", package.name,
        "--model_name", model, "--device", device,
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]),
        "--max_batch_size", str(max_batch_size), "--max_latency_ms", str(max_latency_ms),
        "--max_queue_size", str(max(max_queue_size, max_batch_size)),
        "--preprocess_workers", str(workers), "--drain_timeout_s", "5",
    ]  # fmt: skip
    return _spawn(kind, args, model, ports, log_dir, threads)


def start_naive(
    package: Path, *, model: str, device: str, threads: int, log_dir: Path
) -> ServerProcess:
    """The naive baseline (:mod:`bench.naive`) on stock KServe (not yet ready)."""
    ports = (free_port(), free_port())
    args = [
        sys.executable, "-m", "bench.naive",
        "--package", str(package), "--model_name", model, "--device", device,
        "--http_port", str(ports[0]), "--grpc_port", str(ports[1]),
    ]  # fmt: skip
    return _spawn("naive", args, model, ports, log_dir, threads)
