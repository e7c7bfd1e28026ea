"""An outside V2 gRPC client (``tritonclient.grpc``) driven from the test process.

``tritonclient.grpc`` and kserve register the same protobuf symbols, so they
cannot share a process: :class:`GrpcClient` runs ``python -m
harness.grpc_worker`` and speaks one JSON line per call with it.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading

import numpy as np

from harness.server import REPO


class GrpcError(Exception):
    """A gRPC call failed; ``status`` is e.g. ``StatusCode.INVALID_ARGUMENT``."""

    def __init__(self, status: str, message: str):
        self.status, self.message = status, message
        super().__init__(f"{status}: {message}")


class GrpcClient:
    """``infer(model, {name: (datatype, array)}) -> {name: array}`` over real gRPC.

    Args:
        url: ``host:port`` of the server's gRPC port.
    """

    def __init__(self, url: str):
        self.url = url
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.grpc_worker"],
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
            raise RuntimeError(f"gRPC worker exited ({self._proc.poll()})")
        return json.loads(line)

    def infer(
        self, model: str, inputs: dict[str, tuple[str, np.ndarray]], parameters: dict | None = None
    ) -> dict[str, np.ndarray]:
        """One inference; raises :class:`GrpcError` with the gRPC status on failure."""
        return self.answer(model, inputs, parameters)[0]

    def answer(
        self,
        model: str,
        inputs: dict[str, tuple[str, np.ndarray]],
        parameters: dict | None = None,
        outputs: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        """One inference asking for ``outputs`` (None: not named), sending ``headers`` as
        gRPC metadata: its outputs and parameters.

        Raises:
            GrpcError: With the gRPC status on failure.
        """
        payload = {
            "op": "infer",
            "url": self.url,
            "model": model,
            "parameters": parameters,
            "outputs": outputs,
            "headers": headers,
            "inputs": [{"name": n, "datatype": d, "data": _npy(a)} for n, (d, a) in inputs.items()],
        }
        answer = self._call(payload)
        if "outputs" not in answer:
            raise GrpcError(answer["status"], answer["message"])
        arrays = {
            name: np.load(io.BytesIO(base64.b64decode(v)), allow_pickle=True)
            for name, v in answer["outputs"].items()
        }
        return arrays, answer.get("parameters") or {}

    def is_model_ready(self, model: str) -> bool:
        """V2 gRPC model readiness."""
        return self._call({"op": "ready", "url": self.url, "model": model})["ready"]

    def repository(self, op: str, model: str = "") -> dict:
        """The repository extension's ``index``, ``load`` or ``unload`` (tritonclient's calls).

        Raises:
            GrpcError: With the gRPC status on failure.
        """
        answer = self._call({"op": op, "url": self.url, "model": model})
        if "status" in answer:
            raise GrpcError(answer["status"], answer["message"])
        return answer

    def close(self) -> None:
        """Ends the worker (closing its stdin ends its loop)."""
        self._proc.stdin.close()
        self._proc.wait(30)


def _npy(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return base64.b64encode(buf.getvalue()).decode()
