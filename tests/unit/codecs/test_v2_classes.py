"""The V2 ``priority`` and ``timeout`` request parameters, as tritonclient sends them.

tritonclient puts them in the request's parameters: over REST as JSON
numbers, over gRPC ``priority`` as a ``uint64_param`` (a field KServe's
``InferParameter`` lacks, so KServe's own conversion drops it) and
``timeout`` as an ``int64_param``. The gRPC bytes come from tritonclient in
a subprocess (it cannot share a process with kserve).
"""

from __future__ import annotations

import base64
import json

import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferRequest
from kserve.protocol.rest.v2_datamodels import InferenceRequest

from predictor.codecs.v2 import decode_v2
from predictor.errors import InvalidInput
from predictor.spec import BUILTIN_SPECS

ENCODER = BUILTIN_SPECS["h0-mini"]
PIXELS = {"name": "pixels", "shape": [1, 2, 2, 3], "datatype": "UINT8", "data": [0] * 12}

_GRPC_CLIENT = """
    import base64, json
    import numpy as np
    import tritonclient.grpc as tg
    from tritonclient.grpc._utils import _get_inference_request

    p = tg.InferInput("pixels", [1, 2, 2, 3], "UINT8")
    p.set_data_from_numpy(np.zeros((1, 2, 2, 3), dtype=np.uint8))
    common = dict(model_version="", sequence_id=0, sequence_start=False, sequence_end=False,
                  request_id="", outputs=None, parameters=None)
    asked = _get_inference_request(model_name="m", inputs=[p], priority=1, timeout=2500, **common)
    plain = _get_inference_request(model_name="m", inputs=[p], priority=0, timeout=None, **common)
    print(json.dumps([base64.b64encode(m.SerializeToString()).decode() for m in (asked, plain)]))
"""


def json_request(**parameters: object) -> InferRequest:
    body = InferenceRequest.model_validate({"inputs": [PIXELS], "parameters": parameters})
    return InferRequest.from_inference_request(body, "m")


def test_rest_priority_and_timeout_are_read(limits):
    decoded = decode_v2(json_request(priority=1, timeout=2500), spec=ENCODER, limits=limits)
    assert (decoded.priority, decoded.timeout_us) == (1, 2500)
    decoded = decode_v2(json_request(), spec=ENCODER, limits=limits)
    assert (decoded.priority, decoded.timeout_us) == (None, None)


def test_grpc_priority_and_timeout_from_tritonclient_are_read(triton_grpc, limits):
    asked, plain = (
        InferRequest.from_grpc(pb.ModelInferRequest.FromString(base64.b64decode(m)))
        for m in json.loads(triton_grpc(_GRPC_CLIENT, ""))
    )
    decoded = decode_v2(asked, spec=ENCODER, limits=limits)
    assert (decoded.priority, decoded.timeout_us) == (1, 2500)
    decoded = decode_v2(plain, spec=ENCODER, limits=limits)
    assert (decoded.priority, decoded.timeout_us) == (None, None)


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        (
            {"priority": "high"},
            "parameter 'priority' must be a whole number from 0 to 2\\*\\*64 - 1, got str",
        ),
        (
            {"priority": -1},
            "parameter 'priority' must be a whole number from 0 to 2\\*\\*64 - 1, got int -1",
        ),
        (
            {"priority": 1.5},
            "parameter 'priority' must be a whole number from 0 to 2\\*\\*64 - 1, got float",
        ),
        (
            {"priority": True},
            "parameter 'priority' must be a whole number from 0 to 2\\*\\*64 - 1, got bool",
        ),
        (
            {"timeout": -5},
            "parameter 'timeout' must be a whole number from 0 to 2\\*\\*64 - 1 \\(microseconds\\)",
        ),
        (
            {"timeout": "1s"},
            "parameter 'timeout' must be a whole number from 0 to 2\\*\\*64 - 1 \\(microseconds\\)",
        ),
        (
            {"timeout": 10**400},
            "parameter 'timeout' must be a whole number from 0 to 2\\*\\*64 - 1",
        ),
        (
            {"priority": 2**64},
            "parameter 'priority' must be a whole number from 0 to 2\\*\\*64 - 1",
        ),
    ],
)
def test_a_bad_priority_or_timeout_is_a_400_naming_the_parameter(parameters, named, limits):
    with pytest.raises(InvalidInput, match=named):
        decode_v2(json_request(**parameters), spec=ENCODER, limits=limits)
