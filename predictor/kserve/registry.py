"""KServe's model registry, taught the states of a model repository, and gRPC's RepositoryIndex.

Every KServe route finds its model through the registry's ``get_model``
(``DataPlane.get_model_from_registry``, ``model_ready``, ``infer``...); a name
it does not hold is KServe's 404. :class:`StatefulRegistry` asks first what the
server knows of the name (``not_served``): a model folder being unloaded, or
not loaded, is then that answer (a 503 naming its state) on every route and
protocol at once. Server readiness counts the registered models only, so a
model being unloaded does not take the server out of its Service.

KServe's V2 gRPC service has ``RepositoryModelLoad``/``Unload`` but not
``RepositoryIndex`` (tritonclient's ``get_model_repository_index``), and its
load and unload requests put ``model_name`` in field 1, where Triton's (and so
tritonclient's) put ``repository_name``, the model's name in field 2: KServe
read an empty name. :func:`add_inference_services` serves KServe's service
with both names read (Triton's field 2 first, as an unknown field of KServe's
message) and ``RepositoryIndex`` beside it, its messages Triton's
(``inference.RepositoryIndexRequest``/``Response``) built here from a
descriptor, as protobuf makes messages from a ``.proto``.

Imports nothing of histoserve: the server hands in its hooks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields

from predictor.kserve.compat import (
    InferenceServicer,
    ModelRepository,
    RepositoryModelLoadResponse,
    RepositoryModelUnloadResponse,
    add_inference_service,
)

NotServed = Callable[[str], Exception | None]


class StatefulRegistry(ModelRepository):
    """KServe's registry whose ``get_model`` raises ``not_served(name)``'s error, if any."""

    def __init__(self) -> None:
        super().__init__()
        self.not_served: NotServed = lambda name: None

    def get_model(self, name: str) -> Any:
        model = self.models.get(name)
        if model is None:
            refusal = self.not_served(name)
            if refusal is not None:
                raise refusal
        return model

    def withdraw(self, name: str) -> None:
        """Forgets ``name``'s model (the repository stops and frees it itself)."""
        self.models.pop(name, None)


_TRITON_MODEL_NAME = 2
"""The field of ``model_name`` in Triton's ``RepositoryModelLoadRequest``/``UnloadRequest``."""


def repository_model_name(request: Any) -> str:
    """The model a load/unload request names: Triton's field 2, else KServe's ``model_name``."""
    for field in unknown_fields.UnknownFieldSet(request):
        if field.field_number == _TRITON_MODEL_NAME and field.wire_type == 2:
            return bytes(field.data).decode("utf-8", errors="replace")
    return request.model_name


class _Servicer(InferenceServicer):
    """KServe's servicer whose load and unload read tritonclient's model name too."""

    def __init__(self, dataplane: Any, repository: Any):
        super().__init__(dataplane, repository)
        self._repository = repository

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        name = repository_model_name(request)
        await self._repository.load(name)
        return RepositoryModelLoadResponse(model_name=name, isLoaded=True)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        name = repository_model_name(request)
        await self._repository.unload(name)
        return RepositoryModelUnloadResponse(model_name=name, isUnloaded=True)


def add_inference_services(server: Any, dataplane: Any, repository: Any) -> None:
    """KServe's V2 gRPC service (Triton's repository names read) and ``RepositoryIndex``
    (the model repository's index, or, without model folders, the models served)."""
    servicer = _Servicer(dataplane, repository)
    add_inference_service(server, servicer)
    index = getattr(repository, "index", None) or _served_index(dataplane.model_registry)
    add_repository_index(server, index)


def _served_index(registry: Any) -> IndexFn:
    """The index of a server without model folders: its registered models, ready or not."""

    async def index(ready_only: bool) -> list[dict[str, Any]]:
        rows = []
        for name, model in sorted(registry.get_models().items()):
            ready = bool(getattr(model, "ready", True))
            if ready or not ready_only:
                rows.append({"name": name, "state": "READY" if ready else "UNAVAILABLE"})
        return rows

    return index


def _index_messages() -> tuple[Any, Any]:
    """Triton's ``RepositoryIndexRequest`` and ``RepositoryIndexResponse`` message classes."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="histoserve_repository_index.proto", package="inference", syntax="proto3"
    )
    request = proto.message_type.add(name="RepositoryIndexRequest")
    request.field.add(name="repository_name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    request.field.add(name="ready", number=2, type=f.TYPE_BOOL, label=f.LABEL_OPTIONAL)
    response = proto.message_type.add(name="RepositoryIndexResponse")
    entry = response.nested_type.add(name="ModelIndex")
    for number, name in enumerate(("name", "version", "state", "reason"), start=1):
        entry.field.add(name=name, number=number, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    response.field.add(
        name="models",
        number=1,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".inference.RepositoryIndexResponse.ModelIndex",
    )
    pool = descriptor_pool.DescriptorPool()  # its own: KServe's pool has no such messages
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("inference.RepositoryIndexRequest")
        ),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("inference.RepositoryIndexResponse")
        ),
    )


IndexFn = Callable[[bool], Awaitable[list[dict[str, Any]]]]
"""``ready_only -> rows`` (each with ``name``, ``version``, ``state``, ``reason``)."""


def add_repository_index(server: Any, index: IndexFn) -> None:
    """Serves ``inference.GRPCInferenceService/RepositoryIndex`` on ``server`` from ``index``."""
    request_cls, response_cls = _index_messages()

    async def repository_index(request: Any, context: Any) -> Any:
        rows = await index(bool(request.ready))
        models = [
            response_cls.ModelIndex(
                **{k: str(row.get(k) or "") for k in ("name", "version", "state", "reason")}
            )
            for row in rows
        ]
        return response_cls(models=models)

    handler = grpc.unary_unary_rpc_method_handler(
        repository_index,
        request_deserializer=request_cls.FromString,
        response_serializer=response_cls.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService", {"RepositoryIndex": handler}
            ),
        )
    )
