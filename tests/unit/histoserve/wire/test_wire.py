"""histoserve.wire: the V2 binary writer read back by the server's parser, the reader fed
bodies built by hand (every datatype, JSON and binary) and malformed ones. What a
real server answers is read back in ``tests/integration/test_wire_against_server.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from histoserve import wire
from predictor.codecs.binary import parse_binary_body
from predictor.errors import InvalidInput

NUMERIC = sorted(wire.DATATYPES)


def _response(outputs: list[dict], blobs: list[bytes]) -> tuple[bytes, str]:
    body, headers = wire.binary_body({"model_name": "m", "outputs": outputs}, blobs)
    return body, headers[wire.HEADER]


def _entry(name: str, datatype: str, shape: list[int], size: int | None = None) -> dict:
    entry = {"name": name, "datatype": datatype, "shape": shape}
    if size is not None:
        entry["parameters"] = {"binary_data_size": size}
    return entry


# -- writer: the server's own parser reads what the writer wrote ---------------------------
def test_request_round_trips_through_the_server_parser() -> None:
    pixels = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    rna = np.linspace(0, 1, 10, dtype=np.float32).reshape(2, 5)
    tiles = [b"\x89PNG\x00\xff", b""]
    body, headers = wire.encode_request(
        {"pixels": pixels, "tiles": tiles, "bulk_rna": rna},
        parameters={"mode": "embedding"},
        request_id="r-1",
    )
    request = parse_binary_body(body, headers[wire.HEADER], "m")
    by_name = {i.name: i for i in request.inputs}
    assert [i.name for i in request.inputs] == ["pixels", "tiles", "bulk_rna"]
    got = np.frombuffer(by_name["pixels"]._raw_data, np.uint8).reshape(by_name["pixels"].shape)
    np.testing.assert_array_equal(got, pixels)
    assert by_name["tiles"].data == tiles
    assert by_name["tiles"].datatype == "BYTES" and by_name["tiles"].shape == [2]
    np.testing.assert_array_equal(
        np.frombuffer(by_name["bulk_rna"]._raw_data, np.float32), rna.ravel()
    )
    assert request.parameters == {"mode": "embedding", "binary_data_output": True}
    assert request.id == "r-1"
    assert headers["content-type"] == "application/octet-stream"


def test_named_outputs_ask_for_binary_per_output() -> None:
    body, headers = wire.encode_request(
        {"pixels": np.zeros((1, 2, 2, 3), np.uint8)}, outputs=["embedding", "prediction"]
    )
    header = json.loads(body[: int(headers[wire.HEADER])])
    assert header["outputs"] == [
        {"name": "embedding", "parameters": {"binary_data": True}},
        {"name": "prediction", "parameters": {"binary_data": True}},
    ]
    assert "binary_data_output" not in header["parameters"]
    parsed = parse_binary_body(body, headers[wire.HEADER])
    assert [o.name for o in parsed.request_outputs] == ["embedding", "prediction"]


@pytest.mark.parametrize("datatype", NUMERIC)
def test_every_numeric_dtype_is_named_and_written_little_endian(datatype: str) -> None:
    dtype = wire.DATATYPES[datatype]
    big_endian = np.arange(6).astype(dtype.newbyteorder(">")).reshape(2, 3)
    entry, raw = wire.encode_tensor("x", big_endian)
    assert entry == _entry("x", datatype, [2, 3], 6 * dtype.itemsize)
    np.testing.assert_array_equal(np.frombuffer(raw, dtype).reshape(2, 3), big_endian)


def test_bytes_object_array_keeps_its_shape() -> None:
    items = np.empty((2, 2), dtype=np.object_)
    items[:] = [[b"a", b"bc"], [b"", b"def"]]
    entry, raw = wire.encode_tensor("tiles", items)
    assert entry["datatype"] == "BYTES" and entry["shape"] == [2, 2]
    assert wire.split_length_prefixed(raw, 4) == [b"a", b"bc", b"", b"def"]


def test_non_contiguous_input_is_written_in_logical_order() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    _, raw = wire.encode_tensor("x", base.T)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), base.T.ravel())


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ({}, "at least one input"),
        ({"x": np.zeros(2, np.complex64)}, "complex64"),
        ({"x": np.array(["a"])}, "<U1"),
        ({"tiles": [b"ok", "text"]}, "element 1"),
    ],
)
def test_writer_refuses_what_v2_cannot_carry(inputs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        wire.encode_request(inputs)


# -- reader --------------------------------------------------------------------------------
@pytest.mark.parametrize("datatype", NUMERIC)
def test_reader_decodes_every_numeric_dtype(datatype: str) -> None:
    values = np.arange(12).astype(wire.DATATYPES[datatype]).reshape(3, 4)
    body, length = _response([_entry("out", datatype, [3, 4], values.nbytes)], [values.tobytes()])
    outputs, header = wire.decode_response(body, length)
    assert outputs["out"].dtype == wire.DATATYPES[datatype]
    np.testing.assert_array_equal(outputs["out"], values)
    assert header["model_name"] == "m"


def test_reader_decodes_binary_and_json_outputs_in_one_body() -> None:
    emb = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    mask = np.array([[[0, 1], [1, 0]]], np.uint8)
    names = wire.length_prefixed([b"x", b"yz"])
    outputs = [
        _entry("embedding", "FP32", [2, 3], emb.nbytes),
        {**_entry("prediction", "FP32", [2, 2]), "data": [1.5, 2.5, 3.5, 4.5]},
        _entry("mask", "UINT8", [1, 2, 2], mask.nbytes),
        _entry("names", "BYTES", [2], len(names)),
        {**_entry("labels", "BYTES", [2]), "data": ["a", "b"]},
    ]
    body, length = _response(outputs, [emb.tobytes(), mask.tobytes(), names])
    got, _ = wire.decode_response(body, length)
    np.testing.assert_array_equal(got["embedding"], emb)
    np.testing.assert_array_equal(got["prediction"], np.array([[1.5, 2.5], [3.5, 4.5]], np.float32))
    np.testing.assert_array_equal(got["mask"], mask)
    assert list(got["names"]) == [b"x", b"yz"]
    assert list(got["labels"]) == ["a", "b"]
    assert not got["embedding"].flags.writeable  # a view of the body, not a copy


def test_plain_json_body_needs_no_header_length() -> None:
    body = json.dumps({"outputs": [{**_entry("e", "FP32", [1, 2]), "data": [1, 2]}]}).encode()
    outputs, _ = wire.decode_response(body, None)
    np.testing.assert_array_equal(outputs["e"], np.array([[1, 2]], np.float32))


def _good() -> tuple[bytes, str]:
    data = np.arange(4, dtype=np.float32)
    return _response([_entry("e", "FP32", [2, 2], 16)], [data.tobytes()])


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda b, n: (b[:-1], n), "overruns the body"),
        (lambda b, n: (b + b"\x00", n), "sum to 16 bytes but 17 follow"),
        (lambda b, n: (b, str(len(b) + 1)), "outside the body"),
        (lambda b, n: (b, "0"), "outside the body"),
        (lambda b, n: (b, "12abc"), "not an integer"),
        (lambda b, n: (b, str(int(n) - 1)), "not valid JSON"),
        (lambda b, n: (b"[1, 2]", None), "must be an object"),
        (lambda b, n: (b'{"error": "boom"}', None), "no 'outputs' list"),
    ],
    ids=[
        "short-body",
        "trailing-bytes",
        "length-past-end",
        "length-zero",
        "length-not-int",
        "length-cuts-json",
        "header-not-object",
        "no-outputs",
    ],
)
def test_reader_refuses_malformed_bodies(mutate, needle: str) -> None:
    body, length = mutate(*_good())
    with pytest.raises(ValueError, match=needle):
        wire.decode_response(body, length)


@pytest.mark.parametrize(
    ("entry", "blob", "needle"),
    [
        (_entry("e", "FP32", [2, 2], 12), b"\x00" * 12, "12 bytes for FP32 shape"),
        (_entry("e", "BF16", [2], 4), b"\x00" * 4, "unknown datatype 'BF16'"),
        (_entry("e", "FP32", [-1], 4), b"\x00" * 4, "shape must be a list of sizes"),
        (_entry("e", "BYTES", [2], 6), wire.length_prefixed([b"ab"]), "holds 1 elements"),
        (_entry("e", "BYTES", [1], 5), b"\x09\x00\x00\x00x", "overrun"),
        ({**_entry("e", "FP32", [3]), "data": [1, 2]}, b"", "2 values for shape"),
        (_entry("e", "FP32", [1]), b"", "neither 'data' nor"),
        ({"datatype": "FP32", "shape": [1], "data": [1]}, b"", "no string 'name'"),
    ],
)
def test_reader_refuses_inconsistent_outputs(entry: dict, blob: bytes, needle: str) -> None:
    body, length = _response([entry], [blob])
    with pytest.raises(ValueError, match=needle):
        wire.decode_response(body, length)


def test_split_length_prefixed_refuses_leftovers() -> None:
    with pytest.raises(ValueError, match="2 bytes left after them"):
        wire.split_length_prefixed(wire.length_prefixed([b"a"]) + b"zz", 1)


def test_split_length_prefixed_is_exact_in_both_directions() -> None:
    data = wire.length_prefixed([b"a", b"", b"bc"])
    assert wire.split_length_prefixed(data, 3) == [b"a", b"", b"bc"]
    with pytest.raises(wire.WireError, match="more than the 2 elements"):
        wire.split_length_prefixed(data, 2)
    with pytest.raises(wire.WireError, match=r"shape \[4\] but BYTES data holds 3 elements"):
        wire.split_length_prefixed(data, 4)
    assert wire.split_length_prefixed(b"", 0) == []


# -- the header length: every value a client can send ---------------------------------------
HOSTILE_LENGTHS = {
    "superscript-two": "\u00b2",  # isdigit() is true, int() raises
    "one-cubed": "1\u00b3",
    "negative": "-5",
    "plus-sign": "+5",
    "underscore": "1_0",  # int() takes it
    "exponent": "1e1",
    "ten-thousand-digits": "9" * 10_000,  # int() refuses past 4300 digits
    "empty": "",
    "blank": "  ",
    "arabic-indic-digits": "\u0661\u0662",  # int() takes them
    "latin-1-bytes": b"\xff\xfe".decode("latin-1"),
    "utf-8-bytes-read-as-latin-1": "\u00e9".encode().decode("latin-1"),
    "nul": "1\x00",
    "float": "10.0",
    "past-the-body": "99999",
    "zero": "0",
}


@pytest.mark.parametrize("value", list(HOSTILE_LENGTHS.values()), ids=list(HOSTILE_LENGTHS))
def test_every_hostile_header_length_is_a_wire_error_naming_the_header(value: str) -> None:
    body = b'{"inputs": []}'
    with pytest.raises(wire.WireError, match=wire.HEADER):
        wire.header_length(value, len(body))
    with pytest.raises(InvalidInput, match=wire.HEADER):  # and the server's 400
        parse_binary_body(body, value, "m")


def test_header_length_takes_decimal_text_bytes_ints_and_absence() -> None:
    assert wire.header_length("12", 20) == wire.header_length(b"12", 20) == 12
    assert wire.header_length(" 0012\t", 20) == 12  # optional whitespace, leading zeros
    assert wire.header_length(None, 20) == 20
    assert wire.header_length(20, 20) == 20
    for bad in (True, 2.5, [12]):
        with pytest.raises(wire.WireError, match="must be an integer"):
            wire.header_length(bad, 20)
    with pytest.raises(wire.WireError, match="body is empty"):
        wire.header_length("1", 0)
