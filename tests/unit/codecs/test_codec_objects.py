"""The codec objects the model talks to: decode, check_outputs, encode, per protocol."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

from predictor.codecs.samples import ModelResponse
from predictor.codecs.v1 import V1Codec
from predictor.codecs.v2 import V2Codec
from predictor.errors import InvalidInput

DATATYPES = {"prediction": "FP32", "embedding": "FP32"}


def _responses(n: int) -> list[ModelResponse]:
    rows = np.arange(n * 6, dtype=np.float32).reshape(n, 6)
    return [ModelResponse({"prediction": r[:4], "embedding": r[4:]}) for r in rows]


def test_v1_codec_keeps_the_echo_fields_and_answers_in_order(multimodal_spec, limits, encode, rgb):
    codec = V1Codec(multimodal_spec, limits)
    image = base64.b64encode(encode(rgb, "PNG")).decode()
    body = {
        "instances": [
            {"image_data": image, "slide_name": "a", "x": 1},
            {"image_data": image, "patch_idx": 7},
        ]
    }
    decoded = codec.decode(body)
    # Batch items carry the tile and nothing to echo: that stays in the codec's request.
    assert all(
        set(vars(item)) == {"index", "image_data", "pixels", "jpeg", "family_input", "tiles"}
        for item in decoded.items
    )
    codec.check_outputs(decoded, ["prediction"])  # V1 names no outputs: nothing to refuse
    out = codec.encode(decoded, _responses(2), ["prediction", "embedding"])
    first, second = out["predictions"]
    assert (first["slide_name"], first["x"], second["patch_idx"]) == ("a", 1, 7)
    assert first["output"].tolist() == [0, 1, 2, 3] and second["embedding"].tolist() == [10, 11]


def test_v2_codec_refuses_unknown_outputs_and_encodes_the_requested_ones(encoder_spec, limits):
    codec = V2Codec(encoder_spec, limits, model_name="m", datatypes=DATATYPES)
    pixels = InferInput("pixels", [2, 2, 2, 3], "UINT8")
    pixels.set_data_from_numpy(np.zeros((2, 2, 2, 3), np.uint8), binary_data=False)
    wanted = [RequestedOutput("embedding", parameters={"binary_data": True})]
    decoded = codec.decode(InferRequest("m", [pixels], request_id="r1", request_outputs=wanted))
    assert len(decoded.items) == 2 and decoded.items[1].pixels.shape == (2, 2, 3)
    with pytest.raises(InvalidInput, match="'embedding' is not produced"):
        codec.check_outputs(decoded, ["prediction"])
    codec.check_outputs(decoded, ["prediction", "embedding"])
    response = codec.encode(decoded, _responses(2), ["prediction", "embedding"])
    assert response.id == "r1" and [o.name for o in response.outputs] == ["embedding"]
    assert response.binary == {"embedding": True}
    np.testing.assert_array_equal(response.outputs[0].data, [[4, 5], [10, 11]])
