"""decode_v2 over each way a request reaches KServe: REST JSON, gRPC, in process.

The gRPC requests come from tritonclient.grpc in a subprocess (see the
``triton_grpc`` fixture: it cannot share a process with kserve).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
from kserve.protocol.rest.v2_datamodels import InferenceRequest

from predictor.codecs.v2 import decode_v2
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.spec import BUILTIN_SPECS

ENCODER = BUILTIN_SPECS["h0-mini"]
MULTI = BUILTIN_SPECS["m-optimus"]


def json_request(inputs, **extra) -> InferRequest:
    """Exactly what KServe's REST V2 endpoint builds from a JSON body."""
    body = InferenceRequest.model_validate({"inputs": inputs, **extra})
    return InferRequest.from_inference_request(body, "m")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def tiles(encode) -> list[bytes]:
    rng = np.random.default_rng(7)
    return [encode(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "PNG") for _ in range(3)]


# --- REST JSON --------------------------------------------------------------


def test_json_tiles_are_base64_decoded(tiles, limits):
    request = json_request(
        [{"name": "tiles", "shape": [3], "datatype": "BYTES", "data": [b64(t) for t in tiles]}],
        id="abc",
        parameters={"mode": "embedding", "priority": 3},
    )
    decoded = decode_v2(request, spec=ENCODER, limits=limits)
    assert [item.image_data for item in decoded.items] == tiles
    assert [item.index for item in decoded.items] == [0, 1, 2]
    assert (decoded.mode, decoded.tile_input) == ("embedding", "tiles")
    assert decoded.request_id == "abc"
    assert decoded.binary_output is False and decoded.requested_outputs is None


@pytest.mark.parametrize("nested", [True, False])
def test_json_pixels_nested_or_flat(nested, limits):
    pixels = np.random.default_rng(8).integers(0, 256, (2, 3, 4, 3), dtype=np.uint8)
    data = pixels.tolist() if nested else pixels.reshape(-1).tolist()
    request = json_request(
        [{"name": "pixels", "shape": [2, 3, 4, 3], "datatype": "UINT8", "data": data}]
    )
    decoded = decode_v2(request, spec=ENCODER, limits=limits)
    assert decoded.tile_input == "pixels"
    for i, item in enumerate(decoded.items):
        assert item.pixels.dtype == np.uint8
        np.testing.assert_array_equal(item.pixels, pixels[i])
    assert np.shares_memory(decoded.items[0].pixels, decoded.items[1].pixels.base)


def test_json_bulk_rna_rows_follow_tiles(tiles, limits):
    rna = [[float(i + g) for g in range(5)] for i in range(3)]
    request = json_request(
        [
            {"name": "tiles", "shape": [3], "datatype": "BYTES", "data": [b64(t) for t in tiles]},
            {"name": "bulk_rna", "shape": [3, 5], "datatype": "FP32", "data": rna},
        ],
        outputs=[
            {"name": "prediction", "parameters": {"binary_data": True}},
            {"name": "embedding"},
        ],
        parameters={"binary_data_output": False},
    )
    decoded = decode_v2(request, spec=MULTI, limits=limits)
    for i, item in enumerate(decoded.items):
        assert item.family_input.dtype == np.float32 and item.family_input.tolist() == rna[i]
    assert decoded.requested_outputs == ("prediction", "embedding")
    assert decoded.output_binary == {"prediction": True}


# --- gRPC -------------------------------------------------------------------

_GRPC_CLIENT = """
    import base64, json, sys
    import numpy as np
    import tritonclient.grpc as tg
    from tritonclient.grpc._utils import _get_inference_request

    tiles = [base64.b64decode(t) for t in json.loads(sys.stdin.read())]
    t = tg.InferInput("tiles", [len(tiles)], "BYTES")
    t.set_data_from_numpy(np.array(tiles, dtype=object))
    r = tg.InferInput("bulk_rna", [len(tiles), 4], "FP32")
    r.set_data_from_numpy(np.arange(4 * len(tiles), dtype=np.float32).reshape(-1, 4))
    p = tg.InferInput("pixels", [2, 3, 3, 3], "UINT8")
    p.set_data_from_numpy(np.arange(54, dtype=np.uint8).reshape(2, 3, 3, 3))
    common = dict(model_version="", sequence_id=0, sequence_start=False,
                  sequence_end=False, priority=0, timeout=None)
    a = _get_inference_request(model_name="m", inputs=[t, r], request_id="g1",
        outputs=[tg.InferRequestedOutput("prediction")], parameters={"mode": "prediction"}, **common)
    b = _get_inference_request(model_name="m", inputs=[p], request_id="",
        outputs=None, parameters=None, **common)
    print(json.dumps([base64.b64encode(m.SerializeToString()).decode() for m in (a, b)]))
"""


@pytest.fixture(scope="module")
def grpc_requests(triton_grpc) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(9)
    import io

    from PIL import Image

    tiles = []
    for _ in range(2):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buffer, "PNG")
        tiles.append(buffer.getvalue())
    out = triton_grpc(_GRPC_CLIENT, json.dumps([b64(t) for t in tiles]))
    return tiles, [base64.b64decode(m) for m in json.loads(out)]


def test_grpc_raw_contents_from_tritonclient(grpc_requests, limits):
    tiles, (with_tiles, with_pixels) = grpc_requests
    request = InferRequest.from_grpc(pb.ModelInferRequest.FromString(with_tiles))
    assert request.from_grpc and isinstance(request.inputs[0]._raw_data, bytes)
    decoded = decode_v2(request, spec=MULTI, limits=limits)
    assert [item.image_data for item in decoded.items] == tiles
    assert decoded.items[1].family_input.tolist() == [4.0, 5.0, 6.0, 7.0]
    assert (decoded.mode, decoded.request_id, decoded.requested_outputs) == (
        "prediction",
        "g1",
        ("prediction",),
    )

    request = InferRequest.from_grpc(pb.ModelInferRequest.FromString(with_pixels))
    decoded = decode_v2(request, spec=ENCODER, limits=limits)
    np.testing.assert_array_equal(
        decoded.items[1].pixels, np.arange(27, 54, dtype=np.uint8).reshape(3, 3, 3)
    )
    assert decoded.request_id is None and decoded.mode is None


def grpc_contents_request(tensors, **kwargs) -> InferRequest:
    return InferRequest.from_grpc(pb.ModelInferRequest(model_name="m", inputs=tensors, **kwargs))


def test_grpc_typed_contents(tiles, limits):
    request = grpc_contents_request(
        [
            {
                "name": "tiles",
                "datatype": "BYTES",
                "shape": [3],
                "contents": {"bytes_contents": tiles},
            }
        ],
        parameters={"mode": pb.InferParameter(string_param="embedding")},
    )
    decoded = decode_v2(request, spec=ENCODER, limits=limits)
    assert [item.image_data for item in decoded.items] == tiles
    assert decoded.mode == "embedding"


def test_grpc_uint_contents_out_of_range_is_invalid(limits):
    values = [0] * 2 * 1 * 1 * 3
    values[4] = 300  # tile 1
    request = grpc_contents_request(
        [
            {
                "name": "pixels",
                "datatype": "UINT8",
                "shape": [2, 1, 1, 3],
                "contents": {"uint_contents": values},
            }
        ]
    )
    with pytest.raises(
        InvalidInput, match=r"input 'pixels' tile 1: value 300 at index \[1, 0, 0, 1\]"
    ):
        decode_v2(request, spec=ENCODER, limits=limits)


def test_grpc_mode_must_be_a_string(limits):
    request = grpc_contents_request(
        [
            {
                "name": "pixels",
                "datatype": "UINT8",
                "shape": [1, 1, 1, 3],
                "contents": {"uint_contents": [1, 2, 3]},
            }
        ],
        parameters={"mode": pb.InferParameter(int64_param=3)},
    )
    with pytest.raises(InvalidInput, match="parameter 'mode' must be a string"):
        decode_v2(request, spec=ENCODER, limits=limits)


def test_in_process_numpy_and_raw_inputs(tiles, limits):
    raw_tiles = InferInput("tiles", [3], "BYTES")
    raw_tiles.set_data_from_numpy(
        np.array(tiles, dtype=object), binary_data=True
    )  # length-prefixed
    decoded = decode_v2(InferRequest("m", [raw_tiles]), spec=ENCODER, limits=limits)
    assert [item.image_data for item in decoded.items] == tiles
    pixels = np.zeros((1, 2, 2, 3), np.uint8)
    decoded = decode_v2(
        InferRequest("m", [InferInput("pixels", [1, 2, 2, 3], "UINT8", data=pixels)]),
        spec=ENCODER,
        limits=limits,
    )
    assert decoded.items[0].pixels.base is pixels or np.shares_memory(
        decoded.items[0].pixels, pixels
    )


# --- refusals ---------------------------------------------------------------

PX = {"name": "pixels", "shape": [1, 1, 1, 3], "datatype": "UINT8", "data": [1, 2, 3]}
TILE = {"name": "tiles", "shape": [1], "datatype": "BYTES", "data": ["iVBORw0KGgo="]}
RNA = {"name": "bulk_rna", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}

REFUSALS = [
    # (inputs, extra fields, spec, match, input_name, tile)
    ([{**PX, "name": "pixel"}], {}, ENCODER, "unknown input; inputs are", "pixel", None),
    ([PX, PX], {}, ENCODER, "input given twice", "pixels", None),
    ([PX, RNA], {}, ENCODER, "model 'h0-mini' takes no bulk RNA", "bulk_rna", None),
    ([{**PX, "datatype": "INT32"}], {}, ENCODER, "datatype must be UINT8", "pixels", None),
    ([{**TILE, "datatype": "UINT8"}], {}, ENCODER, "datatype must be BYTES", "tiles", None),
    ([{**RNA, "datatype": "FP64"}, PX], {}, MULTI, "datatype must be FP32", "bulk_rna", None),
    (
        [PX, TILE],
        {},
        ENCODER,
        "exactly one of 'tiles', 'pixels' or 'jpeg_tiles', got both",
        None,
        None,
    ),
    ([RNA], {}, MULTI, "exactly one of 'tiles', 'pixels' or 'jpeg_tiles', got neither", None, None),
    ([{**PX, "shape": [1, 3]}], {}, ENCODER, r"shape must be \[N, H, W, 3\]", "pixels", None),
    ([{**TILE, "shape": [1, 1]}], {}, ENCODER, r"shape must be \[N\]", "tiles", None),
    ([{**PX, "shape": [0, 1, 1, 3], "data": []}], {}, ENCODER, "no tiles: N is 0", "pixels", None),
    ([{**PX, "shape": [1, 1, 1, 4], "data": [1, 2, 3, 4]}], {}, ENCODER, "RGB", "pixels", None),
    ([{**PX, "shape": [1, 1, 0, 3], "data": []}], {}, ENCODER, "RGB", "pixels", None),
    ([{**PX, "shape": [2, 1, 1, 3]}], {}, ENCODER, "holds 6 values, data has 3", "pixels", None),
    ([{**PX, "data": [1, 2, -1]}], {}, ENCODER, r"value -1 .* out of range for UINT8", "pixels", 0),
    (
        [{**PX, "data": [1, 2.5, 3]}],
        {},
        ENCODER,
        "UINT8 needs integers, data has non-integer",
        "pixels",
        None,
    ),
    ([{**PX, "data": [1, "2", 3]}], {}, ENCODER, "non-numeric", "pixels", None),
    ([{**PX, "data": [True, False, True]}], {}, ENCODER, "booleans", "pixels", None),
    ([{**PX, "data": [[1, 2], [3]]}], {}, ENCODER, "not a rectangular list", "pixels", None),
    ([{**PX, "data": [1, None, 3]}], {}, ENCODER, "non-numeric", "pixels", None),
    ([{**PX, "data": [1, 2**70, 3]}], {}, ENCODER, "out-of-range", "pixels", None),
    ([{**TILE, "data": ["not base64!"]}], {}, ENCODER, "invalid base64", "tiles", 0),
    (
        [{**TILE, "shape": [2], "data": ["iVBORw0KGgo=", 5]}],
        {},
        ENCODER,
        "expected image bytes or a base64 string, got int",
        "tiles",
        1,
    ),
    ([{**TILE, "data": [""]}], {}, ENCODER, "empty image data", "tiles", 0),
    ([{**TILE, "shape": [2]}], {}, ENCODER, r"shape \[2\] but data has 1 elements", "tiles", None),
    ([PX, {**RNA, "shape": [2, 1]}], {}, MULTI, "2 rows for 1 tiles", "bulk_rna", None),
    ([PX, {**RNA, "shape": [1, 0], "data": []}], {}, MULTI, "0 genes per tile", "bulk_rna", None),
    ([PX, {**RNA, "data": [1.0, 1e39]}], {}, MULTI, "non-finite", "bulk_rna", 0),
    ([PX, {**RNA, "data": [1.0, "a"]}], {}, MULTI, "FP32 needs numbers", "bulk_rna", None),
    ([PX], {"parameters": {"mode": 3}}, ENCODER, "parameter 'mode' must be a string", None, None),
    (
        [PX],
        {"parameters": {"binary_data_output": "yes"}},
        ENCODER,
        "'binary_data_output' must be a boolean",
        None,
        None,
    ),
    (
        [PX],
        {"outputs": [{"name": "a"}, {"name": "a"}]},
        ENCODER,
        "output 'a' requested twice",
        None,
        None,
    ),
    (
        [PX],
        {"outputs": [{"name": "a", "parameters": {"binary_data": 1}}]},
        ENCODER,
        "requested output 'a': parameter 'binary_data' must be a boolean",
        None,
        None,
    ),
]


@pytest.mark.parametrize(("inputs", "extra", "spec", "match", "input_name", "tile"), REFUSALS)
def test_refusals_name_input_tile_and_reason(inputs, extra, spec, match, input_name, tile):
    with pytest.raises(InvalidInput, match=match) as info:
        decode_v2(json_request(inputs, **extra), spec=spec, limits=LimitsConfig())
    assert (info.value.input_name, info.value.tile) == (input_name, tile)


def test_limits_are_enforced_from_the_shape():
    limits = LimitsConfig(
        max_tiles_per_request=2, max_image_pixels=4, max_bulk_rna_length=1, max_image_bytes=4
    )
    cases = [
        ([{**PX, "shape": [3, 1, 1, 3], "data": [0] * 9}], "3 tiles, more than the limit of 2"),
        ([{**PX, "shape": [1, 1, 5, 3], "data": [0] * 15}], "5x1 = 5 pixels exceed the limit of 4"),
        ([PX, RNA], "2 genes per tile; expected 1..1"),
        (
            [{**TILE, "data": [b64(b"12345")]}],
            "more than the 8 that 4 bytes take|5 bytes, more than",
        ),
    ]
    for inputs, match in cases:
        with pytest.raises(InvalidInput, match=match):
            decode_v2(json_request(inputs), spec=MULTI, limits=limits)


def test_raw_data_size_must_match_shape():
    raw = InferInput("pixels", [1, 2, 2, 3], "UINT8")
    raw._raw_data = bytes(11)
    with pytest.raises(
        InvalidInput, match=r"input 'pixels': shape \[1, 2, 2, 3\] of UINT8 needs 12 bytes, got 11"
    ):
        decode_v2(InferRequest("m", [raw]), spec=ENCODER, limits=LimitsConfig())


def test_non_finite_binary_bulk_rna_names_the_tile():
    rna = np.ones((2, 3), np.float32)
    rna[1, 2] = np.nan
    raw = InferInput("bulk_rna", [2, 3], "FP32")
    raw.set_data_from_numpy(rna, binary_data=True)
    pixels = InferInput("pixels", [2, 1, 1, 3], "UINT8", data=[0] * 6)
    with pytest.raises(InvalidInput, match="input 'bulk_rna' tile 1: non-finite"):
        decode_v2(InferRequest("m", [pixels, raw]), spec=MULTI, limits=LimitsConfig())


def test_no_inputs_is_invalid():
    with pytest.raises(InvalidInput, match="no inputs"):
        decode_v2(InferRequest("m", []), spec=ENCODER, limits=LimitsConfig())


def test_requested_output_objects_from_kserve_are_understood(limits):
    request = InferRequest(
        "m",
        [InferInput("pixels", [1, 1, 1, 3], "UINT8", data=[1, 2, 3])],
        request_outputs=[RequestedOutput("embedding", {"binary_data": True})],
    )
    decoded = decode_v2(request, spec=ENCODER, limits=limits)
    assert decoded.requested_outputs == ("embedding",) and decoded.output_binary == {
        "embedding": True
    }
