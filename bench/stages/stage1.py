"""Stage-1 cost: wire parse + decode + validate + transform per tile, per thread and pooled.

Runs histoserve's own code on pre-built binary request bodies:
:func:`predictor.codecs.v2.parse_binary_body`, :func:`decode_v2` and the
model's ``prepare_sample`` (PIL decoding for PNG/JPEG, a view for raw
``pixels``), first in one thread, then spread over a thread pool of
``workers`` exactly as the server does. For comparison it also times what
the naive baseline does per tile: stock KServe's binary decode (it turns the
raw tensor bytes into a Python list of ints, then back into an array) and
float32 normalisation on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench.load.payloads import build_payload, synthetic_tiles
from histoserve.wire import HEADER

FORMATS = {"pixels": "v2-pixels", "png": "v2-png", "jpeg": "v2-jpeg"}


def _model(spec_name: str, workers: int) -> Any:
    from predictor.families import server_model
    from predictor.model.base import ServingOptions
    from predictor.spec import resolve_spec

    options = ServingOptions(preprocess_workers=workers)
    spec = resolve_spec(spec_name)
    return server_model(spec, "unused.pt2", "cpu", options=options)


def _per_tile_us(run: Callable[[], object], n_tiles: int, budget_s: float) -> float:
    """Microseconds per tile of ``run`` (which handles ``n_tiles``), best of repeated runs."""
    run()
    best, spent = float("inf"), 0.0
    while spent < budget_s or best == float("inf"):
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 1e6 * best / n_tiles


def _histoserve_stage1(model: Any, body: bytes, header_len: int, pool: Any, workers: int):
    from predictor.codecs.v2 import decode_v2, parse_binary_body
    from predictor.config import LimitsConfig

    limits = LimitsConfig()

    def prepare(items: Sequence[Any]) -> list[Any]:
        return [model.prepare_sample(item) for item in items]

    def run() -> list[Any]:
        request = parse_binary_body(body, header_len, "bench")
        items = decode_v2(request, spec=model.model_spec, limits=limits).items
        if pool is None or all(item.image_data is None for item in items):
            return prepare(items)  # as the server: raw pixels are not spread over the pool
        size = max(1, -(-len(items) // workers))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        return [s for part in pool.map(prepare, chunks) for s in part]

    return run


def _naive_decode(body: bytes, header_len: int):
    from kserve import InferRequest

    def run() -> np.ndarray:
        return InferRequest.from_bytes(body, header_len, "bench").inputs[0].as_numpy()

    return run


def _naive_normalise(tiles: np.ndarray, mean: np.ndarray, std: np.ndarray):
    def run() -> np.ndarray:
        x = (tiles.astype(np.float32) / 255.0 - mean) / std
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    return run


def measure_stage1(
    spec_name: str, n_tiles: int, workers: int, budget_s: float = 1.0
) -> dict[str, Any]:
    """Per-tile stage-1 cost (µs) for pixels, PNG and JPEG; one thread, then the pool.

    Returns:
        ``{"formats": {fmt: {...}}, "naive_pixels_us": ..., "workers": ...}``.
    """
    model = _model(spec_name, workers)
    spec = model.model_spec
    tiles = synthetic_tiles(n_tiles, spec.tile_size, seed=7)
    out: dict[str, Any] = {"workers": workers, "tiles": n_tiles, "formats": {}}
    with ThreadPoolExecutor(workers) as pool:
        for fmt, protocol in FORMATS.items():
            payload = build_payload(protocol, "bench", tiles)
            header_len = int(payload.headers[HEADER])
            one = _per_tile_us(
                _histoserve_stage1(model, payload.body, header_len, None, 1), n_tiles, budget_s
            )
            many = _per_tile_us(
                _histoserve_stage1(model, payload.body, header_len, pool, workers),
                n_tiles,
                budget_s,
            )
            out["formats"][fmt] = {
                "bytes_per_tile": (len(payload.body) - header_len) / n_tiles,
                "per_thread_us": one,
                "pool_us": many,
                "pool_tiles_per_s": 1e6 / many,
                "pool_speedup": one / many,
            }
        pixels = build_payload("v2-pixels", "bench", tiles)
        mean = np.asarray(spec.mean or (0.0, 0.0, 0.0), dtype=np.float32)
        std = np.asarray(spec.std or (1.0, 1.0, 1.0), dtype=np.float32)
        decode = _naive_decode(pixels.body, int(pixels.headers[HEADER]))
        out["naive_decode_us"] = _per_tile_us(decode, n_tiles, budget_s)
        normalise = _naive_normalise(tiles, mean, std)
        out["naive_normalise_us"] = _per_tile_us(normalise, n_tiles, budget_s)
        out["naive_pixels_us"] = out["naive_decode_us"] + out["naive_normalise_us"]
    return out
