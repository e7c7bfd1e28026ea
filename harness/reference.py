"""Numerical truth for tests: the vendor's preprocessing and the package run in-process.

Done independently of the server's own code, so a server that normalises or
batches wrongly cannot agree with it by construction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

MEAN = np.array([0.707223, 0.578729, 0.703617], dtype=np.float32)
STD = np.array([0.211883, 0.230117, 0.177517], dtype=np.float32)
"""The tile encoders' normalisation (H0-mini, H-optimus-0/1 model cards)."""


def normalise_reference(
    tiles: np.ndarray, mean: np.ndarray | None = MEAN, std: np.ndarray | None = STD
) -> torch.Tensor:
    """The vendor's preprocessing: /255, then (x - mean) / std, as contiguous NCHW float32."""
    x = tiles.astype(np.float32) / 255.0
    if mean is not None:
        x = (x - mean) / std
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


class Reference:
    """The package itself, run in this process.

    Args:
        package_path: The ``.pt2`` file.
    """

    def __init__(self, package_path: Path):
        self.runner = torch._inductor.aoti_load_package(str(package_path))

    def __call__(self, *inputs: torch.Tensor) -> list[np.ndarray]:
        """Every output of the package for ``inputs``, as float32 numpy arrays."""
        with torch.inference_mode():
            out = self.runner(*inputs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [o.float().numpy() for o in outs]
