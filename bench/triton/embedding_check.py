"""Served embeddings equal the in-process forward: checked before any cell is timed.

Runs under ``.venv-triton/bin/python`` (it has torch, numpy and tritonclient,
and no kserve, whose protobuf symbols clash with tritonclient's). For each
server given, sends the same few tiles over V2 binary REST and V2 gRPC with
``tritonclient`` and compares the answers with the package run here on
``(x/255 - mean)/std`` written out plainly, in the package's dtype. Prints
one JSON object: per server and protocol the largest absolute difference and
the smallest cosine similarity over the tiles.

Run as ``python bench/triton/embedding_check.py --package P.pt2 --mean a,b,c
--std a,b,c --dtype float32 --tile_size 224 --server NAME=HTTP,GRPC,MODEL ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

TILES = 3


def reference(args: argparse.Namespace, tiles: np.ndarray) -> np.ndarray:
    """The package's output for ``tiles`` (``uint8 [N, T, T, 3]``), normalised plainly."""
    model = torch._inductor.aoti_load_package(args.package)
    mean = torch.tensor([float(v) for v in args.mean.split(",")]).view(1, 3, 1, 1)
    std = torch.tensor([float(v) for v in args.std.split(",")]).view(1, 3, 1, 1)
    x = torch.from_numpy(tiles).permute(0, 3, 1, 2).to(torch.float32)
    x = ((x / 255.0 - mean) / std).to(getattr(torch, args.dtype)).contiguous()
    with torch.inference_mode():
        out = model(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    return out[:TILES].float().numpy()


def served(http: str, grpc: str, model: str, tiles: np.ndarray) -> dict[str, np.ndarray]:
    """The ``embedding`` output for ``tiles`` over V2 binary REST and V2 gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rest = httpclient.InferenceServerClient(http)
    inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    inp.set_data_from_numpy(tiles, binary_data=True)
    wanted = [httpclient.InferRequestedOutput("embedding", binary_data=True)]
    out = {"v2-pixels": rest.infer(model, [inp], outputs=wanted).as_numpy("embedding")}
    channel = grpcclient.InferenceServerClient(grpc)
    ginp = grpcclient.InferInput("pixels", list(tiles.shape), "UINT8")
    ginp.set_data_from_numpy(tiles)
    out["v2-grpc"] = channel.infer(model, [ginp]).as_numpy("embedding")
    return out


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """Largest absolute difference and smallest per-tile cosine similarity."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    if got.shape != want.shape:
        return {"shape": list(got.shape), "expected_shape": list(want.shape), "ok": False}
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return {"max_abs": float(np.abs(got - want).max()), "min_cosine": float(cos.min())}


def main(argv: Sequence[str] | None = None) -> int:
    """Checks every ``--server`` and prints the JSON report."""
    parser = argparse.ArgumentParser(prog="embedding_check.py", description=__doc__)
    parser.add_argument("--package", required=True)
    parser.add_argument("--mean", required=True)
    parser.add_argument("--std", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tile_size", type=int, required=True)
    parser.add_argument("--server", action="append", default=[], help="NAME=HTTP,GRPC,MODEL")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(7)
    tiles = rng.integers(0, 256, (TILES, args.tile_size, args.tile_size, 3), dtype=np.uint8)
    want = reference(args, tiles)
    report: dict[str, Any] = {}
    for entry in args.server:
        name, _, where = entry.partition("=")
        http, grpc, model = where.split(",")
        report[name] = {p: compare(o, want) for p, o in served(http, grpc, model, tiles).items()}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
