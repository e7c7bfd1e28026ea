"""encode_v2 and V2Response: stacked outputs to REST JSON, REST binary and gRPC."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from kserve.protocol.rest.v2_datamodels import InferenceResponse

from predictor.codecs.samples import ModelResponse
from predictor.codecs.v2 import V2DecodedRequest, V2Response, encode_v2, select_outputs
from predictor.errors import InvalidInput


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def results(n: int) -> list[ModelResponse]:
    rng = np.random.default_rng(n)
    return [
        ModelResponse(
            outputs={
                "prediction": rng.standard_normal(4).astype(np.float32),
                "embedding": rng.standard_normal(6).astype(np.float64),  # cast to FP32
                "mask": rng.integers(0, 2, (3, 5)).astype(bool),  # cast to UINT8
            }
        )
        for _ in range(n)
    ]


DATATYPES = {"prediction": "FP32", "embedding": "FP32", "mask": "UINT8"}


def decoded_request(**kwargs) -> V2DecodedRequest:
    return V2DecodedRequest(items=[], mode=None, tile_input="pixels", **kwargs)


def encode(responses, names, decoded) -> V2Response:
    out = encode_v2(
        responses, model_name="m", output_names=names, decoded=decoded, datatypes=DATATYPES
    )
    assert isinstance(out, V2Response)
    return out


def test_outputs_are_stacked_and_cast():
    responses = results(3)
    response = encode(
        responses, ["prediction", "embedding", "mask"], decoded_request(request_id="r")
    )
    body, length = response.to_rest()
    assert length is None and body["id"] == "r" and body["model_name"] == "m"
    by_name = {o["name"]: o for o in body["outputs"]}
    assert by_name["prediction"]["shape"] == [3, 4] and by_name["prediction"]["datatype"] == "FP32"
    assert by_name["mask"]["shape"] == [3, 3, 5] and by_name["mask"]["datatype"] == "UINT8"
    expected = np.stack([r.outputs["embedding"] for r in responses]).astype(np.float32)
    assert by_name["embedding"]["data"] == expected.reshape(-1).tolist()
    InferenceResponse.model_validate(body)  # what KServe's V2 endpoint does with a dict


def test_requested_outputs_in_request_order_and_binary_choices():
    decoded = decoded_request(requested_outputs=("mask", "prediction"), binary_output=True)
    decoded.output_binary = {"prediction": False}
    response = encode(results(2), ["prediction", "embedding", "mask"], decoded)
    body, length = response.to_rest()
    header = json.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["mask", "prediction"]
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 2 * 3 * 5}
    assert "data" in header["outputs"][1] and len(body) == length + 30


def test_unknown_requested_output_is_invalid():
    decoded = decoded_request(requested_outputs=("mask",))
    with pytest.raises(InvalidInput, match="requested output 'mask' is not produced here"):
        select_outputs(decoded, ["embedding"])
    with pytest.raises(InvalidInput, match="requested output 'mask'"):
        encode(results(1), ["embedding"], decoded)


def test_missing_model_output_is_a_server_error():
    with pytest.raises(RuntimeError, match="cannot stack output 'nope'"):
        encode_v2(
            results(1),
            model_name="m",
            output_names=["nope"],
            decoded=decoded_request(),
            datatypes={"nope": "FP32"},
        )


_GRPC_READER = """
    import base64, json, sys
    import tritonclient.grpc as tg
    from tritonclient.grpc import service_pb2
    message = service_pb2.ModelInferResponse.FromString(base64.b64decode(sys.stdin.read()))
    result = tg.InferResult(message)
    print(json.dumps({o.name: result.as_numpy(o.name).tolist() for o in message.outputs}))
"""


def test_grpc_response_reads_back_with_tritonclient(triton_grpc):
    responses = results(2)
    decoded = decoded_request(requested_outputs=("embedding", "mask"))
    message = encode(responses, ["prediction", "embedding", "mask"], decoded).to_grpc()
    assert len(message.raw_output_contents) == 2
    got = json.loads(triton_grpc(_GRPC_READER, b64(message.SerializeToString())))
    assert list(got) == ["embedding", "mask"]
    expected = np.stack([r.outputs["embedding"] for r in responses]).astype(np.float32)
    np.testing.assert_array_equal(np.array(got["embedding"], np.float32), expected)
    np.testing.assert_array_equal(
        got["mask"], np.stack([r.outputs["mask"] for r in responses]).astype(np.uint8)
    )
