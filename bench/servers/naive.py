"""Baseline (b): the straightforward KServe model for the same package.

A plain ``kserve.Model`` on stock KServe's ``ModelServer``: each request is
decoded by KServe, normalised in float32 on the CPU with numpy (``/255``,
mean/std), run through the package once (one forward per request, whatever
its size), and answered as V2 outputs (binary when the client asks). No
batcher, no thread pool, no custom parsing: what one writes from KServe's
documentation. It takes ``pixels`` (``UINT8 [N, H, W, 3]``) and, for
completeness, ``tiles`` as base64 PNG/JPEG strings in JSON.

Run as ``python -m bench.servers.naive --package P.pt2 --http_port N --grpc_port M``.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from PIL import Image

from predictor.packages.metadata import embedded_spec, package_input_dtype, read_metadata


class NaiveModel(Model):
    """One forward per request, float32 CPU preprocessing, stock KServe decoding.

    Args:
        name: Model name in URLs.
        package: Path of the ``.pt2`` package.
        device: ``cpu`` or ``cuda[:N]``.
    """

    def __init__(self, name: str, package: str, device: str = "cpu"):
        super().__init__(name)
        self.package_path = package
        self.device = torch.device(device)
        self.runner: Any = None

    def load(self) -> bool:
        metadata = read_metadata(self.package_path)
        spec = embedded_spec(metadata)
        self.dtype = package_input_dtype(metadata)
        self.mean = np.asarray(spec.mean or (0.0, 0.0, 0.0), dtype=np.float32)
        self.std = np.asarray(spec.std or (1.0, 1.0, 1.0), dtype=np.float32)
        index = (self.device.index or 0) if self.device.type == "cuda" else -1
        self.runner = torch._inductor.aoti_load_package(self.package_path, device_index=index)
        self.ready = True
        return True

    def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> InferResponse:
        tiles = self._tiles(payload.inputs[0])
        x = (tiles.astype(np.float32) / 255.0 - self.mean) / self.std
        batch = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
        with torch.inference_mode():
            out = self.runner(batch.to(self.device, self.dtype))
        out = out[0] if isinstance(out, (list, tuple)) else out
        embedding = out[: len(tiles)].float().cpu().numpy()
        binary = bool((payload.parameters or {}).get("binary_data_output", False))
        output = InferOutput(name="embedding", shape=list(embedding.shape), datatype="FP32")
        output.set_data_from_numpy(embedding, binary_data=binary)
        return InferResponse(
            response_id=payload.id,
            model_name=self.name,
            infer_outputs=[output],
            use_binary_outputs=binary,
        )

    @staticmethod
    def _tiles(infer_input: Any) -> np.ndarray:
        if infer_input.name == "pixels":
            return infer_input.as_numpy()
        images = [base64.b64decode(d) if isinstance(d, str) else d for d in infer_input.data]
        return np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in images])


def main(argv: Sequence[str] | None = None) -> int:
    """Serves :class:`NaiveModel` on stock KServe until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.servers.naive")
    parser.add_argument("--package", required=True)
    parser.add_argument("--model_name", default="h0-mini")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--http_port", type=int, default=8080)
    parser.add_argument("--grpc_port", type=int, default=8081)
    args = parser.parse_args(argv)
    model = NaiveModel(args.model_name, args.package, args.device)
    model.load()
    ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=1).start([model])
    return 0


if __name__ == "__main__":
    sys.exit(main())
