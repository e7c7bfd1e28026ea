"""Every KServe name the server uses: KServe's public types, and the internals it reaches.

histoserve extends KServe's ModelServer, REST server, data plane and gRPC
service, mirrors its V2 REST infer endpoint (:mod:`predictor.kserve.fast_infer`)
and its ``Model.__call__`` (:mod:`predictor.kserve.stage_call`). That reaches
KServe's internal modules and a few private attributes; all of it is here, so
an upgrade of KServe is reviewed in this one file (with the mirrors beside
it). The rest of the server imports KServe's public types from here too
(``from predictor.kserve.compat import Model, InferRequest, ...``; the
import-linter contract ``kserve-in-one-place``); ``tests/unit/kserve/test_compat.py``
checks with an AST scan that no other module reaches a private KServe name, and
fails when a signature, attribute, route or mirrored function this module
relies on changes shape. ``pyproject.toml`` pins kserve to the version tested.

Imports nothing of histoserve, so every layer may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from kserve import metrics as _metrics
from kserve import model_server as _model_server
from kserve.constants.constants import (
    FASTAPI_APP_IMPORT_STRING,
    INFERENCE_CONTENT_LENGTH_HEADER,
    PredictorProtocol,
)
from kserve.errors import ModelNotFound
from kserve.errors import ModelNotReady as KServeModelNotReady
from kserve.logging import KSERVE_TRACE_LOGGER_NAME, trace_logger
from kserve.model import InferenceVerb
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.grpc_predict_v2_pb2 import (
    ModelInferResponse,
    RepositoryModelLoadResponse,
    RepositoryModelUnloadResponse,
)
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import (
    InferInput,
    RequestedOutput,
    to_grpc_parameters,
    to_http_parameters,
)
from kserve.protocol.rest.server import RESTServer
from kserve.protocol.rest.v2_datamodels import InferenceRequest, InferenceResponse
from kserve.utils.utils import strtobool

__all__ = [
    "FASTAPI_APP_IMPORT_STRING",
    "INFERENCE_CONTENT_LENGTH_HEADER",
    "KSERVE_TRACE_LOGGER_NAME",
    "REST_V2",
    "V2_INFER_ROUTE",
    "DataPlane",
    "ExceptionToStatusInterceptor",
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceServicer",
    "InferenceVerb",
    "KServeModelNotReady",
    "Model",
    "ModelInferResponse",
    "ModelNotFound",
    "ModelRepository",
    "ModelServer",
    "RESTServer",
    "RepositoryModelLoadResponse",
    "RepositoryModelUnloadResponse",
    "RequestedOutput",
    "add_inference_service",
    "fastapi_app",
    "model_server_parser",
    "raw_data",
    "register_models",
    "request_exit",
    "request_parameters_dict",
    "serve_on_socket",
    "serve_without_signal_capture",
    "set_listen_host",
    "set_raw_data",
    "stage_histograms",
    "strtobool",
    "to_grpc_parameters",
    "to_http_parameters",
    "trace_logger",
]

REST_V2 = PredictorProtocol.REST_V2.value
"""The protocol name KServe's V2 REST endpoints pass to ``DataPlane.decode``."""

V2_INFER_ROUTE = "/v2/models/{model_name}/infer"
"""The unversioned V2 REST infer route (KServe's ``V2Endpoints.infer``)."""


# -- tensors ---------------------------------------------------------------------------------
def raw_data(infer_input: InferInput) -> Any:
    """An input's raw little-endian bytes (gRPC ``raw_input_contents``, our binary parser), or None."""
    return infer_input._raw_data


def set_raw_data(infer_input: InferInput, data: Any) -> None:
    """Hands an input its raw bytes (a view into the body) as KServe's own parsers do."""
    infer_input._raw_data = data


# -- the model server ------------------------------------------------------------------------
_UINT64_PARAM = 5
"""The field number of ``uint64_param`` in Triton's ``InferParameter`` (absent from KServe's)."""


def request_parameters_dict(parameters: Any) -> dict[str, Any]:
    """KServe's ``to_http_parameters``, keeping a gRPC ``uint64_param`` too.

    tritonclient sends a gRPC request's ``priority`` as ``uint64_param``, a
    field KServe's ``InferParameter`` lacks: protobuf keeps it as an unknown
    field and KServe's conversion drops the parameter silently. It is read
    back here as an int; any other parameter KServe cannot read is kept as
    ``None`` (present, of no type the codecs accept) rather than dropped.
    """
    from google.protobuf import unknown_fields

    converted = to_http_parameters(parameters)
    for name, value in parameters.items():
        if name in converted or not hasattr(value, "WhichOneof"):
            continue
        found = [
            f.data
            for f in unknown_fields.UnknownFieldSet(value)
            if f.field_number == _UINT64_PARAM and f.wire_type == 0
        ]
        converted[name] = int(found[-1]) if found else None
    return converted


def model_server_parser() -> Any:
    """KServe's ``ModelServer`` argument parser (the parent of ``histoserve serve``'s)."""
    return _model_server.parser


def fastapi_app() -> FastAPI:
    """The FastAPI app KServe's REST server serves (``FASTAPI_APP_IMPORT_STRING``)."""
    return _model_server.app


def register_models(server: Any, models: Sequence[Any]) -> None:
    """What KServe's ``ModelServer.start`` does first: register the models, check one is ready.

    Raises:
        kserve.errors.NoModelReady: No model is ready.
    """
    server._register_and_check_atleast_one_model_is_ready(list(models))


def serve_without_signal_capture(rest_server: RESTServer) -> None:
    """Uvicorn must not take SIGTERM/SIGINT itself: histoserve drains first, then stops it."""
    rest_server._server.capture_signals = contextlib.nullcontext


def set_listen_host(rest_server: RESTServer, host: str) -> None:
    """Where uvicorn listens (KServe's ``RESTServer`` always says ``0.0.0.0``)."""
    rest_server.config.host = host


def serve_on_socket(rest_server: RESTServer, sock: Any) -> Any:
    """Uvicorn's serving coroutine on an already bound socket (front ends share one port)."""
    rest_server.create_application()
    return rest_server._server.serve(sockets=[sock])


def request_exit(rest_server: RESTServer) -> None:
    """Asks uvicorn to stop serving (its graceful exit)."""
    rest_server._server.should_exit = True


def add_inference_service(server: Any, servicer: InferenceServicer) -> None:
    """KServe's V2 gRPC inference service (``servicer``, one of its ``InferenceServicer``)."""
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


# -- the model's stage metrics -----------------------------------------------------------------
def stage_histograms(model_name: str) -> tuple[Any, Any, Any]:
    """KServe's ``request_{preprocess,predict,postprocess}_seconds`` children for one model."""
    labels = _metrics.get_labels(model_name)
    return (
        _metrics.PRE_HIST_TIME.labels(**labels),
        _metrics.PREDICT_HIST_TIME.labels(**labels),
        _metrics.POST_HIST_TIME.labels(**labels),
    )


def forget_stage_histograms(model_name: str) -> None:
    """Removes one model's children of KServe's stage histograms (its unload)."""
    for histogram in (
        _metrics.PRE_HIST_TIME,
        _metrics.PREDICT_HIST_TIME,
        _metrics.POST_HIST_TIME,
        _metrics.EXPLAIN_HIST_TIME,
    ):
        with contextlib.suppress(KeyError):
            histogram.remove(*_metrics.get_labels(model_name).values())
