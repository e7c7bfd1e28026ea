"""The bad-input corpus for V2 REST with JSON bodies.

See :mod:`tests.reliability.corpus` for the row format and the builders.
"""

from __future__ import annotations

from tests.reliability.corpus import (
    GENES,
    HttpCase,
    b64,
    bomb,
    bulk,
    corrupt_png,
    counts,
    good,
    image,
    one_pixel_tile,
    pixels,
    tiles,
    truncated,
    v2,
)
from tests.reliability.load import MAX_BODY_BYTES, MAX_TILES

V2_JSON_CASES = [
    HttpCase("v2-malformed-json", "v2", lambda: b'{"inputs": [{"name": ', ("malformed",)),
    HttpCase("v2-no-inputs-field", "v2", lambda: {"outputs": []}, ("inputs",)),
    HttpCase("v2-empty-inputs", "v2", lambda: v2(), ("no inputs",)),
    HttpCase(
        "v2-unknown-input",
        "v2",
        lambda: v2(
            tiles(good()), {"name": "tile", "datatype": "BYTES", "shape": [1], "data": ["x"]}
        ),
        ("'tile'", "unknown input"),
    ),
    HttpCase("v2-input-twice", "v2", lambda: v2(tiles(good()), tiles(good())), ("twice",)),
    HttpCase(
        "v2-tiles-and-pixels",
        "v2",
        lambda: v2(tiles(good()), pixels([1, 1, 1, 3], [0, 0, 0])),
        ("exactly one", "both"),
    ),
    HttpCase(
        "v2-tiles-wrong-datatype",
        "v2",
        lambda: v2(tiles(good(), datatype="INT32")),
        ("'tiles'", "datatype must be BYTES"),
    ),
    HttpCase(
        "v2-pixels-fp32",
        "v2",
        lambda: v2(pixels([1, 1, 1, 3], [0.5] * 3, "FP32")),
        ("'pixels'", "datatype must be UINT8"),
    ),
    HttpCase(
        "v2-unknown-datatype",
        "v2",
        lambda: v2(pixels([1, 1, 1, 3], [1, 2, 3], "UINT9")),
        ("pixels", "UINT9"),
    ),
    HttpCase(
        "v2-shape-size-mismatch",
        "v2",
        lambda: v2(pixels([1, 224, 224, 3], [0] * 10)),
        ("'pixels'", "holds 150528 values", "data has 10"),
    ),
    HttpCase(
        "v2-shape-wrong-rank",
        "v2",
        lambda: v2(pixels([224, 224, 3], [0] * 10)),
        ("'pixels'", "[N, H, W, 3]"),
    ),
    HttpCase("v2-shape-not-integers", "v2", lambda: v2(pixels(["a"], [0])), ("shape", "integer")),
    HttpCase(
        "v2-negative-shape",
        "v2",
        lambda: v2(tiles(good(), shape=[-1])),
        ("'tiles'", "negative dimension"),
    ),
    HttpCase(
        "v2-empty-batch", "v2", lambda: v2(tiles(shape=[0])), ("'tiles'", "no tiles", "N is 0")
    ),
    HttpCase(
        "v2-huge-dimensions",
        "v2",
        lambda: v2(pixels([1, 100_000, 100_000, 3], [0])),
        ("'pixels'", "100000x100000", "limit"),
    ),
    HttpCase(
        "v2-wrong-tile-geometry",
        "v2",
        lambda: v2(pixels([1, 2, 2, 3], [0] * 12)),
        ("'pixels'", "tile 0", "224x224"),
    ),
    HttpCase(
        "v2-uint8-out-of-range",
        "v2",
        lambda: v2(pixels([1, 1, 1, 3], [1, 2, 300])),
        ("'pixels'", "tile 0", "300", "out of range"),
    ),
    HttpCase(
        "v2-uint8-given-floats",
        "v2",
        lambda: v2(pixels([1, 1, 1, 3], [0.5, 1.5, 2.5])),
        ("'pixels'", "needs integers"),
    ),
    HttpCase(
        "v2-data-not-numbers",
        "v2",
        lambda: v2(pixels([1, 1, 1, 3], ["a", "b", "c"])),
        ("'pixels'", "UINT8 needs integers"),
    ),
    HttpCase(
        "v2-wrong-base64",
        "v2",
        lambda: v2(tiles(good(), "data:image/png;base64,AAAA")),
        ("'tiles'", "tile 1", "base64"),
    ),
    HttpCase(
        "v2-tile-not-a-string", "v2", lambda: v2(tiles(good(), 42)), ("'tiles'", "tile 1", "int")
    ),
    HttpCase(
        "v2-truncated-png",
        "v2",
        lambda: v2(tiles(good(), b64(truncated("PNG")))),
        ("'tiles'", "tile 1", "truncated or corrupt PNG"),
    ),
    HttpCase(
        "v2-truncated-jpeg",
        "v2",
        lambda: v2(tiles(b64(truncated("JPEG")))),
        ("'tiles'", "tile 0", "truncated or corrupt JPEG"),
    ),
    HttpCase(
        "v2-truncated-tiff",
        "v2",
        lambda: v2(tiles(b64(truncated("TIFF")))),
        ("'tiles'", "tile 0", "TIFF"),
    ),
    HttpCase(
        "v2-corrupt-png",
        "v2",
        lambda: v2(tiles(b64(corrupt_png()))),
        ("'tiles'", "tile 0", "corrupt PNG"),
    ),
    HttpCase(
        "v2-corrupt-jpeg",
        "v2",
        lambda: v2(tiles(b64(image("JPEG")[:2] + b"\x00" * 64))),
        ("'tiles'", "tile 0", "not a PNG, JPEG, TIFF image"),
    ),
    HttpCase(
        "v2-unsupported-gif",
        "v2",
        lambda: v2(tiles(b64(image("GIF")))),
        ("'tiles'", "tile 0", "not a PNG, JPEG, TIFF image"),
    ),
    HttpCase(
        "v2-png-bomb",
        "v2",
        lambda: v2(tiles(good(), b64(bomb("PNG")))),
        ("'tiles'", "tile 1", "4000x4000", "limit"),
    ),
    HttpCase("v2-jpeg-bomb", "v2", lambda: v2(tiles(b64(bomb("JPEG")))), ("tile 0", "4000x4000")),
    HttpCase("v2-tiff-bomb", "v2", lambda: v2(tiles(b64(bomb("TIFF")))), ("tile 0", "4000x4000")),
    HttpCase(
        "v2-too-many-tiles",
        "v2",
        lambda: v2(tiles(*[good()] * (MAX_TILES + 1))),
        ("'tiles'", f"{MAX_TILES + 1} tiles", "limit"),
    ),
    HttpCase(
        "v2-unknown-mode",
        "v2",
        lambda: v2(tiles(good()), parameters={"mode": "segment"}),
        ("mode", "segment"),
    ),
    HttpCase(
        "v2-mode-not-a-string",
        "v2",
        lambda: v2(tiles(good()), parameters={"mode": 3}),
        ("'mode'", "must be a string"),
    ),
    HttpCase(
        "v2-binary-output-not-a-bool",
        "v2",
        lambda: v2(tiles(good()), parameters={"binary_data_output": "yes"}),
        ("binary_data_output", "boolean"),
    ),
    HttpCase(
        "v2-unknown-output",
        "v2",
        lambda: v2(tiles(good()), outputs=[{"name": "mask"}]),
        ("'mask'", "not produced"),
    ),
    HttpCase(
        "v2-output-twice",
        "v2",
        lambda: v2(tiles(good()), outputs=[{"name": "embedding"}] * 2),
        ("'embedding'", "twice"),
    ),
    HttpCase(
        "v2-bulk-rna-on-image-model",
        "v2",
        lambda: v2(tiles(good()), bulk([[1.0]])),
        ("'bulk_rna'", "takes no bulk RNA"),
    ),
    HttpCase(
        "v2-oversize-body",
        "v2",
        lambda: v2(tiles("A" * MAX_BODY_BYTES)),
        ("request body", "exceeds the limit"),
        status=413,
    ),
    HttpCase(
        "v2-oversize-chunked-body",
        "v2",
        lambda: v2(tiles("A" * MAX_BODY_BYTES)),
        ("streamed request body", "exceeds the limit"),
        status=413,
        chunked=True,
    ),
    HttpCase(
        "v2-bulk-rna-wrong-gene-count",
        "v2",
        lambda: v2(one_pixel_tile(), bulk([[1.0] * (GENES + 1)])),
        ("'bulk_rna'", "tile 0", f"expected {GENES} gene counts"),
        model="multimodal",
    ),
    HttpCase(
        "v2-bulk-rna-rows-mismatch",
        "v2",
        lambda: v2(one_pixel_tile(), bulk([[1.0] * GENES] * 2)),
        ("'bulk_rna'", "2 rows for 1 tiles"),
        model="multimodal",
    ),
    HttpCase(
        "v2-bulk-rna-negative",
        "v2",
        lambda: v2(one_pixel_tile(), bulk([counts(-1.0)])),
        ("'bulk_rna'", "tile 0", "negative"),
        model="multimodal",
    ),
    HttpCase(
        "v2-bulk-rna-too-long",
        "v2",
        lambda: v2(one_pixel_tile(), bulk([[0]], shape=[1, 100_001])),
        ("'bulk_rna'", "100001 genes", "100000"),
        model="multimodal",
    ),
    HttpCase(
        "v2-bulk-rna-int32",
        "v2",
        lambda: v2(one_pixel_tile(), bulk([[1] * GENES], datatype="INT32")),
        ("'bulk_rna'", "datatype must be FP32"),
        model="multimodal",
    ),
]
