"""Served embeddings equal the in-process forward: checked before any cell is timed.

Runs under ``.venv-triton/bin/python`` (it has torch, numpy and tritonclient,
and no kserve, whose protobuf symbols clash with tritonclient's). For each
server given, sends the same few tiles over V2 binary REST and V2 gRPC with
``tritonclient`` and compares the answers with the package run here on
``(x/255 - mean)/std`` written out plainly, in the package's dtype. Prints
one JSON object: per server and protocol the largest absolute difference and
the smallest cosine similarity over the tiles. A segmenter (``--output mask``)
is compared by its masks: the reference's is ``logits > logit(--mask_threshold)``
(histoserve's segmentation family's rule), and the report gives the share of
pixels that agree (``agree``) and the masks' tissue shares.

Run as ``python bench/triton/embedding_check.py --package P.pt2 --mean a,b,c
--std a,b,c --dtype float32 --tile_size 224 --server NAME=HTTP,GRPC,MODEL ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

TILES = 3


def check_tiles(tile_size: int) -> np.ndarray:
    """The tiles every check sends: ``uint8 [TILES, T, T, 3]``, uniform noise, seeded."""
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (TILES, tile_size, tile_size, 3), dtype=np.uint8)


def forward(package: str, mean: str, std: str, dtype: str, tiles: np.ndarray) -> torch.Tensor:
    """The package's raw output for ``tiles`` (``uint8 [N, T, T, 3]``), normalised plainly."""
    model = torch._inductor.aoti_load_package(package)
    mean_t = torch.tensor([float(v) for v in mean.split(",")]).view(1, 3, 1, 1)
    std_t = torch.tensor([float(v) for v in std.split(",")]).view(1, 3, 1, 1)
    x = torch.from_numpy(tiles).permute(0, 3, 1, 2).to(torch.float32)
    x = ((x / 255.0 - mean_t) / std_t).to(getattr(torch, dtype)).contiguous()
    with torch.inference_mode():
        out = model(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    return out[: len(tiles)]


def reference(args: argparse.Namespace, tiles: np.ndarray) -> np.ndarray:
    """The package's output for ``tiles``: the embedding, or the mask at ``--mask_threshold``."""
    out = forward(args.package, args.mean, args.std, args.dtype, tiles)
    if args.output == "mask":
        logits = out.squeeze(1) if out.dim() == 4 else out
        cut = math.log(args.mask_threshold / (1.0 - args.mask_threshold))
        return (logits > cut).to(torch.uint8).numpy()
    return out.float().numpy()


def served(
    http: str, grpc: str, model: str, tiles: np.ndarray, output: str = "embedding"
) -> dict[str, np.ndarray]:
    """The ``output`` for ``tiles`` over V2 binary REST and V2 gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rest = httpclient.InferenceServerClient(http)
    inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    inp.set_data_from_numpy(tiles, binary_data=True)
    wanted = [httpclient.InferRequestedOutput(output, binary_data=True)]
    out = {"v2-pixels": rest.infer(model, [inp], outputs=wanted).as_numpy(output)}
    channel = grpcclient.InferenceServerClient(grpc)
    ginp = grpcclient.InferInput("pixels", list(tiles.shape), "UINT8")
    ginp.set_data_from_numpy(tiles)
    out["v2-grpc"] = channel.infer(model, [ginp]).as_numpy(output)
    return out


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """Largest absolute difference and smallest per-tile cosine similarity; for masks
    (``uint8``) the share of pixels that agree and each side's share of tissue."""
    if got.shape != want.shape:
        return {"shape": list(got.shape), "expected_shape": list(want.shape), "ok": False}
    if want.dtype == np.uint8:
        return {
            "agree": float((got == want).mean()),
            "tissue": float((got > 0).mean()),
            "expected_tissue": float((want > 0).mean()),
        }
    got, want = got.astype(np.float64), want.astype(np.float64)
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
    parser.add_argument("--output", choices=("embedding", "mask"), default="embedding")
    parser.add_argument("--mask_threshold", type=float, default=0.5)
    parser.add_argument("--server", action="append", default=[], help="NAME=HTTP,GRPC,MODEL")
    args = parser.parse_args(argv)
    tiles = check_tiles(args.tile_size)
    want = reference(args, tiles)
    report: dict[str, Any] = {}
    for entry in args.server:
        name, _, where = entry.partition("=")
        http, grpc, model = where.split(",")
        answers = served(http, grpc, model, tiles, args.output)
        report[name] = {p: compare(o, want) for p, o in answers.items()}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
