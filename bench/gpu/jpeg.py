"""The GPU check's JPEG stage: the jpeg transport decoded on the device (nvJPEG) and on the CPU.

* ``decode``: the slide's own 256 px q90 H&E tiles, 196 a call (one
  request of 64 slide-A boxes): nvJPEG's batched decode
  (``torchvision.io.decode_jpeg(device="cuda")``) in tiles/s, against
  libjpeg-turbo on one core (``simplejpeg``, what the server's decode pool
  runs per thread).
* ``compose``: :class:`~predictor.device.jpeg.DeviceJpeg` in process, one
  request of 64 boxes: slide B (224 px boxes, no resize) and slide A (448 px
  boxes, antialiased bicubic to 224) in model tiles/s, decode included.
* ``served``: ViT-B behind the real server, once with ``--jpeg_decode
  device`` and once with ``cpu``: loadgen windows of jpeg-transport requests
  (slide B and slide A, 64 boxes each) in tiles/s; the features of the two
  decodes compared (max abs difference, min cosine); and the CPU decode's
  features against the same pixels sent raw (equal to the bit: the issue's
  promise for the CPU path).

On the dry run (no GPU) the "device" server decodes on the CPU too (it says
so in its metadata) and the decode rows time libjpeg-turbo copied to the CPU
device: the stage's code runs, its figures mean nothing.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.gpu.stages import Context, infer

MODEL = "vit-b-bf16"


def jpeg(ctx: Context) -> dict[str, Any]:
    """The three parts; ``ok`` when the CPU decode equals raw pixels and the device is close."""
    out: dict[str, Any] = {}
    for part, run in (("decode", _decode), ("compose", _compose), ("served", _served)):
        try:
            out[part] = run(ctx)
        except Exception as exc:  # the next part still runs
            out[part] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    served = out["served"]
    out["ok"] = (
        "error" not in served
        and bool(served.get("cpu_equals_pixels"))
        and (served.get("device_vs_cpu_min_cosine", 0.0) > 0.999)
    )
    return out


def _decoder(ctx: Context) -> Any:
    import torch

    from predictor.device.jpeg import host_decoder, nvjpeg_decoder

    device = torch.device(ctx.first)
    decode = nvjpeg_decoder(device) if ctx.device == "cuda" else host_decoder(device)
    if decode is None:
        raise RuntimeError("torchvision's nvJPEG decode is unavailable (see the log)")
    return device, decode


def _rate(work: Any, items: int, seconds: float, sync: Any) -> float:
    """Items/s of ``work`` repeated for about ``seconds`` after two warm-up calls."""
    for _ in range(2):
        work()
    sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        work()
        calls += 1
    sync()
    return calls * items / (time.perf_counter() - start)


def _sync(ctx: Context) -> Any:
    import torch

    return torch.cuda.synchronize if ctx.device == "cuda" else (lambda: None)


def _decode(ctx: Context) -> dict[str, Any]:
    import simplejpeg

    from bench.load.payloads import slide_jpeg_inputs

    streams = list(slide_jpeg_inputs(64, 448)["jpeg_tiles"])
    _, decode = _decoder(ctx)
    seconds = 0.3 if ctx.dry_run else 2.0
    device_rate = _rate(lambda: decode(streams), len(streams), seconds, _sync(ctx))

    def one_core() -> None:
        for s in streams:
            simplejpeg.decode_jpeg(s, colorspace="RGB", fastdct=False, fastupsample=False)

    cpu_rate = _rate(one_core, len(streams), seconds, lambda: None)
    return {
        "slide_tiles_per_call": len(streams),
        "mean_bytes": float(np.mean([len(s) for s in streams])),
        "device_tiles_per_s": device_rate,
        "cpu_one_core_tiles_per_s": cpu_rate,
        "cpu_ms_per_tile": 1000.0 / cpu_rate,
        "device_over_one_core": device_rate / cpu_rate,
    }


def _regions(inputs: dict[str, np.ndarray]) -> list[Any]:
    """The request's boxes as the server's codec reads them (224 px tiles, bicubic)."""
    from predictor.codecs.jpeg_input import jpeg_regions
    from predictor.config import LimitsConfig

    return jpeg_regions(
        list(inputs["jpeg_tiles"]), inputs["jpeg_layout"].astype(np.int64),
        inputs["jpeg_boxes"].astype(np.int64), limits=LimitsConfig(), tile_size=224,
        interpolation="bicubic",
    )  # fmt: skip


def _boxes(n: int, box: int) -> list[Any]:
    from bench.load.payloads import slide_jpeg_inputs
    from predictor.device.jpeg import Box, SlideTiles

    inputs = slide_jpeg_inputs(n, box)
    tiles = SlideTiles(list(inputs["jpeg_tiles"]), inputs["jpeg_layout"].astype(np.int64))
    return [Box(tiles, tuple(int(v) for v in r.box), r.overlaps()) for r in _regions(inputs)]


def _compose(ctx: Context) -> dict[str, Any]:
    from predictor.device.jpeg import DeviceJpeg

    device, decode = _decoder(ctx)
    run = DeviceJpeg(decode, device, 224, "bicubic")
    seconds = 0.3 if ctx.dry_run else 2.0
    out: dict[str, Any] = {}
    for slide, box in (("B", 224), ("A", 448)):
        boxes = _boxes(64, box)
        out[f"slide {slide} tiles_per_s"] = _rate(lambda b=boxes: run(b), 64, seconds, _sync(ctx))
    return out


def _served(ctx: Context) -> dict[str, Any]:
    from bench.gpu.served import window
    from bench.load.payloads import slide_jpeg_inputs
    from bench.servers.launch import start_histoserve, wait_all_ready

    batch = ctx.best.get(MODEL, ctx.batch)
    probes = {"A": slide_jpeg_inputs(16, 448), "B": slide_jpeg_inputs(16, 224)}
    out: dict[str, Any] = {"batch": batch}
    answers: dict[tuple[str, str], np.ndarray] = {}
    for place in ("device", "cpu"):
        server = start_histoserve(
            ctx.require(MODEL), model=MODEL, device=ctx.first, max_batch_size=batch,
            max_latency_ms=2, max_queue_size=4096, workers=2 if ctx.dry_run else 8,
            threads=2 if ctx.dry_run else 4, log_dir=ctx.log_dir,
            extra=("--jpeg_decode", place),
        )  # fmt: skip
        try:
            wait_all_ready({MODEL: server})
            out[f"{place} reports"] = _reported_decode(server)
            for slide, probe in probes.items():
                answers[place, slide] = infer(server, probe, "embedding")["embedding"]
            if place == "cpu":
                same = []
                for slide, probe in probes.items():
                    raw = infer(server, {"pixels": _cpu_pixels(probe)}, "embedding")["embedding"]
                    same.append(np.array_equal(raw, answers["cpu", slide]))
                out["cpu_equals_pixels"] = all(same)
            for protocol, slide in (("v2-slide-jpeg", "B"), ("v2-slide-jpeg-2x", "A")):
                out[f"{place} slide {slide}"] = window(ctx, server, MODEL, protocol)
        finally:
            server.stop()
    cosines = []
    for slide in probes:
        a = answers["device", slide].astype(np.float64)
        b = answers["cpu", slide].astype(np.float64)
        cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        out[f"slide {slide} device_vs_cpu"] = {
            "max_abs_diff": float(np.abs(a - b).max()),
            "min_cosine": float(cosine.min()),
            "mean_cosine": float(cosine.mean()),
        }
        cosines.append(float(cosine.min()))
    out["device_vs_cpu_min_cosine"] = min(cosines)
    return out


def _reported_decode(server: Any) -> str:
    import httpx

    meta = httpx.get(f"{server.base}/v2/models/{server.model_name}/config", timeout=30).json()
    return str(meta.get("jpeg_decode", "unknown"))


def _cpu_pixels(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The pixels the CPU decode composes for each box (libjpeg-turbo, Pillow's bicubic)."""
    return np.stack([r.pixels() for r in _regions(inputs)])
