"""The bad-input corpus for V2 REST with the binary tensor extension (raw bytes after a
JSON header). See :mod:`tests.reliability.corpus` for the row format and the builders.
"""

from __future__ import annotations

import numpy as np

from harness.tiles import random_tiles
from tests.reliability.corpus import (
    GENES,
    HttpCase,
    binary,
    counts,
    good,
    png_raw,
    raw_header,
    truncated,
)


def _tile_bytes() -> bytes:
    return random_tiles(1, seed=9).tobytes()


def _fp32(*rows: list[float]) -> bytes:
    return np.asarray(rows, np.float32).tobytes()


BINARY_CASES = [
    HttpCase(
        "bin-header-length-not-a-number",
        "v2",
        lambda: raw_header({"inputs": []}, length="12abc"),
        ("Inference-Header-Content-Length", "not an integer"),
    ),
    *(
        HttpCase(
            f"bin-header-length-{name}",
            "v2",
            lambda value=value: raw_header({"inputs": []}, length=value),
            ("Inference-Header-Content-Length",),
        )
        for name, value in (
            ("superscript-two", "\u00b2".encode("latin-1")),  # isdigit() true, int() raises
            ("one-cubed", "1\u00b3".encode("latin-1")),
            ("negative", b"-5"),
            ("ten-thousand-digits", b"9" * 10_000),
            ("empty", b""),
            ("utf-8-bytes", "\u2081".encode()),
        )
    ),
    HttpCase(
        "bin-header-length-past-the-body",
        "v2",
        lambda: raw_header({"inputs": []}, length="99999"),
        ("Inference-Header-Content-Length", "outside the body"),
    ),
    HttpCase(
        "bin-header-not-json",
        "v2",
        lambda: (b"\xff\xfe not json", {"Inference-Header-Content-Length": "6"}),
        ("JSON header", "not valid JSON"),
    ),
    HttpCase(
        "bin-header-not-an-object", "v2", lambda: raw_header([1, 2]), ("JSON header", "object")
    ),
    HttpCase(
        "bin-size-overruns-the-body",
        "v2",
        lambda: raw_header(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "datatype": "UINT8",
                        "shape": [1, 224, 224, 3],
                        "parameters": {"binary_data_size": 150528},
                    }
                ]
            },
            b"\x00" * 100,
        ),
        ("'pixels'", "overruns"),
    ),
    HttpCase(
        "bin-sizes-leave-bytes-over",
        "v2",
        lambda: raw_header(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "datatype": "UINT8",
                        "shape": [1, 1, 1, 3],
                        "parameters": {"binary_data_size": 3},
                    }
                ]
            },
            b"\x00" * 10,
        ),
        ("binary_data_size", "sum to 3 bytes", "10"),
    ),
    HttpCase(
        "bin-pixels-short",
        "v2",
        lambda: binary([("pixels", "UINT8", [1, 224, 224, 3], _tile_bytes()[:-3])]),
        ("'pixels'", "needs 150528 bytes", "150525"),
    ),
    HttpCase(
        "bin-length-prefix-overruns",
        "v2",
        lambda: binary([("tiles", "BYTES", [1], b"\xff\x00\x00\x00abc")]),
        ("'tiles'", "length 255 overruns"),
    ),
    HttpCase(
        "bin-more-elements-than-shape",
        "v2",
        lambda: binary([("tiles", "BYTES", [1], png_raw(2))]),
        ("'tiles'", "more than the 1 elements"),
    ),
    HttpCase(
        "bin-element-cut-short",
        "v2",
        lambda: binary([("tiles", "BYTES", [2], png_raw(1) + png_raw(1)[:3000])]),
        ("'tiles'", "element 1", "overruns"),
    ),
    HttpCase(
        "bin-raw-truncated-jpeg",
        "v2",
        lambda: binary([("tiles", "BYTES", [1], _prefixed(truncated("JPEG")))]),
        ("'tiles'", "tile 0", "truncated or corrupt JPEG"),
    ),
    HttpCase(
        "bin-data-and-size",
        "v2",
        lambda: raw_header(
            {
                "inputs": [
                    {
                        "name": "tiles",
                        "datatype": "BYTES",
                        "shape": [1],
                        "data": [good()],
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            },
            b"\x00" * 4,
        ),
        ("'tiles'", "both 'data' and 'binary_data_size'"),
    ),
    HttpCase(
        "bin-neither-data-nor-size",
        "v2",
        lambda: raw_header({"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [1]}]}),
        ("'tiles'", "neither 'data' nor"),
    ),
    HttpCase(
        "bin-id-not-a-string",
        "v2",
        lambda: binary([("tiles", "BYTES", [1], png_raw())], id=5),
        ("'id'", "string"),
    ),
    HttpCase(
        "bin-bulk-rna-nan",
        "v2",
        lambda: binary(
            [
                ("pixels", "UINT8", [1, 224, 224, 3], _tile_bytes()),
                ("bulk_rna", "FP32", [1, GENES], _fp32(counts(float("nan")))),
            ]
        ),
        ("'bulk_rna'", "tile 0", "non-finite"),
        model="multimodal",
    ),
    HttpCase(
        "bin-bulk-rna-inf",
        "v2",
        lambda: binary(
            [
                ("pixels", "UINT8", [2, 224, 224, 3], _tile_bytes() * 2),
                ("bulk_rna", "FP32", [2, GENES], _fp32(counts(1.0), counts(float("-inf")))),
            ]
        ),
        ("'bulk_rna'", "tile 1", "non-finite"),
        model="multimodal",
    ),
]


def _prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little") + data
