"""Live-server fixtures: the real ``python -m predictor`` on loopback ports.

Each server is a subprocess serving a real demo ``.pt2`` compiled in this
test session (see ``tests/conftest.py``); tests talk to it with outside V2
clients (``tritonclient``) and plain HTTP.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180.0

MEAN = np.array([0.707223, 0.578729, 0.703617], dtype=np.float32)
STD = np.array([0.211883, 0.230117, 0.177517], dtype=np.float32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running histoserve subprocess."""

    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    model_name: str
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        return httpx.get(f"{self.base}/metrics", timeout=10).text

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_server(
    model_dir: Path, tmp_path: Path, *extra: str, model_name: str | None = None, wait: bool = True
) -> Server:
    """Starts ``python -m predictor`` on free ports and waits for model readiness."""
    http_port, grpc_port = free_port(), free_port()
    args = [
        sys.executable,
        "-m",
        "predictor",
        "--model_dir",
        str(model_dir),
        "--device",
        "cpu",
        "--http_port",
        str(http_port),
        "--grpc_port",
        str(grpc_port),
        "--preprocess_workers",
        "2",
        *extra,
    ]
    log_path = tmp_path / f"server-{http_port}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the subprocess
    proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    name = model_name or _name_from_args(extra)
    server = Server(proc, http_port, grpc_port, name or "", log_path, args)
    if wait:
        wait_ready(server)
    return server


def _name_from_args(extra: Sequence[str]) -> str | None:
    return extra[extra.index("--model_name") + 1] if "--model_name" in extra else None


def wait_ready(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited {server.proc.returncode}:\n{server.log()}")
        try:
            if not server.model_name:
                models = httpx.get(f"{server.base}/v1/models", timeout=2).json()["models"]
                server.model_name = models[0]
            if (
                httpx.get(
                    f"{server.base}/v2/models/{server.model_name}/ready", timeout=2
                ).status_code
                == 200
            ):
                return
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.2)
    server.stop()
    raise AssertionError(f"server not ready in {STARTUP_TIMEOUT_S}s:\n{server.log()}")


@pytest.fixture(scope="module")
def embedding_server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("emb"),
        "--max_batch_size",
        "8",
        "--max_latency_ms",
        "20",
    )
    yield server
    server.stop()


# -- tiles and references ----------------------------------------------------------------
def random_tiles(n: int, size: int = 224, seed: int = 0) -> np.ndarray:
    """``uint8 [n, size, size, 3]`` tiles, each clearly different from the others."""
    rng = np.random.default_rng(seed)
    tiles = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    return tiles


def encode_png(tile: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(tile).save(buf, format="PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def normalise_reference(
    tiles: np.ndarray, mean: np.ndarray | None = MEAN, std: np.ndarray | None = STD
) -> torch.Tensor:
    """The vendor's preprocessing, done independently of the server: /255, mean/std, NCHW."""
    x = tiles.astype(np.float32) / 255.0
    if mean is not None:
        x = (x - mean) / std
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


class Reference:
    """The package itself, run in the test process for numerical truth."""

    def __init__(self, package_path: Path):
        self.runner = torch._inductor.aoti_load_package(str(package_path))

    def __call__(self, *inputs: torch.Tensor) -> list[np.ndarray]:
        with torch.inference_mode():
            out = self.runner(*inputs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [o.float().numpy() for o in outs]


def package_in(model_dir: Path) -> Path:
    (path,) = sorted(model_dir.glob("*.pt2"))
    return path


# -- outside gRPC client (its own interpreter: tritonclient.grpc clashes with kserve) -----
class GrpcError(Exception):
    """A gRPC call failed; ``status`` is e.g. ``StatusCode.INVALID_ARGUMENT``."""

    def __init__(self, status: str, message: str):
        self.status, self.message = status, message
        super().__init__(f"{status}: {message}")


class GrpcClient:
    """Proxy to ``grpc_worker.py``: ``infer(model, {name: (datatype, array)}) -> {name: array}``."""

    def __init__(self, url: str):
        self.url = url
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("grpc_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self._lock = threading.Lock()

    def _call(self, payload: dict) -> dict:
        with self._lock:
            self._proc.stdin.write(json.dumps(payload) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise AssertionError("gRPC worker died")
        return json.loads(line)

    def infer(
        self, model: str, inputs: dict[str, tuple[str, np.ndarray]], parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        payload = {
            "op": "infer",
            "url": self.url,
            "model": model,
            "parameters": parameters,
            "inputs": [{"name": n, "datatype": d, "data": _npy(a)} for n, (d, a) in inputs.items()],
        }
        answer = self._call(payload)
        if "outputs" not in answer:
            raise GrpcError(answer["status"], answer["message"])
        return {
            name: np.load(io.BytesIO(base64.b64decode(v)), allow_pickle=True)
            for name, v in answer["outputs"].items()
        }

    def is_model_ready(self, model: str) -> bool:
        return self._call({"op": "ready", "url": self.url, "model": model})["ready"]

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(30)


def _npy(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return base64.b64encode(buf.getvalue()).decode()


def bytes_array(items: Sequence[bytes]) -> np.ndarray:
    """An object array of raw bytes for a ``BYTES`` input."""
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = list(items)
    return arr
