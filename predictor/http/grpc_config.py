"""gRPC ``ModelConfig``: a model described over gRPC as over REST.

KServe's V2 gRPC service has ``ModelMetadata`` (inputs and outputs) but no
call that says a model's spec, mpp or package, nor one that lists the served
models, so a ``grpc://`` URL could not describe a histoserve model. Triton's
``inference.GRPCInferenceService`` has both (``ModelConfig``,
``RepositoryIndex``), and tritonclient already speaks them
(``get_model_config``, ``get_model_repository_index``). This module answers
them beside KServe's servicer, under the same service name:

- ``ModelConfig``: the model's name, its ``max_batch_size`` and, as its
  ``parameters``, every key of ``GET /v2/models/{name}/config`` (spec with
  ``mpp`` and ``tile_size``, ``package_sha256``, inputs, outputs, ...), each a
  JSON text: one description, read by the client the same way over either
  protocol. An unknown model is ``NOT_FOUND`` (KServe's ``ModelNotFound``,
  through the edge's one table).
- ``RepositoryIndex`` (the served models, with their states) is the model
  repository's, :func:`predictor.kserve.registry.add_repository_index`.

The messages are declared here with Triton's field numbers in a private
descriptor pool: tritonclient's own modules register the same names as
KServe's in the default pool, and the server never imports them.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from predictor.kserve.compat import ModelNotFound

SERVICE = "inference.GRPCInferenceService"
_STRING, _BOOL, _INT32, _MESSAGE = (
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
)
_OPTIONAL, _REPEATED = (
    descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
)


def _message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind, label, type_name in fields:
        field = message.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    return message


def _messages() -> dict[str, Any]:
    """The Triton messages these calls use (their field numbers as in Triton's protos)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="histoserve/triton_describe.proto", package="inference", syntax="proto3"
    )
    proto.message_type.append(
        _message("ModelParameter", ("string_value", 1, _STRING, _OPTIONAL, ""))
    )
    config = _message(
        "ModelConfig",
        ("name", 1, _STRING, _OPTIONAL, ""),
        ("platform", 2, _STRING, _OPTIONAL, ""),
        ("max_batch_size", 4, _INT32, _OPTIONAL, ""),
        ("parameters", 14, _MESSAGE, _REPEATED, ".inference.ModelConfig.ParametersEntry"),
        ("backend", 17, _STRING, _OPTIONAL, ""),
    )
    entry = _message(
        "ParametersEntry",
        ("key", 1, _STRING, _OPTIONAL, ""),
        ("value", 2, _MESSAGE, _OPTIONAL, ".inference.ModelParameter"),
    )
    entry.options.map_entry = True
    config.nested_type.append(entry)
    proto.message_type.append(config)
    proto.message_type.append(
        _message(
            "ModelConfigRequest",
            ("name", 1, _STRING, _OPTIONAL, ""),
            ("version", 2, _STRING, _OPTIONAL, ""),
        )
    )
    proto.message_type.append(
        _message(
            "ModelConfigResponse", ("config", 1, _MESSAGE, _OPTIONAL, ".inference.ModelConfig")
        )
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    names = ("ModelConfigRequest", "ModelConfigResponse")
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{name}"))
        for name in names
    }


_TYPES = _messages()


def config_parameters(config: dict[str, Any]) -> dict[str, str]:
    """``/config``'s keys, each value as JSON text (what ``ModelConfig`` carries)."""
    return {
        str(key): json.dumps(value, sort_keys=True, default=str) for key, value in config.items()
    }


def describe_handler(repository: Any) -> grpc.GenericRpcHandler:
    """``ModelConfig`` over ``repository`` (the data plane's ``model_registry``: KServe's
    ``ModelRepository``)."""

    async def model_config(request: Any, context: Any) -> Any:
        model = repository.get_model(request.name)
        if model is None:
            raise ModelNotFound(request.name)
        config = model.get_metadata()
        response = _TYPES["ModelConfigResponse"]()
        response.config.name = request.name
        response.config.platform = "histoserve"
        batching = config.get("batching") or {}
        response.config.max_batch_size = int(batching.get("max_batch_size") or 0)
        for key, text in config_parameters(config).items():
            response.config.parameters[key].string_value = text
        return response

    handlers = {
        "ModelConfig": grpc.unary_unary_rpc_method_handler(
            model_config,
            request_deserializer=_TYPES["ModelConfigRequest"].FromString,
            response_serializer=_TYPES["ModelConfigResponse"].SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
