"""The bad-input corpus for REST: V1, V2 JSON and V2 binary, one malformed request per row.

Each row names the request, where it goes (``v1``/``v2`` on the ``embedding``
or ``multimodal`` server), a builder for its body, the status the contract
gives it and words its error message must contain (the input, the tile, the
reason). Bodies are built on first use: the images and limits make some of
them large. A builder returns a JSON-able object (sent as JSON), ``bytes``
(sent as JSON text, malformed on purpose) or ``(bytes, headers)`` (a binary
body with its own headers).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from harness.tiles import b64, random_tiles
from histoserve.wire import binary_body, length_prefixed, tensor_entry
from tests.reliability.load import MAX_BODY_BYTES, MAX_TILES

GENES = 64  # the demo m-optimus package's genes_in


@dataclass(frozen=True)
class HttpCase:
    """One malformed REST request and what the server must answer."""

    name: str
    route: str
    build: Callable[[], Any]
    words: tuple[str, ...]
    status: int = 400
    model: str = "embedding"
    chunked: bool = False


# -- images --------------------------------------------------------------------------------
def encode(array: np.ndarray, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kwargs)
    return buf.getvalue()


@functools.cache
def image(fmt: str) -> bytes:
    """A valid 224x224 noise tile in ``fmt`` (PNG, JPEG, TIFF, GIF, BMP)."""
    return encode(random_tiles(1, seed=7)[0], fmt)


def truncated(fmt: str) -> bytes:
    data = image(fmt)
    return data[: len(data) // 2]


def corrupt_png() -> bytes:
    """A PNG whose compressed pixel stream is replaced by noise (headers intact)."""
    data = image("PNG")
    at = data.index(b"IDAT") + 4
    noise = np.random.default_rng(3).integers(0, 256, 256, dtype=np.uint8).tobytes()
    return data[:at] + noise + data[at + 256 :]


@functools.cache
def bomb(fmt: str) -> bytes:
    """A small file that decodes to 4000x4000x3 (48 MB): a decompression bomb."""
    kwargs = {"compression": "tiff_deflate"} if fmt == "TIFF" else {}
    return encode(np.zeros((4000, 4000, 3), np.uint8), fmt, **kwargs)


# -- request pieces -----------------------------------------------------------------------
def good() -> str:
    return b64(image("PNG"))


def tiles(*data: Any, shape: list[int] | None = None, datatype: str = "BYTES") -> dict:
    return {
        "name": "tiles",
        "datatype": datatype,
        "shape": shape or [len(data)],
        "data": list(data),
    }


def pixels(shape: list[int], data: list[Any], datatype: str = "UINT8") -> dict:
    return {"name": "pixels", "datatype": datatype, "shape": shape, "data": data}


def bulk(rows: list[list[float]], shape: list[int] | None = None, datatype: str = "FP32") -> dict:
    shape = shape or [len(rows), len(rows[0]) if rows else 0]
    return {"name": "bulk_rna", "datatype": datatype, "shape": shape, "data": rows}


def v2(*inputs: dict, **extra: Any) -> dict:
    return {"inputs": list(inputs), **extra}


def v1(*instances: Any, **extra: Any) -> dict:
    return {"instances": list(instances), **extra}


def one_pixel_tile(value: int = 0) -> dict:
    return pixels([1, 224, 224, 3], [value] * (224 * 224 * 3))


def binary(inputs: list[tuple[str, str, list[int], bytes]], **extra: Any) -> tuple[bytes, dict]:
    header = {"inputs": [tensor_entry(n, d, s, len(b)) for n, d, s, b in inputs], **extra}
    return binary_body(header, [b for *_, b in inputs])


def raw_header(
    header: Any, tail: bytes = b"", length: str | bytes | None = None
) -> tuple[bytes, dict]:
    """A body with ``header`` as its JSON header; ``length`` the header value sent as is."""
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)) if length is None else length}
    return head + tail, headers | {"content-type": "application/octet-stream"}


def counts(value: float, n: int = GENES) -> list[float]:
    row = [5.0] * n
    row[3] = value
    return row


def png_raw(n: int = 1) -> bytes:
    return length_prefixed([image("PNG")] * n)


# -- the corpus ----------------------------------------------------------------------------
V1_CASES = [
    HttpCase(
        "v1-malformed-json", "v1", lambda: b'{"instances": [', ("request format", "unexpected end")
    ),
    HttpCase("v1-not-an-object", "v1", lambda: [1, 2], ("JSON object", "instances")),
    HttpCase("v1-no-instances", "v1", lambda: {"inputs": []}, ("instances",)),
    HttpCase("v1-instances-not-a-list", "v1", lambda: {"instances": {}}, ("instances", "list")),
    HttpCase("v1-empty-batch", "v1", lambda: v1(), ("instances", "empty")),
    HttpCase("v1-instance-not-an-object", "v1", lambda: v1(7), ("instances[0]", "object")),
    HttpCase("v1-missing-image-data", "v1", lambda: v1({"x": 1}), ("instances[0].image_data",)),
    HttpCase(
        "v1-unknown-field",
        "v1",
        lambda: v1({"image_data": good(), "imagedata": good()}),
        ("instances[0].imagedata", "unknown field"),
    ),
    HttpCase(
        "v1-wrong-base64",
        "v1",
        lambda: v1({"image_data": good()}, {"image_data": "%%%not base64"}),
        ("instances[1].image_data", "base64"),
    ),
    HttpCase(
        "v1-image-data-not-a-string",
        "v1",
        lambda: v1({"image_data": 12345}),
        ("instances[0].image_data", "base64 string"),
    ),
    HttpCase(
        "v1-truncated-png",
        "v1",
        lambda: v1({"image_data": b64(truncated("PNG"))}),
        ("image_data", "tile 0", "truncated"),
    ),
    HttpCase(
        "v1-png-bomb", "v1", lambda: v1({"image_data": b64(bomb("PNG"))}), ("4000x4000", "limit")
    ),
    HttpCase(
        "v1-too-many-tiles",
        "v1",
        lambda: v1(*[{"image_data": good()}] * (MAX_TILES + 1)),
        (f"{MAX_TILES + 1} instances", "limit"),
    ),
    HttpCase(
        "v1-wrong-tile-size",
        "v1",
        lambda: v1({"image_data": b64(encode(random_tiles(1, 100, 1)[0], "PNG"))}),
        ("tile 0", "224x224", "(100, 100, 3)"),
    ),
    HttpCase(
        "v1-bulk-rna-on-image-model",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": [1.0, 2.0]}),
        ("instances[0].bulk_rna", "takes no bulk RNA"),
    ),
    HttpCase(
        "v1-unknown-mode",
        "v1",
        lambda: v1({"image_data": good()}, parameters={"mode": "segment"}),
        ("mode", "segment"),
    ),
    HttpCase(
        "v1-parameters-not-an-object",
        "v1",
        lambda: v1({"image_data": good()}, parameters=[1]),
        ("parameters", "object"),
    ),
    HttpCase(
        "v1-oversize-body",
        "v1",
        lambda: v1({"image_data": "A" * MAX_BODY_BYTES}),
        ("request body", "exceeds the limit"),
        status=413,
    ),
    HttpCase(
        "v1-bulk-rna-inf",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": counts(1e39)}),
        ("instances[0].bulk_rna", "not a finite FP32"),
        model="multimodal",
    ),
    HttpCase(
        "v1-bulk-rna-negative",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": counts(-2.0)}),
        ("bulk_rna", "tile 0", "negative"),
        model="multimodal",
    ),
    HttpCase(
        "v1-bulk-rna-wrong-gene-count",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": [1.0] * (GENES - 1)}),
        ("bulk_rna", "tile 0", f"expected {GENES} gene counts"),
        model="multimodal",
    ),
    HttpCase(
        "v1-bulk-rna-too-long",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": [0] * 100_001}),
        ("bulk_rna", "100001 values", "limit"),
        model="multimodal",
    ),
    HttpCase(
        "v1-bulk-rna-nested",
        "v1",
        lambda: v1({"image_data": good(), "bulk_rna": [[1.0, 2.0]]}),
        ("bulk_rna", "flat list of numbers"),
        model="multimodal",
    ),
]
