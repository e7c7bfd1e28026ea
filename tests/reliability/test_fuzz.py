"""Property-based fuzzing of stage 1: ``decode_v2`` over whole requests and ``prepare_sample``.

The codec-level fuzz tests in ``tests/unit/codecs`` cover raw bytes (images, binary
bodies, V1 bodies). These go one level up, where the server really calls them: V2
``InferRequest`` objects as REST builds them, gRPC ``ModelInferRequest`` messages
through kserve's ``from_grpc``, and every family's ``prepare_sample`` on the items.
Only :class:`~predictor.errors.InvalidInput` may escape (and kserve's own
``InvalidInput`` from its gRPC conversion, which it maps to ``INVALID_ARGUMENT``).
The ``Inference-Header-Content-Length`` header is fuzzed as the string it arrives
as, through the server's data plane.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kserve import InferInput, InferRequest
from kserve.errors import InvalidInput as KserveInvalidInput
from kserve.model_repository import ModelRepository
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.servicer import InferenceServicer
from PIL import Image

from histoserve import wire
from predictor.codecs.samples import ModelRequest
from predictor.codecs.v2 import decode_v2, parse_binary_body
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.families import server_model
from predictor.kserve.dataplane import HistoDataPlane
from predictor.model.base import BaseServerModel, ServingOptions
from predictor.spec import BUILTIN_SPECS

pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
EXAMPLES = int(os.environ.get("HISTOSERVE_FUZZ_EXAMPLES", "150"))
LONG_EXAMPLES = int(os.environ.get("HISTOSERVE_FUZZ_LONG_EXAMPLES", "3000"))
LIMITS = LimitsConfig(max_tiles_per_request=8, max_image_pixels=600 * 600, max_bulk_rna_length=64)
GENES = 8
SPECS = ("h0-mini", "m-optimus", "tissue-seg")
FAST = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False
)
LONG = settings(FAST, max_examples=LONG_EXAMPLES)


def _model(spec_name: str) -> BaseServerModel:
    """A model of the spec's family, not loaded: ``prepare_sample`` needs no package."""
    spec = BUILTIN_SPECS[spec_name]
    options = ServingOptions(limits=LIMITS)
    model = server_model(spec, "absent.pt2", device="cpu", options=options)
    if spec.takes_bulk_rna:
        model.family.genes_in = [f"ENSG{i:011d}" for i in range(GENES)]
    return model


MODELS = {name: _model(name) for name in SPECS}


def _encoded(size: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    tile = np.random.default_rng(size).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(tile).save(buf, fmt)
    return buf.getvalue()


IMAGES = [_encoded(s, f) for s in (224, 512, 16) for f in ("PNG", "JPEG", "TIFF")]

# -- strategies ------------------------------------------------------------------------------
scalars = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=32),
    st.booleans(),
    st.none(),
)
elements = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=16)
images = st.sampled_from(IMAGES) | st.binary(max_size=256)
base64_images = images.map(lambda b: __import__("base64").b64encode(b).decode())
datas = st.one_of(
    st.lists(elements, max_size=6),
    st.lists(images, min_size=1, max_size=4),
    st.lists(base64_images, min_size=1, max_size=4),
    st.lists(st.integers(-5, 300), max_size=24),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=24),
    st.none(),
    elements,
)
names = st.sampled_from(["tiles", "pixels", "bulk_rna", "tile", "", "PIXELS"])
datatypes = st.sampled_from(["BYTES", "UINT8", "FP32", "FP16", "INT64", "BOOL", "UINT9", "bytes"])
dims = st.integers(-2, 8) | st.sampled_from([16, 224, 512, 2**31, 2**63 - 1])
shapes = st.lists(dims, max_size=5) | st.sampled_from([[1, 16, 16, 3], [2, 8], [1], [3]])
parameters = st.none() | st.dictionaries(
    st.sampled_from(["mode", "binary_data_output", "priority", "x"]), scalars, max_size=3
)


@st.composite
def infer_inputs(draw: st.DrawFn) -> InferInput:
    inp = InferInput(draw(names), draw(shapes), draw(datatypes), data=draw(datas))
    if draw(st.booleans()):
        inp._raw_data = draw(st.binary(max_size=2048) | st.sampled_from(IMAGES))
    return inp


PIXEL_BYTES = np.random.default_rng(5).integers(0, 256, 2 * 512 * 512 * 3, np.uint8).tobytes()


@st.composite
def coherent_tiles(draw: st.DrawFn, n: int) -> InferInput:
    """A ``tiles`` or ``pixels`` input that is nearly right: sizes off by a little at most."""
    fuzz = st.sampled_from([0, 0, 0, 1, -1])
    if draw(st.booleans()):
        data = draw(st.lists(images, min_size=n, max_size=n))
        if draw(st.booleans()):
            data = [__import__("base64").b64encode(d).decode() for d in data]
        return InferInput("tiles", [n + draw(fuzz)], "BYTES", data=data)
    size = draw(st.sampled_from([16, 224, 512]))
    inp = InferInput("pixels", [n, size, size, 3], "UINT8")
    inp._raw_data = PIXEL_BYTES[: max(0, n * size * size * 3 + draw(fuzz))]
    return inp


@st.composite
def coherent_bulk(draw: st.DrawFn, n: int) -> InferInput:
    genes = GENES + draw(st.sampled_from([0, 0, 1, -1]))
    values = st.floats(-1, 1e6) | st.sampled_from([float("nan"), float("inf"), 0.0, 3.0])
    rows = draw(st.lists(st.lists(values, min_size=genes, max_size=genes), min_size=n, max_size=n))
    inp = InferInput("bulk_rna", [n, genes], "FP32", data=rows)
    if draw(st.booleans()):
        inp._data, inp._raw_data = None, np.asarray(rows, np.float32).tobytes()
    return inp


@st.composite
def coherent_inputs(draw: st.DrawFn) -> list[InferInput]:
    n = draw(st.integers(0, 3))
    inputs = [draw(coherent_tiles(n))]
    if draw(st.booleans()):
        inputs.append(draw(coherent_bulk(n)))
    return inputs


@st.composite
def infer_requests(draw: st.DrawFn) -> InferRequest:
    outputs = draw(st.none() | st.lists(st.sampled_from(["embedding", "mask", "", "x"])))
    inputs = st.lists(infer_inputs(), max_size=3) | coherent_inputs()
    modes = st.sampled_from(["embedding", "prediction", "prediction_with_embedding", "x", 3])
    params = parameters | modes.map(lambda m: {"mode": m})
    request = InferRequest(model_name="m", infer_inputs=draw(inputs), parameters=draw(params))
    if outputs:
        from kserve.protocol.infer_type import RequestedOutput

        request.request_outputs = [RequestedOutput(name=n) for n in outputs]
    return request


# -- properties ------------------------------------------------------------------------------
def stage_one(request: InferRequest, spec_name: str) -> None:
    """Decode, then prepare every item, as the server does; checks what comes out."""
    model = MODELS[spec_name]
    decoded = decode_v2(request, spec=model.model_spec, limits=LIMITS)
    assert 0 < len(decoded.items) <= LIMITS.max_tiles_per_request
    assert [item.index for item in decoded.items] == list(range(len(decoded.items)))
    for item in decoded.items:
        sample = model.prepare_sample(item)
        size = model.model_spec.tile_size
        assert sample.tile.dtype == np.uint8
        assert tuple(sample.tile.shape) == (size, size, 3)


def check_stage_one(request: InferRequest, spec_name: str) -> None:
    try:
        stage_one(request, spec_name)
    except InvalidInput as exc:
        assert str(exc), "an InvalidInput must say what is wrong"
        event(f"refused: {exc.reason.split(' ')[0]}")
    else:
        event("decoded and prepared")


@given(request=infer_requests(), spec_name=st.sampled_from(SPECS))
@FAST
def test_decode_v2_and_prepare_raise_only_invalid_input(request, spec_name):
    check_stage_one(request, spec_name)


@given(request=infer_requests(), spec_name=st.sampled_from(SPECS))
@LONG
@pytest.mark.slow
def test_decode_v2_and_prepare_raise_only_invalid_input_long(request, spec_name):
    check_stage_one(request, spec_name)


# -- gRPC messages, through kserve's own conversion -----------------------------------------
CONTENTS = {
    "bytes_contents": st.lists(images, max_size=3),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=12),
    "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12),
    "int64_contents": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12),
    "fp32_contents": st.lists(st.floats(width=32, allow_nan=True), max_size=12),
    "bool_contents": st.lists(st.booleans(), max_size=12),
}
grpc_params = st.one_of(
    st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=24)),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.just(pb.InferParameter()),
)


@st.composite
def grpc_tensors(draw: st.DrawFn) -> pb.ModelInferRequest.InferInputTensor:
    shape = [d for d in draw(shapes) if -(2**63) <= d < 2**63]
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=draw(names), datatype=draw(datatypes), shape=shape
    )
    for field in draw(st.lists(st.sampled_from(sorted(CONTENTS)), max_size=2, unique=True)):
        getattr(tensor.contents, field).extend(draw(CONTENTS[field]))
    return tensor


@st.composite
def grpc_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    keys = st.sampled_from(["mode", "binary_data_output", "priority"])
    return pb.ModelInferRequest(
        model_name="m",
        inputs=draw(st.lists(grpc_tensors(), max_size=3)),
        raw_input_contents=draw(
            st.lists(st.binary(max_size=512) | st.sampled_from(IMAGES), max_size=3)
        ),
        parameters=draw(st.dictionaries(keys, grpc_params, max_size=2)),
        outputs=[
            pb.ModelInferRequest.InferRequestedOutputTensor(name=n)
            for n in draw(st.lists(st.sampled_from(["embedding", "mask", ""]), max_size=2))
        ],
    )


def check_grpc(message: pb.ModelInferRequest, spec_name: str) -> None:
    try:  # what kserve's servicer does before the data plane sees the request
        InferenceServicer.validate_grpc_request(message)
        request = InferRequest.from_grpc(message)
    except KserveInvalidInput:
        return  # kserve refuses it itself, as INVALID_ARGUMENT
    check_stage_one(request, spec_name)


@given(message=grpc_requests(), spec_name=st.sampled_from(SPECS))
@FAST
def test_grpc_messages_raise_only_invalid_input(message, spec_name):
    check_grpc(message, spec_name)


@given(message=grpc_requests(), spec_name=st.sampled_from(SPECS))
@LONG
@pytest.mark.slow
def test_grpc_messages_raise_only_invalid_input_long(message, spec_name):
    check_grpc(message, spec_name)


# -- the Inference-Header-Content-Length header, as the string it always arrives as --------
HEADER_BODY = wire.encode_request({"pixels": np.zeros((1, 2, 2, 3), np.uint8)})[0]
HEADER_LENGTH = len(HEADER_BODY) - 12
header_values = st.one_of(
    st.text(max_size=24),
    st.binary(max_size=24).map(lambda b: b.decode("latin-1")),  # what Starlette makes of bytes
    st.text().map(lambda t: t.encode().decode("latin-1")),  # UTF-8 read as latin-1
    st.integers(-(2**70), 2**70).map(str),
    st.integers(0, 10_000).map(lambda n: "9" * n),
    st.sampled_from(["\u00b2", "1\u00b3", "-5", "", " 12 ", "0", "1_0", "+5", str(HEADER_LENGTH)]),
)
DATAPLANE = HistoDataPlane(model_registry=ModelRepository(), parse_body=parse_binary_body)


def check_header_value(value: str) -> None:
    """What the server does with the header: a request, or a 400 that names the header."""
    headers = {wire.HEADER.lower(): value}  # as Starlette hands it over
    try:
        request = DATAPLANE.decode_inference_request(HEADER_BODY, headers, "m")
    except InvalidInput as exc:
        plain = value.strip(" \t")
        if not (plain.isascii() and plain.isdigit()) or len(plain.lstrip("0")) > 19:
            assert wire.HEADER in str(exc), exc  # the value itself is refused
        event("refused")
        return
    assert int(value) == HEADER_LENGTH and [i.name for i in request.inputs] == ["pixels"]
    event("parsed")


@given(value=header_values)
@FAST
def test_any_header_length_string_parses_or_is_invalid_input(value: str) -> None:
    check_header_value(value)


@given(value=header_values)
@LONG
@pytest.mark.slow
def test_any_header_length_string_parses_or_is_invalid_input_long(value: str) -> None:
    check_header_value(value)


# -- prepare_sample of each family ------------------------------------------------------------
PIXEL_SHAPES = [(224, 224, 3), (512, 512, 3), (224, 224), (224, 224, 4), (3, 224, 224), (0, 0, 3)]
PIXEL_DTYPES = [np.uint8, np.int16, np.uint16, np.float32, np.bool_]


@st.composite
def pixel_arrays(draw: st.DrawFn) -> np.ndarray:
    shape = draw(st.sampled_from(PIXEL_SHAPES))
    array = np.full(shape, draw(st.integers(0, 255)), dtype=draw(st.sampled_from(PIXEL_DTYPES)))
    if draw(st.booleans()) and array.ndim == 3:
        array = np.ascontiguousarray(array.transpose(1, 0, 2)).transpose(1, 0, 2)  # strided view
    array.flags.writeable = draw(st.booleans())
    return array


def _as_array(values: list) -> np.ndarray:
    try:
        return np.asarray(values)
    except ValueError:  # ragged
        return np.asarray(values, dtype=object)


bulk_values = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=GENES + 2),
    st.lists(st.integers(-(2**70), 2**70), max_size=GENES + 2),
    st.lists(st.floats(0, 1e6), min_size=GENES, max_size=GENES),
    st.lists(elements, max_size=GENES + 1),
    st.lists(st.lists(st.floats(0, 10), min_size=GENES, max_size=GENES), max_size=2),
)
model_requests = st.builds(
    ModelRequest,
    index=st.integers(0, 7),
    image_data=st.none() | images,
    pixels=st.none() | pixel_arrays(),
    family_input=st.none() | bulk_values.map(_as_array),
)


def check_prepare(request: ModelRequest, spec_name: str) -> None:
    model = MODELS[spec_name]
    try:
        sample = model.prepare_sample(request)
    except InvalidInput as exc:
        assert str(exc)
        event("refused")
        return
    event("prepared")
    size = model.model_spec.tile_size
    assert sample.tile.dtype == np.uint8 and tuple(sample.tile.shape) == (size, size, 3)
    rna = sample.extra_tensors.get("bulk_rna")
    if rna is not None:
        assert tuple(rna.shape) == (GENES,)
        assert bool(np.isnan(rna).all()) or bool(np.isfinite(rna).all() and (rna >= 0).all())


@given(request=model_requests, spec_name=st.sampled_from(SPECS))
@FAST
def test_prepare_sample_of_each_family_raises_only_invalid_input(request, spec_name):
    check_prepare(request, spec_name)


@given(request=model_requests, spec_name=st.sampled_from(SPECS))
@LONG
@pytest.mark.slow
def test_prepare_sample_of_each_family_raises_only_invalid_input_long(request, spec_name):
    check_prepare(request, spec_name)
