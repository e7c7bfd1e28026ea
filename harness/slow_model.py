"""A served model whose batches take as long as a test asks: a slow device, on demand.

``python -m predictor --model_class harness.slow_model:UniformTilesSlow``
serves the real package; a batch holding a tile whose pixels all equal ``v``
sleeps ``v / 10`` seconds before its forward (a tile of 15s: 1.5 s), so a
test can hold the device while it queues other requests. Random tiles are
never uniform, so they run at the package's own speed. A fake only for what
cannot exist here: a device slow enough to queue behind, on a CPU runner.
"""

from __future__ import annotations

import time

import numpy as np

from predictor import BaseServerModel, ModelRequest, ModelResponse, PreparedSample


class UniformTilesSlow(BaseServerModel):
    """The base model, whose forward first sleeps a tenth of a uniform tile's value in seconds."""

    def forward_batch(
        self,
        samples: list[PreparedSample],
        requests: list[ModelRequest],
        mode: str = "prediction",
    ) -> list[ModelResponse]:
        """Sleeps for the slowest uniform tile of the batch, then the base's forward."""
        delays = [0.0]
        for sample in samples:
            tile = np.asarray(sample.tile)
            if tile.min() == tile.max():
                delays.append(float(tile.flat[0]) / 10.0)
        time.sleep(max(delays))
        return super().forward_batch(samples, requests, mode)
