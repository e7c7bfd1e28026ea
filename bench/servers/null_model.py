"""A "null" embedding model: the ``h0-mini`` geometry with a forward that costs next to nothing.

``histoserve export --spec h0-mini --module bench.servers.null_model:build`` makes a
package whose forward is a per-tile channel mean and one 3 -> 1536 linear
layer (tens of microseconds per tile), so a server under load spends its
time on serving, not on the model: this is what measures single-tile
requests per second and CPU per request, and what the request path's
figures in ``docs/performance.md`` are taken on.
"""

from __future__ import annotations

import torch
from torch import nn


class NullEmbedder(nn.Module):
    """``[B, 3, H, W]`` -> ``[B, dim]``: channel means through one small linear layer."""

    def __init__(self, dim: int = 1536):
        super().__init__()
        self.proj = nn.Linear(3, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean(dim=(2, 3)))


def build() -> nn.Module:
    """The factory ``--module bench.servers.null_model:build`` calls."""
    return NullEmbedder().eval()
