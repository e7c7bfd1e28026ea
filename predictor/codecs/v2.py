"""Open Inference Protocol (V2) requests to tiles, and results back.

One codec serves REST JSON, the REST binary tensor extension and gRPC, because
KServe turns all three into a ``kserve.InferRequest``; they differ only in
where each input's data sits (see :mod:`predictor.codecs.tensors`):

=====================  ==============================  ===========================
arrival                ``BYTES`` ``tiles``             ``UINT8``/``FP32`` tensors
=====================  ==============================  ===========================
REST JSON              ``data``: base64 ``str`` list   ``data``: (nested) list
REST binary (ours)     ``data``: raw ``bytes`` list    ``_raw_data``: memoryview
gRPC ``contents``      ``data``: raw ``bytes`` list    ``data``: flat list
gRPC raw contents      ``_raw_data``: length-prefixed  ``_raw_data``: bytes
=====================  ==============================  ===========================

Decisions: unknown *inputs* are refused (a misspelt ``bulk_rna`` must not be
silently ignored) but unknown request *parameters* are allowed (V2 clients
send their own). tritonclient's ``priority`` (the class of service) and
``timeout`` (microseconds) are read: a whole number >= 0 each, else a 400
naming the parameter; the model checks the class against ``--priority_levels``. Requested
outputs are honoured in REST and gRPC alike; a per-output ``binary_data``
parameter overrides the request's ``binary_data_output``, as the binary
extension specifies (stock KServe ignores ``binary_data_output`` as soon as
outputs are named).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from predictor.codecs.binary import parse_binary_body
from predictor.codecs.common import (
    bool_parameter,
    count_parameter,
    decode_base64,
    first_non_finite,
    string_parameter,
)
from predictor.codecs.images import check_encoded_size
from predictor.codecs.jpeg_input import (
    JPEG_BOXES,
    JPEG_INPUTS,
    JPEG_LAYOUT,
    JPEG_TILES,
    jpeg_regions,
)
from predictor.codecs.jpeg_plan import check_slide_tile_count
from predictor.codecs.samples import ModelRequest, ModelResponse
from predictor.codecs.tensors import bytes_elements, numeric_tensor, parse_shape
from predictor.codecs.v2_response import (
    V2DecodedRequest,
    V2Response,
    encode_v2,
    select_outputs,
)
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.kserve.compat import (
    InferRequest,
    InferResponse,
    raw_data,
    request_parameters_dict,
)
from predictor.spec import ModelSpec

__all__ = [
    "INPUTS",
    "V2Codec",
    "V2DecodedRequest",
    "V2Response",
    "decode_v2",
    "encode_v2",
    "parse_binary_body",
    "select_outputs",
]

TILES, PIXELS, BULK_RNA = "tiles", "pixels", "bulk_rna"

INPUTS: Mapping[str, tuple[str, str]] = {
    TILES: ("BYTES", "[N]"),
    PIXELS: ("UINT8", "[N, H, W, 3]"),
    BULK_RNA: ("FP32", "[N, G]"),
    **JPEG_INPUTS,
}
"""Input name to (datatype, shape) as the V2 contract fixes them."""


class V2Codec:
    """The V2 protocol (REST JSON, REST binary, gRPC) for one model.

    Args:
        spec: The served model's spec (whether it takes ``bulk_rna``).
        limits: Tile count, image size and bulk RNA length limits.
        model_name: The name echoed in responses.
        datatypes: Output name to V2 datatype, for every output the model has.
    """

    def __init__(
        self,
        spec: ModelSpec,
        limits: LimitsConfig,
        *,
        model_name: str,
        datatypes: Mapping[str, str],
    ):
        self._spec = spec
        self._limits = limits
        self._model_name = model_name
        self._datatypes = dict(datatypes)

    def decode(self, request: InferRequest) -> V2DecodedRequest:
        """See :func:`decode_v2`."""
        return decode_v2(request, spec=self._spec, limits=self._limits)

    def check_outputs(self, decoded: V2DecodedRequest, output_names: Sequence[str]) -> None:
        """Refuses a requested output the mode does not produce, before any compute."""
        select_outputs(decoded, output_names)

    def encode(
        self,
        decoded: V2DecodedRequest,
        responses: Sequence[ModelResponse],
        output_names: Sequence[str],
        parameters: Mapping[str, str] | None = None,
    ) -> InferResponse:
        """See :func:`encode_v2`."""
        return encode_v2(
            list(responses),
            model_name=self._model_name,
            output_names=output_names,
            decoded=decoded,
            datatypes=self._datatypes,
            parameters=parameters,
        )


def decode_v2(request: InferRequest, *, spec: ModelSpec, limits: LimitsConfig) -> V2DecodedRequest:
    """Turns a V2 request (REST JSON, REST binary or gRPC) into one item per tile.

    Only the protocol is checked here (names, datatypes, shapes, sizes, value
    ranges, limits); the mode, tile geometry and gene count are the model's to
    check. ``pixels`` and ``bulk_rna`` items are views of one array, never
    copies; tiles stay encoded (stage 1 decodes them in parallel).

    Args:
        request: What KServe built from the wire (or :func:`parse_binary_body`).
        spec: The served model's spec (whether it takes ``bulk_rna``).
        limits: Tile count, image size and bulk RNA length limits.

    Returns:
        A :class:`V2DecodedRequest`.

    Raises:
        InvalidInput: Naming the input, the tile where there is one, and the reason.
    """
    params = request_parameters(request.parameters)
    inputs = _inputs_by_name(request.inputs, spec)
    tile_input = _tile_input(inputs)
    if tile_input == TILES:
        items = _decode_tiles(inputs[TILES], limits)
    elif tile_input == JPEG_TILES:
        items = _decode_jpeg(inputs, spec, limits)
        tile_input = JPEG_BOXES  # a model tile is a box; a slide tile's error names jpeg_tiles
    else:
        items = _decode_pixels(inputs[PIXELS], limits)
    if BULK_RNA in inputs:
        _attach_bulk_rna(items, inputs[BULK_RNA], limits)
    return decoded_request(request, params, items, tile_input)


def decoded_request(
    request: InferRequest, params: Mapping[str, Any], items: list[Any], tile_input: str
) -> V2DecodedRequest:
    """The decoded request around ``items``: mode, requested outputs, binary flags, id.

    Raises:
        InvalidInput: A malformed mode, binary flag or requested output.
    """
    requested, output_binary = _requested_outputs(request.request_outputs)
    return V2DecodedRequest(
        items=items,
        mode=string_parameter(params, "mode"),
        tile_input=tile_input,
        binary_output=bool_parameter(params, "binary_data_output"),
        requested_outputs=requested,
        request_id=str(request.id) if request.id else None,
        output_binary=output_binary,
        priority=count_parameter(params, "priority"),
        timeout_us=count_parameter(params, "timeout", unit=" (microseconds)"),
    )


def request_parameters(parameters: Any) -> dict[str, Any]:
    """Request parameters as a plain dict (gRPC gives ``InferParameter`` messages, Triton's uint64 kept)."""
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):
        raise InvalidInput(f"request parameters must be an object, got {type(parameters).__name__}")
    return request_parameters_dict(parameters)


def _inputs_by_name(inputs: Sequence[Any] | None, spec: ModelSpec) -> dict[str, Any]:
    allowed = [TILES, PIXELS, *JPEG_INPUTS] + ([BULK_RNA] if spec.takes_bulk_rna else [])
    if not inputs:
        raise InvalidInput("request has no inputs; expected one of 'tiles' or 'pixels'")
    by_name: dict[str, Any] = {}
    for inp in inputs:
        name = inp.name
        if name not in allowed:
            why = f"model '{spec.name}' takes no bulk RNA" if name == BULK_RNA else "unknown input"
            raise InvalidInput(f"{why}; inputs are {allowed}", input_name=name)
        if name in by_name:
            raise InvalidInput("input given twice", input_name=name)
        datatype, shape = INPUTS[name]
        if inp.datatype != datatype:
            raise InvalidInput(
                f"datatype must be {datatype} (shape {shape}), got {inp.datatype!r}",
                input_name=name,
            )
        by_name[name] = inp
    return by_name


def _tile_input(inputs: Mapping[str, Any]) -> str:
    present = [name for name in (TILES, PIXELS, JPEG_TILES) if name in inputs]
    if len(present) != 1:
        what = {0: "neither", 2: "both"}.get(len(present), "all three")
        raise InvalidInput(f"send exactly one of 'tiles', 'pixels' or 'jpeg_tiles', got {what}")
    jpeg = [name for name in (JPEG_LAYOUT, JPEG_BOXES) if name in inputs]
    if present[0] == JPEG_TILES and len(jpeg) != 2:
        raise InvalidInput("'jpeg_tiles' needs 'jpeg_layout' and 'jpeg_boxes'")
    if present[0] != JPEG_TILES and jpeg:
        raise InvalidInput(f"'{jpeg[0]}' goes only with 'jpeg_tiles'", input_name=jpeg[0])
    return present[0]


def _shape(inp: Any, rank: int, limits: LimitsConfig) -> tuple[int, ...]:
    """The input's shape, checked for rank and a tile count within limits."""
    try:
        shape = parse_shape(inp.shape)
    except InvalidInput as exc:
        raise exc.at(input_name=inp.name) from None
    if len(shape) != rank:
        raise InvalidInput(
            f"shape must be {INPUTS[inp.name][1]}, got {list(shape)}", input_name=inp.name
        )
    if shape[0] == 0:
        raise InvalidInput("no tiles: N is 0", input_name=inp.name)
    if shape[0] > limits.max_tiles_per_request:
        raise InvalidInput(
            f"{shape[0]} tiles, more than the limit of {limits.max_tiles_per_request} per request",
            input_name=inp.name,
        )
    return shape


def _decode_tiles(inp: Any, limits: LimitsConfig) -> list[ModelRequest]:
    (count,) = _shape(inp, 1, limits)
    try:
        elements = bytes_elements(inp.data, raw_data(inp), count)
    except InvalidInput as exc:
        raise exc.at(input_name=TILES) from None
    return [
        ModelRequest(index=i, image_data=_tile_bytes(e, i, limits)) for i, e in enumerate(elements)
    ]


def _decode_jpeg(inputs: Mapping[str, Any], spec: ModelSpec, limits: LimitsConfig) -> list:
    """One item per ``jpeg_boxes`` row (:mod:`predictor.codecs.jpeg_input`)."""
    streams, layout = inputs[JPEG_TILES], inputs[JPEG_LAYOUT]
    box_shape = _shape(inputs[JPEG_BOXES], 2, limits)
    if box_shape[1] != 4:
        raise InvalidInput(f"shape must be [N, 4], got {list(box_shape)}", input_name=JPEG_BOXES)
    (count,) = _ranked(streams, 1)
    check_slide_tile_count(count, box_shape[0], limits)
    try:
        elements = bytes_elements(streams.data, raw_data(streams), count)
    except InvalidInput as exc:
        raise exc.at(input_name=JPEG_TILES) from None
    data = [_tile_bytes(e, i, limits, JPEG_TILES) for i, e in enumerate(elements)]
    boxes = _numeric(inputs[JPEG_BOXES], box_shape)
    regions = jpeg_regions(
        data,
        _numeric(layout, _ranked(layout, 2)),
        boxes,
        limits=limits,
        tile_size=spec.tile_size,
        interpolation=spec.interpolation,
    )
    return [ModelRequest(index=i, jpeg=region) for i, region in enumerate(regions)]


def _ranked(inp: Any, rank: int) -> tuple[int, ...]:
    """``inp``'s declared shape, of ``rank`` axes; an error naming it otherwise."""
    try:
        shape = parse_shape(inp.shape)
    except InvalidInput as exc:
        raise exc.at(input_name=inp.name) from None
    if len(shape) != rank:
        raise InvalidInput(
            f"shape must be {INPUTS[inp.name][1]}, got {list(shape)}", input_name=inp.name
        )
    return shape


def _tile_bytes(element: Any, index: int, limits: LimitsConfig, name: str = TILES) -> bytes:
    try:
        if isinstance(element, str):
            return decode_base64(element, limits=limits)
        if isinstance(element, (bytes, bytearray, memoryview)):
            check_encoded_size(memoryview(element).nbytes, limits=limits)
            return bytes(element)
        raise InvalidInput(f"expected image bytes or a base64 string, got {type(element).__name__}")
    except InvalidInput as exc:
        raise exc.at(input_name=name, tile=index) from None


def _decode_pixels(inp: Any, limits: LimitsConfig) -> list[ModelRequest]:
    shape = _shape(inp, 4, limits)
    _, height, width, channels = shape
    if channels != 3 or height == 0 or width == 0:
        raise InvalidInput(f"shape must be [N, H, W, 3] RGB, got {list(shape)}", input_name=PIXELS)
    if height * width > limits.max_image_pixels:
        raise InvalidInput(
            f"tiles of {width}x{height} = {width * height} pixels exceed the limit of "
            f"{limits.max_image_pixels}",
            input_name=PIXELS,
        )
    array = _numeric(inp, shape)
    return [ModelRequest(index=i, pixels=array[i]) for i in range(shape[0])]


def _attach_bulk_rna(items: list[ModelRequest], inp: Any, limits: LimitsConfig) -> None:
    shape = _shape(inp, 2, limits)
    rows, genes = shape
    if rows != len(items):
        raise InvalidInput(
            f"{rows} rows for {len(items)} tiles; shape must be [N, G]", input_name=BULK_RNA
        )
    if not 0 < genes <= limits.max_bulk_rna_length:
        raise InvalidInput(
            f"{genes} genes per tile; expected 1..{limits.max_bulk_rna_length}", input_name=BULK_RNA
        )
    array = _numeric(inp, shape)
    tile = first_non_finite(array)
    if tile is not None:
        raise InvalidInput(
            "non-finite value (NaN, inf or out of FP32 range)", input_name=BULK_RNA, tile=tile
        )
    for item, row in zip(items, array, strict=True):
        item.family_input = row


def _numeric(inp: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return numeric_tensor(inp.data, raw_data(inp), inp.datatype, shape)
    except InvalidInput as exc:
        raise exc.at(input_name=inp.name) from None


def _requested_outputs(outputs: Any) -> tuple[tuple[str, ...] | None, dict[str, bool]]:
    if not outputs:
        return None, {}
    names: list[str] = []
    binary: dict[str, bool] = {}
    for out in outputs:
        name = out.name
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                f"requested output name must be a non-empty string, got {name!r:.40}"
            )
        if name in names:
            raise InvalidInput(f"output '{name}' requested twice")
        names.append(name)
        params = request_parameters(out.parameters)
        if params.get("binary_data") is not None:
            try:
                binary[name] = bool_parameter(params, "binary_data")
            except InvalidInput as exc:
                raise InvalidInput(f"requested output '{name}': {exc.reason}") from None
    return tuple(names), binary
