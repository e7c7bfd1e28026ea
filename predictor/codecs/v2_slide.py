"""The V2 protocol for slide models: one request is one slide's tile features.

Inputs (REST JSON, REST binary, gRPC alike):

============  ==========================  ==========================================
name          datatype                    shape
============  ==========================  ==========================================
``features``  ``FP32``, ``FP16``, ``BF16``  ``[N, D]``: the slide's tile features
``coords``    ``INT64``                   ``[N, 2]``: level-0 x, y per tile (optional)
============  ==========================  ==========================================

Only the protocol is checked here, before any data is read: names,
datatypes, shapes, ``N`` between 1 and ``max_tiles_per_slide``, ``D`` the
spec's feature width (a 400 naming both widths). Finiteness and the cast to
float32 are the model's stage 1 (a thread, not the event loop). ``BF16``
comes raw (binary extension or gRPC); numpy has no bfloat16, so it is
widened to float32 here (its 16 bits are a float32's top half).

The answer is one slide's outputs as the model made them (``prediction
[C]``, ``attention [N]`` or ``[N, C]``, ``slide_embedding [E]``), never
stacked along a tile axis.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.codecs.samples import ModelRequest, ModelResponse
from predictor.codecs.tensors import NUMERIC_DTYPES, numeric_tensor, parse_shape
from predictor.codecs.v2 import V2Codec, decoded_request, request_parameters
from predictor.codecs.v2_response import V2DecodedRequest, V2Response, select_outputs
from predictor.errors import InvalidInput
from predictor.kserve.compat import InferOutput, InferRequest, InferResponse, raw_data

FEATURES, COORDS = "features", "coords"

SLIDE_INPUTS: Mapping[str, tuple[tuple[str, ...], str]] = {
    FEATURES: (("FP32", "FP16", "BF16"), "[N, D]"),
    COORDS: (("INT64",), "[N, 2]"),
}
"""Input name to (accepted datatypes, shape) as the slide contract fixes them."""


@dataclass(frozen=True)
class SlideInput:
    """One slide as decoded: the ``family_input`` of a slide model's one request item.

    Attributes:
        features: The slide's tile features, ``[N, D]`` (float32, or float16 as sent).
        coords: Their level-0 coordinates, ``int64 [N, 2]``, when sent.
    """

    features: np.ndarray
    coords: np.ndarray | None = None


class SlideV2Codec(V2Codec):
    """The V2 protocol for one slide model (see the module docstring).

    :class:`~predictor.codecs.v2.V2Codec`'s arguments and output check; a
    slide's own decoding (one item for the whole slide) and encoding (each
    output with its own shape, no tile axis added).

    Args:
        spec: The served slide model's spec (its ``feature_dim``).
        limits: ``max_tiles_per_slide`` bounds ``N``.
        model_name: The name echoed in responses.
        datatypes: Output name to V2 datatype, for every output the model has.
    """

    def decode(self, request: InferRequest) -> V2DecodedRequest:
        """One item for the whole slide (its ``features`` and ``coords``: a :class:`SlideInput`).

        Raises:
            InvalidInput: Naming the input and the reason.
        """
        params = request_parameters(request.parameters)
        inputs = _inputs_by_name(request.inputs)
        if FEATURES not in inputs:
            raise InvalidInput(
                f"a slide model takes 'features' [N, D]; inputs are {list(SLIDE_INPUTS)}"
            )
        features = self._features(inputs[FEATURES])
        n = int(features.shape[0])
        coords = _coords(inputs[COORDS], n) if COORDS in inputs else None
        item = ModelRequest(index=0, family_input=SlideInput(features, coords), tiles=n)
        return decoded_request(request, params, [item], FEATURES)

    def encode(
        self,
        decoded: V2DecodedRequest,
        responses: Sequence[ModelResponse],
        output_names: Sequence[str],
        parameters: Mapping[str, str] | None = None,
    ) -> InferResponse:
        """The slide's outputs, each with its own shape (no tile axis added)."""
        names = select_outputs(decoded, output_names)
        if len(responses) != 1:
            raise RuntimeError(f"a slide request got {len(responses)} results, not 1")
        (response,) = responses
        outputs = []
        for name in names:
            datatype = self._datatypes[name]
            data = np.ascontiguousarray(response.outputs[name], dtype=NUMERIC_DTYPES[datatype])
            outputs.append(
                InferOutput(name=name, shape=list(data.shape), datatype=datatype, data=data)
            )
        binary = {name: decoded.output_binary.get(name, decoded.binary_output) for name in names}
        return V2Response(
            response_id=decoded.request_id or str(uuid.uuid4()),
            model_name=self._model_name,
            infer_outputs=outputs,
            binary=binary,
            parameters=parameters,
        )

    def _features(self, inp: Any) -> np.ndarray:
        shape = _shape(inp)
        n, width = shape
        if n == 0:
            raise InvalidInput("empty slide: N is 0 tiles", input_name=FEATURES)
        limit = self._limits.max_tiles_per_slide
        if n > limit:
            raise InvalidInput(
                f"{n} tiles, more than the limit of {limit} per slide (--max_tiles_per_slide)",
                input_name=FEATURES,
            )
        spec = self._spec
        if width != spec.feature_dim:
            encoder = f" ({spec.tile_encoder} features)" if spec.tile_encoder else ""
            raise InvalidInput(
                f"features are {width} wide but model {spec.name!r} takes "
                f"{spec.feature_dim}{encoder}",
                input_name=FEATURES,
            )
        try:
            if inp.datatype == "BF16":
                return _bf16_as_fp32(inp, shape)
            return numeric_tensor(inp.data, raw_data(inp), inp.datatype, shape)
        except InvalidInput as exc:
            raise exc.at(input_name=FEATURES) from None


def _inputs_by_name(inputs: Sequence[Any] | None) -> dict[str, Any]:
    if not inputs:
        raise InvalidInput("request has no inputs; a slide model takes 'features' [N, D]")
    by_name: dict[str, Any] = {}
    for inp in inputs:
        name = inp.name
        if name not in SLIDE_INPUTS:
            raise InvalidInput(f"unknown input; inputs are {list(SLIDE_INPUTS)}", input_name=name)
        if name in by_name:
            raise InvalidInput("input given twice", input_name=name)
        datatypes, shape = SLIDE_INPUTS[name]
        if inp.datatype not in datatypes:
            raise InvalidInput(
                f"datatype must be one of {list(datatypes)} (shape {shape}), got {inp.datatype!r}",
                input_name=name,
            )
        by_name[name] = inp
    return by_name


def _shape(inp: Any) -> tuple[int, int]:
    try:
        shape = parse_shape(inp.shape)
    except InvalidInput as exc:
        raise exc.at(input_name=inp.name) from None
    if len(shape) != 2:
        raise InvalidInput(
            f"shape must be {SLIDE_INPUTS[inp.name][1]}, got {list(shape)}", input_name=inp.name
        )
    return shape[0], shape[1]


def _coords(inp: Any, n: int) -> np.ndarray:
    shape = _shape(inp)
    if shape != (n, 2):
        raise InvalidInput(
            f"shape must be [N, 2] with N = {n} (the features' tiles), got {list(shape)}",
            input_name=COORDS,
        )
    try:
        return numeric_tensor(inp.data, raw_data(inp), "INT64", shape)
    except InvalidInput as exc:
        raise exc.at(input_name=COORDS) from None


def _bf16_as_fp32(inp: Any, shape: tuple[int, int]) -> np.ndarray:
    raw = raw_data(inp)
    if raw is None:  # JSON numbers: read as FP32 values
        return numeric_tensor(inp.data, None, "FP32", shape)
    halves = numeric_tensor(None, raw, "UINT16", shape)
    return (halves.astype("<u4") << 16).view("<f4")
