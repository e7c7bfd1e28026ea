"""Synthetic tiles and pre-built request bodies for every benchmarked protocol.

Imported by the load-generator process, so it must not import ``kserve`` or
``torch`` (``tritonclient.grpc`` and ``kserve`` register the same protobuf
symbols and cannot share a process): of the package it uses only
:mod:`histoserve.wire` (numpy only), the V2 binary writer and reader every
client shares. Bodies are built once per cell and reused, so the client spends
its CPU on I/O, not on encoding.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from histoserve import wire

REPO = Path(__file__).resolve().parents[2]

PROTOCOLS = ("v2-pixels", "v2-png", "v2-json", "v2-grpc", "v1")
"""Benchmarked protocols: V2 binary REST ``pixels``, V2 binary REST PNG ``tiles``,
V2 JSON with base64 PNG ``tiles``, V2 gRPC ``pixels`` (raw contents), V1 JSON.
:func:`build_payload` also takes ``v2-jpeg`` (stage-1 measurements only), ``v1-jpeg``
(V1 ``image_data`` base64 JPEG, the vendor SDK's form) and ``v2-json-jpeg`` (V2 JSON,
``tiles`` BYTES of base64 JPEG)."""

SLIDE_JPEG_PROTOCOLS = {"v2-slide-jpeg": 1, "v2-slide-jpeg-2x": 2}
"""The jpeg transport (a slide's own JPEG tiles and a box per model tile), by box-to-tile scale:
1 at a matching level (slide B), 2 for a level read at twice the model's resolution (slide A)."""
SLIDE_TILE = 256
"""Edge of the slide's own JPEG tiles in :data:`SLIDE_JPEG_PROTOCOLS` requests."""

JPEG_PROTOCOLS = ("v2-jpeg", "v1-jpeg", "v2-json-jpeg", *SLIDE_JPEG_PROTOCOLS)
"""Protocols whose tiles are real H&E texture (:func:`tiles_for`): JPEG's cost depends on it."""


def tiles_for(protocol: str, n: int, size: int, seed: int = 0) -> np.ndarray:
    """The tiles a ``protocol`` request carries: real H&E crops for JPEG, else synthetic.

    A JPEG of smooth synthetic fields is smaller and faster to decode than
    one of real tissue, so the JPEG protocols send crops of a real H&E tile
    (:func:`he_crops`, quality 90 in :func:`encode`).
    """
    if protocol in JPEG_PROTOCOLS:
        return he_crops(n, size)
    return synthetic_tiles(n, size, seed=seed)


def synthetic_tiles(n: int, size: int, seed: int = 0) -> np.ndarray:
    """``uint8 [n, size, size, 3]`` tissue-like tiles: smooth colour fields plus noise.

    Pure noise is the worst case for PNG (incompressible, slowest to decode);
    H&E tiles are smoother. These compress roughly like real tiles (PNG about
    half the raw size).
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    tiles = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        fx, fy, phase = rng.uniform(1.0, 6.0, 3)
        field = np.sin(2 * np.pi * (fx * xx + phase)) * np.cos(2 * np.pi * fy * yy)
        base = np.array([200.0, 150.0, 190.0]) + 40.0 * field[..., None] * np.array([1, 1.4, 0.8])
        noise = rng.normal(0.0, 8.0, (size, size, 3))
        tiles[i] = np.clip(base + noise, 0, 255).astype(np.uint8)
    return tiles


def he_crops(n: int, size: int = 224) -> np.ndarray:
    """``n`` crops of real H&E (``wsidicom-data``'s 240x240 tile, Apache-2.0), ``uint8 [n, size, size, 3]``.

    The tile is mirrored into a seamless 480x480 block and cropped at
    different offsets, flips and rotations. Read from ``.gpu-wheels/he_tile.png``
    when present (a machine without ``wsidicom-data``; ``make wheelhouse``
    copies it there), else from the installed package.
    """
    local = REPO / ".gpu-wheels" / "he_tile.png"
    if local.is_file():
        with Image.open(local) as image:
            tile = np.asarray(image.convert("RGB"))
    else:
        from harness.slides import he_tile

        tile = he_tile()
    top = np.concatenate([tile, tile[:, ::-1]], axis=1)
    block = np.concatenate([top, top[::-1]], axis=0)
    reps = -(-(size + 32) // block.shape[0])  # seamless, so it tiles for larger crops
    block = np.tile(block, (reps, reps, 1))
    rng = np.random.default_rng(0)
    crops = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        y, x = rng.integers(0, block.shape[0] - size, 2)
        crop = np.rot90(block[y : y + size, x : x + size], k=i % 4)
        crops[i] = crop[:, ::-1] if (i // 4) % 2 else crop
    return crops


def encode(tile: np.ndarray, fmt: str) -> bytes:
    """One tile as ``PNG`` or ``JPEG`` (quality 90) bytes."""
    buf = io.BytesIO()
    Image.fromarray(tile).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


@dataclass(frozen=True)
class Payload:
    """A pre-built request: REST path, body and headers, or a gRPC message."""

    protocol: str
    tiles: int
    path: str
    body: bytes
    headers: dict[str, str]


def build_payload(protocol: str, model: str, tiles: np.ndarray) -> Payload:
    """The request body ``protocol`` sends for ``tiles`` (``uint8 [N, H, W, 3]``).

    Raises:
        ValueError: Unknown protocol.
    """
    n = len(tiles)
    v2_path = f"/v2/models/{model}/infer"
    if protocol == "v2-pixels":
        body, headers = wire.encode_request({"pixels": np.asarray(tiles, np.uint8)})
        return Payload(protocol, n, v2_path, body, headers)
    if protocol in ("v2-png", "v2-jpeg"):
        fmt = "PNG" if protocol == "v2-png" else "JPEG"
        body, headers = wire.encode_request({"tiles": [encode(t, fmt) for t in tiles]})
        return Payload(protocol, n, v2_path, body, headers)
    if protocol == "v2-json":
        data = [base64.b64encode(encode(t, "PNG")).decode() for t in tiles]
        doc = {"inputs": [{"name": "tiles", "shape": [n], "datatype": "BYTES", "data": data}]}
        return Payload(protocol, n, v2_path, json.dumps(doc).encode(), _JSON)
    if protocol == "v2-json-jpeg":
        data = [base64.b64encode(encode(t, "JPEG")).decode() for t in tiles]
        doc = {"inputs": [{"name": "tiles", "shape": [n], "datatype": "BYTES", "data": data}]}
        return Payload(protocol, n, v2_path, json.dumps(doc).encode(), _JSON)
    if protocol in ("v1", "v1-jpeg"):
        fmt = "PNG" if protocol == "v1" else "JPEG"
        instances = [{"image_data": base64.b64encode(encode(t, fmt)).decode()} for t in tiles]
        body = json.dumps({"instances": instances}).encode()
        return Payload(protocol, n, f"/v1/models/{model}:predict", body, _JSON)
    if protocol == "v2-grpc":
        return Payload(protocol, n, "", grpc_request(model, tiles), {})
    if protocol in SLIDE_JPEG_PROTOCOLS:
        inputs = slide_jpeg_inputs(n, tiles.shape[1] * SLIDE_JPEG_PROTOCOLS[protocol])
        body, headers = wire.encode_request(inputs)
        return Payload(protocol, n, v2_path, body, headers)
    raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")


_JSON = {"content-type": "application/json"}


def slide_jpeg_inputs(n: int, box: int) -> dict[str, np.ndarray]:
    """A jpeg-transport request of ``n`` boxes of ``box`` px over one slide region.

    The boxes lie edge to edge in a square grid, as a client's rows of model
    tiles do; the region is real H&E texture cut into :data:`SLIDE_TILE` px
    q90 JPEG tiles, each sent once if some box overlaps it (as the client
    sends them: the server refuses a slide tile under no box).
    """
    side = math.isqrt(n - 1) + 1 if n > 1 else 1
    extent = side * box
    plane = tiles_for("v2-jpeg", 1, extent)[0]
    per_row = -(-extent // SLIDE_TILE)
    boxes = [[(i % side) * box, (i // side) * box, box, box] for i in range(n)]
    streams, layout = [], []
    for ty in range(per_row):
        for tx in range(per_row):
            x, y = tx * SLIDE_TILE, ty * SLIDE_TILE
            if not any(
                bx < x + SLIDE_TILE and x < bx + bw and by < y + SLIDE_TILE and y < by + bh
                for bx, by, bw, bh in boxes
            ):
                continue
            part = plane[y : y + SLIDE_TILE, x : x + SLIDE_TILE]
            streams.append(encode(np.ascontiguousarray(part), "JPEG"))
            layout.append([x, y, part.shape[1], part.shape[0]])
    tiles = np.empty(len(streams), np.object_)
    tiles[:] = streams
    return {
        "jpeg_tiles": tiles,
        "jpeg_layout": np.array(layout, np.int32),
        "jpeg_boxes": np.array(boxes, np.int32),
    }


def grpc_request(model: str, tiles: np.ndarray) -> bytes:
    """A serialised ``ModelInferRequest`` with ``pixels`` in raw input contents.

    Uses tritonclient's generated protobuf module (the load process never
    imports kserve).
    """
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "pixels", "UINT8"
    tensor.shape.extend(tiles.shape)
    request.raw_input_contents.append(np.ascontiguousarray(tiles).tobytes())
    return request.SerializeToString()


def rest_output_rows(body: bytes, headers: dict[str, str]) -> tuple[int, int]:
    """``(rows, width)`` of the first output of a REST response (for validation)."""
    doc, _, _ = wire.read_header(body, headers.get(wire.HEADER.lower(), headers.get(wire.HEADER)))
    if "predictions" in doc:  # V1
        preds = doc["predictions"]
        return len(preds), len(preds[0]["output"])
    shape = doc["outputs"][0]["shape"]
    return int(shape[0]), int(shape[-1])


def grpc_output_rows(message: bytes) -> tuple[int, int]:
    """``(rows, width)`` of the first output of a serialised ``ModelInferResponse``."""
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse.FromString(message)
    shape = list(response.outputs[0].shape)
    return int(shape[0]), int(shape[-1])
