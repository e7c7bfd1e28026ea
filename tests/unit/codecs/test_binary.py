"""parse_binary_body against bodies built by tritonclient's own HTTP client encoder."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from hypothesis import given, settings
from hypothesis import strategies as st
from kserve.protocol.infer_type import InferRequest

from predictor.codecs.binary import parse_binary_body
from predictor.codecs.samples import ModelResponse
from predictor.codecs.v2 import decode_v2, encode_v2
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.spec import BUILTIN_SPECS


def triton_body(inputs, outputs=None, **kwargs) -> tuple[bytes, int | None]:
    """The exact body and header length tritonclient's HTTP client would send."""
    return triton.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kwargs)


def triton_input(name, array, datatype, *, binary=True) -> triton.InferInput:
    infer_input = triton.InferInput(name, list(array.shape), datatype)
    infer_input.set_data_from_numpy(array, binary_data=binary)
    return infer_input


@pytest.fixture
def png_tiles(encode) -> list[bytes]:
    rng = np.random.default_rng(3)
    return [encode(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "PNG") for _ in range(3)]


def test_raw_png_tiles_stay_bytes(png_tiles, multimodal_spec, limits):
    assert any(b >= 0x80 for b in png_tiles[0])  # not UTF-8 text: stock KServe fails here
    rna = np.arange(15, dtype=np.float32).reshape(3, 5)
    body, length = triton_body(
        [
            triton_input("tiles", np.array(png_tiles, dtype=object), "BYTES"),
            triton_input("bulk_rna", rna, "FP32"),
        ],
        outputs=[triton.InferRequestedOutput("prediction", binary_data=True)],
        request_id="req-1",
        parameters={"mode": "prediction"},
    )
    request = parse_binary_body(body, length, "m-optimus")
    assert isinstance(request, InferRequest) and request.model_name == "m-optimus"
    assert request.inputs[0].data == png_tiles
    decoded = decode_v2(request, spec=multimodal_spec, limits=limits)
    assert [item.image_data for item in decoded.items] == png_tiles
    for i, item in enumerate(decoded.items):
        np.testing.assert_array_equal(item.family_input, rna[i])
    assert decoded.mode == "prediction" and decoded.request_id == "req-1"
    assert decoded.requested_outputs == ("prediction",)
    assert decoded.output_binary == {"prediction": True}


def test_stock_kserve_parser_cannot_read_raw_png(png_tiles):
    body, length = triton_body([triton_input("tiles", np.array(png_tiles, dtype=object), "BYTES")])
    with pytest.raises(Exception):  # noqa: B017 - documents why parse_binary_body exists
        InferRequest.from_bytes(body, length, "m")


def test_binary_pixels_are_zero_copy_views_of_the_body(encoder_spec, limits):
    pixels = np.random.default_rng(4).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    body, length = triton_body([triton_input("pixels", pixels, "UINT8")])
    request = parse_binary_body(body, str(length), "h0-mini")
    decoded = decode_v2(request, spec=encoder_spec, limits=limits)
    whole = np.frombuffer(body, np.uint8)
    for i, item in enumerate(decoded.items):
        np.testing.assert_array_equal(item.pixels, pixels[i])
        assert np.shares_memory(item.pixels, whole)
    assert decoded.binary_output is True  # tritonclient asks for binary when naming no outputs
    assert decoded.tile_input == "pixels"


def test_mixed_json_and_binary_inputs(png_tiles, multimodal_spec, limits):
    rna = np.ones((3, 4), np.float32)
    body, length = triton_body(
        [
            triton_input("tiles", np.array(png_tiles, dtype=object), "BYTES"),
            triton_input("bulk_rna", rna, "FP32", binary=False),
        ]
    )
    decoded = decode_v2(parse_binary_body(body, length), spec=multimodal_spec, limits=limits)
    assert decoded.items[2].family_input.tolist() == [1.0] * 4


def test_pure_json_body_without_header_length(encoder_spec, limits):
    pixels = np.zeros((1, 2, 2, 3), np.uint8)
    body, length = triton_body([triton_input("pixels", pixels, "UINT8", binary=False)])
    assert length is None
    decoded = decode_v2(parse_binary_body(body, None), spec=encoder_spec, limits=limits)
    np.testing.assert_array_equal(decoded.items[0].pixels, pixels[0])
    decoded = decode_v2(parse_binary_body(body, len(body)), spec=encoder_spec, limits=limits)
    assert len(decoded.items) == 1


def test_binary_response_reads_back_with_tritonclient(encoder_spec, limits):
    body, length = triton_body([triton_input("pixels", np.zeros((2, 2, 2, 3), np.uint8), "UINT8")])
    decoded = decode_v2(parse_binary_body(body, length), spec=encoder_spec, limits=limits)
    embeddings = np.random.default_rng(5).standard_normal((2, 7)).astype(np.float32)
    response = encode_v2(
        [ModelResponse(outputs={"embedding": row}) for row in embeddings],
        model_name="h0-mini",
        output_names=["embedding"],
        decoded=decoded,
        datatypes={"embedding": "FP32"},
    )
    wire, header_length = response.to_rest()
    assert isinstance(wire, bytes) and header_length is not None
    result = triton.InferenceServerClient.parse_response_body(wire, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("embedding"), embeddings)


# --- refusals ---------------------------------------------------------------


def header(inputs, **extra) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def refused(body: bytes, length, match: str) -> InvalidInput:
    with pytest.raises(InvalidInput, match=match) as info:
        parse_binary_body(body, length, "m")
    return info.value


UINT8_IN = {
    "name": "pixels",
    "shape": [1, 1, 1, 3],
    "datatype": "UINT8",
    "parameters": {"binary_data_size": 3},
}


def test_header_length_must_lie_inside_the_body():
    head = header([UINT8_IN])
    body = head + b"abc"
    refused(body, len(body) + 1, "outside the body")
    refused(body, 0, "outside the body")
    refused(body, -3, "outside the body")
    refused(body, "twelve", "not an integer")
    refused(body, 2.5, "must be an integer")
    refused(b"", None, "body is empty")


def test_bad_json_header():
    refused(b"{not json" + b"abc", 9, "not valid JSON")
    refused(b"[1, 2]", 6, "must be an object")
    refused(b'{"id": "x"}', None, "'inputs' must be a list of objects")
    refused(b'{"inputs": [1]}', None, "'inputs' must be a list of objects")


def test_binary_data_size_required_and_consistent():
    no_size = {"name": "pixels", "shape": [1], "datatype": "UINT8"}
    refused(
        header([no_size]) + b"a", len(header([no_size])), "input 'pixels': has neither 'data' nor"
    )
    both = {**UINT8_IN, "data": [1, 2, 3]}
    refused(header([both]), None, "both 'data' and 'binary_data_size'")
    for size in (-1, True, "3", 1.5):
        bad = {**UINT8_IN, "parameters": {"binary_data_size": size}}
        refused(
            header([bad]) + b"abc", len(header([bad])), "binary_data_size must be a non-negative"
        )


def test_sizes_must_sum_to_the_body():
    head = header([UINT8_IN])
    refused(head + b"ab", len(head), "overruns the body")
    refused(head + b"abcd", len(head), "sum to 3 bytes but 4 follow")


def test_bytes_length_prefixes_must_fit():
    def bytes_body(raw: bytes, count: int = 1) -> tuple[bytes, int]:
        spec = {
            "name": "tiles",
            "shape": [count],
            "datatype": "BYTES",
            "parameters": {"binary_data_size": len(raw)},
        }
        head = header([spec])
        return head + raw, len(head)

    refused(
        *bytes_body(struct.pack("<I", 10) + b"short"),
        "input 'tiles': BYTES element 0: length 10 overruns",
    )
    refused(
        *bytes_body(struct.pack("<I", 1) + b"x" + b"\x01\x00", 2),
        "BYTES element 1: length prefix cut short",
    )
    refused(*bytes_body(struct.pack("<I", 0) * 2), "more than the 1 elements")


def test_bad_input_fields_are_named():
    refused(
        header([{"shape": [1], "datatype": "UINT8", "data": [1]}]),
        None,
        r"inputs\[0\] needs a non-empty string 'name'",
    )
    refused(
        header([{"name": "pixels", "shape": [1], "datatype": "UINT3", "data": [1]}]),
        None,
        "input 'pixels': unknown datatype",
    )
    refused(
        header([{"name": "pixels", "shape": "1", "datatype": "UINT8", "data": [1]}]),
        None,
        "input 'pixels': shape must be a list",
    )
    refused(
        header([{"name": "pixels", "shape": [-1], "datatype": "UINT8", "data": [1]}]),
        None,
        "negative dimension",
    )
    refused(
        header([{"name": "pixels", "shape": [1], "datatype": "UINT8", "data": 1}]),
        None,
        "'data' must be a list",
    )
    refused(header([{**UINT8_IN, "parameters": [1]}]), None, "parameters' must be an object")


def test_bad_request_fields_are_named():
    ok = {"name": "pixels", "shape": [1], "datatype": "UINT8", "data": [1]}
    refused(header([ok], id=5), None, "'id' must be a string")
    refused(header([ok], parameters=[1]), None, "request 'parameters' must be an object")
    refused(header([ok], outputs={"name": "x"}), None, "'outputs' must be a list of objects")
    refused(header([ok], outputs=[{"name": ""}]), None, r"outputs\[0\] needs a non-empty string")


# --- property: nothing but InvalidInput escapes ------------------------------


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=512), length=st.one_of(st.none(), st.integers(-5, 600)))
def test_random_bodies_only_raise_invalid_input(body, length):
    with contextlib.suppress(InvalidInput):
        parse_binary_body(body, length, "m")


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_input_headers = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["tiles", "pixels", "bulk_rna", ""]) | _json_values,
        "shape": st.lists(st.integers(-2, 4), max_size=4) | _json_values,
        "datatype": st.sampled_from(["BYTES", "UINT8", "FP32", "INT64"]) | _json_values,
        "parameters": st.fixed_dictionaries(
            {"binary_data_size": st.integers(-2, 40) | _json_values}
        )
        | _json_values,
        "data": st.lists(st.integers(-2, 300) | st.text(max_size=6), max_size=6) | _json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(
    inputs=st.lists(_input_headers, max_size=3) | _json_values,
    tail=st.binary(max_size=64),
    extra=st.dictionaries(
        st.sampled_from(["id", "parameters", "outputs"]), _json_values, max_size=3
    ),
)
def test_structured_fuzz_only_raises_invalid_input(inputs, tail, extra):
    head = orjson.dumps({"inputs": inputs, **extra})
    try:
        request = parse_binary_body(head + tail, len(head), "m")
        decode_v2(request, spec=BUILTIN_SPECS["m-optimus"], limits=LimitsConfig())
    except InvalidInput:
        pass


def test_bodies_are_not_limited_to_bytes(encoder_spec):
    head = header([UINT8_IN])
    request = parse_binary_body(bytearray(head + b"\x01\x02\x03"), len(head))
    decoded = decode_v2(request, spec=encoder_spec, limits=LimitsConfig())
    assert decoded.items[0].pixels.tolist() == [[[1, 2, 3]]]
    refused_value = pytest.raises(InvalidInput, match="must be bytes")
    with refused_value:
        parse_binary_body("text body", 3)
