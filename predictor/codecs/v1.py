"""The V1 protocol: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

V1 is what KServe's agent batcher batches, so it stays a first-class path.

Decisions:

* Unknown *instance* keys are refused, naming ``instances[i].key``: a misspelt
  ``bulk_rna`` or ``image_data`` must fail, not be silently dropped. Unknown
  *top-level* keys and unknown ``parameters`` are ignored (envelope fields that
  proxies and clients add).
* Metadata fields are echoed back unchanged and not type-checked: they are the
  client's own bookkeeping.
* ``encode_v1`` returns numpy arrays, not lists: KServe answers V1 with
  FastAPI's ``ORJSONResponse``, which serialises with ``OPT_SERIALIZE_NUMPY``,
  so a 1536-float embedding goes out without a Python list. (KServe's
  CloudEvents response path uses ``json.dumps`` instead; it needs lists.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.codecs.common import decode_base64, first_non_finite, string_parameter
from predictor.codecs.samples import DecodedRequest, ModelRequest, ModelResponse
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput
from predictor.spec import ModelSpec

IMAGE_DATA, BULK_RNA = "image_data", "bulk_rna"

METADATA_FIELDS = (
    "slide_name",
    "x",
    "y",
    "width",
    "height",
    "tissue_ratio",
    "patch_idx",
    "resolution",
)
"""Instance fields echoed back in each prediction."""

INSTANCE_FIELDS = (IMAGE_DATA, BULK_RNA, *METADATA_FIELDS)
"""Every key an instance may have; only ``image_data`` is required."""


@dataclass
class V1DecodedRequest(DecodedRequest):
    """A decoded V1 request and what its answer must echo.

    Attributes:
        echo: Per instance, its metadata fields, echoed in its prediction.
            They stay here, with the codec: batch items never carry them.
    """

    echo: list[dict[str, Any]] = field(default_factory=list)


class V1Codec:
    """The V1 protocol for one model: decode a body, check outputs, encode the answer.

    Args:
        spec: The served model's spec (whether it takes ``bulk_rna``).
        limits: Tile count, image size and bulk RNA length limits.
    """

    def __init__(self, spec: ModelSpec, limits: LimitsConfig):
        self._spec = spec
        self._limits = limits

    def decode(self, body: Any) -> V1DecodedRequest:
        """See :func:`decode_v1`."""
        return decode_v1(body, spec=self._spec, limits=self._limits)

    def check_outputs(self, decoded: V1DecodedRequest, output_names: Sequence[str]) -> None:
        """V1 names no outputs: the mode decides them, so there is nothing to refuse."""

    def encode(
        self,
        decoded: V1DecodedRequest,
        responses: Sequence[ModelResponse],
        output_names: Sequence[str],
        parameters: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """See :func:`encode_v1`; the echo fields come from ``decoded``.

        V1 answers have no parameters: ``parameters`` is not sent.
        """
        return encode_v1(responses, output_names=output_names, echo=decoded.echo)


def decode_v1(body: Any, *, spec: ModelSpec, limits: LimitsConfig) -> V1DecodedRequest:
    """Turns a V1 request body into one item per instance.

    Args:
        body: The parsed JSON body.
        spec: The served model's spec (whether it takes ``bulk_rna``).
        limits: Tile count, image size and bulk RNA length limits.

    Returns:
        A :class:`V1DecodedRequest` with ``tile_input`` ``image_data``; each
        item carries the encoded image and its bulk RNA (``float32 [G]``) when
        sent; ``echo`` holds each instance's metadata fields.

    Raises:
        InvalidInput: Naming ``instances[i].field`` and the reason.
    """
    if not isinstance(body, Mapping):
        raise InvalidInput(
            f"V1 body must be a JSON object with 'instances', got {type(body).__name__}"
        )
    instances = _instances(body, limits)
    params = body.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise InvalidInput(f"'parameters' must be an object, got {type(params).__name__}")
    mode = string_parameter(params or {}, "mode")
    items = [_instance(inst, i, spec, limits) for i, inst in enumerate(instances)]
    echo = [{key: inst[key] for key in METADATA_FIELDS if key in inst} for inst in instances]
    return V1DecodedRequest(items=items, mode=mode, tile_input=IMAGE_DATA, echo=echo)


def _instances(body: Mapping[str, Any], limits: LimitsConfig) -> list[Any]:
    instances = body.get("instances")
    if instances is None:
        hint = " (V2 'inputs' go to /v2/models/{name}/infer)" if "inputs" in body else ""
        raise InvalidInput(f"V1 body needs an 'instances' list{hint}")
    if not isinstance(instances, list):
        raise InvalidInput(f"'instances' must be a list, got {type(instances).__name__}")
    if not instances:
        raise InvalidInput("'instances' is empty")
    if len(instances) > limits.max_tiles_per_request:
        raise InvalidInput(
            f"{len(instances)} instances, more than the limit of "
            f"{limits.max_tiles_per_request} per request"
        )
    return instances


def _instance(inst: Any, index: int, spec: ModelSpec, limits: LimitsConfig) -> ModelRequest:
    where = f"instances[{index}]"
    if not isinstance(inst, Mapping):
        raise InvalidInput(
            f"must be an object with 'image_data', got {type(inst).__name__}", input_name=where
        )
    for key in inst:
        if key not in INSTANCE_FIELDS:
            raise InvalidInput(
                f"unknown field; instance fields are {list(INSTANCE_FIELDS)}",
                input_name=f"{where}.{key}",
            )
    if IMAGE_DATA not in inst:
        raise InvalidInput("missing (required)", input_name=f"{where}.{IMAGE_DATA}")
    try:
        image = decode_base64(inst[IMAGE_DATA], limits=limits)
    except InvalidInput as exc:
        raise exc.at(input_name=f"{where}.{IMAGE_DATA}") from None
    bulk = inst.get(BULK_RNA)
    if bulk is not None:
        bulk = _bulk_rna(bulk, spec, limits, f"{where}.{BULK_RNA}")
    return ModelRequest(index=index, image_data=image, family_input=bulk)


def _bulk_rna(value: Any, spec: ModelSpec, limits: LimitsConfig, where: str) -> np.ndarray:
    if not spec.takes_bulk_rna:
        raise InvalidInput(f"model '{spec.name}' takes no bulk RNA", input_name=where)
    if not isinstance(value, list) or not value:
        raise InvalidInput(
            f"must be a non-empty list of numbers, got {value!r:.40}", input_name=where
        )
    if len(value) > limits.max_bulk_rna_length:
        raise InvalidInput(
            f"{len(value)} values, more than the limit of {limits.max_bulk_rna_length}",
            input_name=where,
        )
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidInput("must be a flat list of numbers", input_name=where) from exc
    if array.ndim != 1 or array.dtype.kind not in "iuf":
        raise InvalidInput("must be a flat list of numbers", input_name=where)
    with np.errstate(over="ignore", invalid="ignore"):
        vector = array.astype(np.float32)
    bad = first_non_finite(vector)
    if bad is not None:
        raise InvalidInput(f"value {value[bad]!r} at {bad} is not a finite FP32", input_name=where)
    return vector


def encode_v1(
    responses: Sequence[ModelResponse],
    *,
    output_names: Sequence[str],
    echo: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Builds ``{"predictions": [...]}``, one entry per tile in request order.

    Each entry holds ``output`` (the first of ``output_names``, flattened, so a
    segmentation mask goes out as ``H*W`` values), ``embedding`` when
    ``embedding`` is among the further outputs (``prediction_with_embedding``),
    then the tile's echoed metadata (``echo[i]``, from :func:`decode_v1`).

    Values are C-contiguous, native-order 1-D numpy arrays: KServe's V1
    ``ORJSONResponse`` serialises them directly (``OPT_SERIALIZE_NUMPY``).

    Raises:
        RuntimeError: A result lacks an output it should have (a server bug).
    """
    if not output_names:
        raise RuntimeError("encode_v1 needs at least one output name")
    primary = output_names[0]
    with_embedding = primary != "embedding" and "embedding" in output_names[1:]
    predictions = []
    for position, response in enumerate(responses):
        entry = {"output": _flat(response, primary, position)}
        if with_embedding:
            entry["embedding"] = _flat(response, "embedding", position)
        for key, value in (echo[position] if echo else {}).items():
            entry.setdefault(key, value)
        predictions.append(entry)
    return {"predictions": predictions}


def _flat(response: ModelResponse, name: str, position: int) -> np.ndarray:
    try:
        array = np.asarray(response.outputs[name])
    except KeyError:
        raise RuntimeError(f"tile {position}: the model returned no output '{name}'") from None
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array).reshape(-1)
