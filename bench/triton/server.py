"""NVIDIA Triton serving the same ``.pt2`` package: the benchmark's Triton baseline.

Runs under ``.venv-triton/bin/python`` (``nvidia-pytriton`` 0.7 bundles
``tritonserver`` 2.51 and pins ``numpy<2``, so it has its own venv; see
:func:`bench.triton.baseline.start_triton`). Imports only numpy, torch and pytriton:
never ``predictor`` or ``kserve``, which are not installed there.

What it serves, to match histoserve's work per tile:

- the model ``--model_name`` with input ``pixels`` (``UINT8 [-1, T, T, 3]``,
  the batch axis is Triton's) and output ``embedding`` (``FP32 [-1, D]``);
  V2 REST (binary tensor extension included) and V2 gRPC are Triton's own;
- Triton's dynamic batcher on, ``max_batch_size`` = ``--max_batch_size``
  tiles, ``max_queue_delay`` = ``--max_latency_ms``, one model instance;
- the Python callable gets the whole batch as one uint8 array and does what
  histoserve's device worker does: uint8 to the device, permute to CHW,
  ``(x/255 - mean)/std`` in float32 as one ``addcmul``, cast to the package
  dtype, contiguous, one forward through ``torch._inductor.aoti_load_package``.

Several models in one Triton (:mod:`bench.studies.two_models`): ``--models_json
FILE`` lists them, each a JSON object of the per-model flags below without
``--`` (``model_name``, ``package``, ``mean``, ``std``, ``dtype``,
``tile_size``, ``embedding_dim``, ``max_batch_size``, ``max_latency_ms``,
``instances``) plus ``output``: ``embedding`` (the default) or ``mask``, a
segmenter's ``UINT8 [-1, T, T]`` mask (``logits > logit(mask_threshold)``,
histoserve's segmentation family's rule). The flags then give only the ports,
threads and device.

Run as ``python bench/triton/server.py --package P.pt2 --http_port N
--grpc_port M --metrics_port K --mean a,b,c --std a,b,c --dtype float32
--embedding_dim 1536 --tile_size 224``. SIGTERM stops Triton and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _floats(text: str) -> tuple[float, float, float]:
    values = tuple(float(v) for v in text.split(","))
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected three comma-separated numbers, got {text!r}")
    return values  # type: ignore[return-value]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="bench/triton/server.py", description=__doc__)
    parser.add_argument("--package")
    parser.add_argument("--model_name", default="bench")
    parser.add_argument("--http_port", type=int, required=True)
    parser.add_argument("--grpc_port", type=int, required=True)
    parser.add_argument("--metrics_port", type=int, required=True)
    parser.add_argument("--max_batch_size", type=int, default=32)
    parser.add_argument("--max_latency_ms", type=float, default=5.0)
    parser.add_argument("--mean", type=_floats, default=(0.0, 0.0, 0.0))
    parser.add_argument("--std", type=_floats, default=(1.0, 1.0, 1.0))
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--embedding_dim", type=int)
    parser.add_argument("--tile_size", type=int)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (the package's)")
    parser.add_argument(
        "--instances", type=int, default=1, help="model instances (each its own package load)"
    )
    parser.add_argument("--models_json", type=Path, default=None, help="several models (above)")
    args = parser.parse_args(argv)
    missing = [
        f"--{k}" for k in ("package", "embedding_dim", "tile_size") if getattr(args, k) is None
    ]
    if args.models_json is None and missing:
        parser.error(f"{', '.join(missing)} required (or --models_json)")
    return args


OUTPUTS = ("embedding", "mask")
"""What a served model answers: a tile encoder's ``embedding`` or a segmenter's ``mask``."""
_PER_MODEL = (
    "model_name", "package", "mean", "std", "dtype", "tile_size", "embedding_dim",
    "max_batch_size", "max_latency_ms", "instances",
)  # fmt: skip


def served_models(args: argparse.Namespace) -> list[argparse.Namespace]:
    """One namespace per model: ``--models_json``'s entries over the flags, else the flags'.

    Raises:
        SystemExit: An entry has an unknown key or an unknown ``output``.
    """
    if args.models_json is None:
        return [argparse.Namespace(**vars(args), output="embedding", mask_threshold=0.5)]
    models = []
    for entry in json.loads(args.models_json.read_text()):
        unknown = set(entry) - {*_PER_MODEL, "output", "mask_threshold"}
        if unknown or entry.get("output", "embedding") not in OUTPUTS:
            raise SystemExit(f"{args.models_json}: bad model entry {entry} (keys {_PER_MODEL})")
        model = argparse.Namespace(**vars(args), output="embedding", mask_threshold=0.5)
        for key, value in entry.items():
            setattr(model, key, _floats(value) if key in ("mean", "std") else value)
        models.append(model)
    return models


class PackageForward:
    """The package and its normalisation, called on a whole uint8 batch.

    Args:
        args: The parsed flags (package, mean, std, dtype).
    """

    def __init__(self, args: argparse.Namespace):
        self.device = torch.device(args.device)
        index = (self.device.index or 0) if self.device.type == "cuda" else -1
        self.model = torch._inductor.aoti_load_package(args.package, device_index=index)
        mean = torch.tensor(args.mean, dtype=torch.float32)
        std = torch.tensor(args.std, dtype=torch.float32)
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1).to(self.device)
        self.shift = (-mean / std).view(1, 3, 1, 1).to(self.device)
        self.dtype = getattr(torch, args.dtype)
        self.mask = args.output == "mask"
        self.cut = math.log(args.mask_threshold / (1.0 - args.mask_threshold))

    @torch.inference_mode()
    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """``uint8 [B, T, T, 3]`` -> ``float32 [B, D]``, or a mask's ``uint8 [B, T, T]``
        (uint8 crosses to the device)."""
        x = torch.from_numpy(pixels).to(self.device)
        x = x.permute(0, 3, 1, 2).contiguous().to(torch.float32)
        x = torch.addcmul(self.shift, x, self.scale).to(self.dtype).contiguous()
        out = self.model(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        out = out[: len(pixels)]
        if self.mask:
            logits = out.squeeze(1) if out.dim() == 4 else out
            return (logits > self.cut).to(torch.uint8).cpu().numpy()
        return out.float().cpu().numpy()


def serve(args: argparse.Namespace) -> int:
    """Binds every model and serves until SIGTERM/SIGINT."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
        log_verbose=0,
        exit_timeout_secs=5,
    )
    with Triton(config=config) as triton:
        for model in served_models(args):
            # pytriton: a list of callables is an instance group, one instance each.
            infers = [_instance(PackageForward(model)) for _ in range(model.instances)]
            delay_us = int(model.max_latency_ms * 1000)
            size = model.tile_size
            output = (
                Tensor(name="mask", dtype=np.uint8, shape=(size, size))
                if model.output == "mask"
                else Tensor(name="embedding", dtype=np.float32, shape=(model.embedding_dim,))
            )
            triton.bind(
                model_name=model.model_name,
                infer_func=infers if len(infers) > 1 else infers[0],
                inputs=[Tensor(name="pixels", dtype=np.uint8, shape=(size, size, 3))],
                outputs=[output],
                config=ModelConfig(
                    max_batch_size=model.max_batch_size,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us),
                ),
                strict=True,
            )

        def stop(signum: int, frame: Any) -> None:
            triton.stop()

        signal.signal(signal.SIGTERM, stop)
        triton.serve()
    return 0


def _instance(forward: PackageForward) -> Any:
    """One model instance's callable: the batch's ``pixels`` through ``forward``."""
    from pytriton.decorators import batch

    name = "mask" if forward.mask else "embedding"

    @batch
    def infer(pixels: np.ndarray) -> dict[str, Any]:
        return {name: forward(pixels)}

    return infer


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the flags, pins torch's threads, serves."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
