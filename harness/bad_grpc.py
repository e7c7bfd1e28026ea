"""A FAKE V2 gRPC server on loopback whose inference answers are wrong on purpose.

The gRPC counterpart of :class:`harness.bad_server.BadServer`, and a fake for
the same reason: the real server never answers wrong. It forwards every
unary call, as raw bytes, to a real server's gRPC port, and by default cuts
the raw output buffers of its ``ModelInfer`` answers short, so that an
answer's shape says more than its data holds (``tritonclient``'s
``as_numpy`` then raises a plain ``ValueError``): a client must take that for
a wrong answer and retry it elsewhere. With ``tamper`` it changes the real
answer as :class:`~harness.bad_server.BadServer` does over REST instead
(:func:`harness.bad_server.tamper`: ``short``, ``empty``, ``rename``,
``dtype``, ``shape``, ``nan``; ``model``: another ``model_name``;
``package``: ``parameters.package_sha256`` of another package; ``twice``: each
output answered twice, first with NaNs), each tensor
re-encoded with its new datatype and shape. The protobuf messages are
kserve's (this runs in the test process, where kserve is, never beside
``tritonclient.grpc``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from harness.bad_server import OTHER_PACKAGE
from harness.bad_server import tamper as tamper_outputs
from histoserve import wire


class BadGrpcServer:
    """``grpc://127.0.0.1:<port>`` in front of ``upstream`` (a real server's ``host:port``).

    Every call is forwarded as raw bytes; the answers of the first ``times``
    ``ModelInfer`` calls (None: all) have each raw output buffer cut by
    ``cut_bytes`` (``tampered`` counts them), or, with ``pad_bytes``, grown by
    that many zeros (an answer far larger than its request can need).
    """

    def __init__(
        self,
        upstream: str,
        cut_bytes: int = 4,
        times: int | None = None,
        pad_bytes: int = 0,
        *,
        tamper: str | None = None,
        after: int = 0,
    ):
        from concurrent import futures

        import grpc

        self.cut_bytes, self.times, self.tampered = cut_bytes, times, 0
        self.pad_bytes, self.tamper, self.after = pad_bytes, tamper, after
        self.infer_calls = 0
        self._lock = threading.Lock()
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self._channel = grpc.insecure_channel(upstream, options=options)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), handlers=[_AllUnary(self)], options=options
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def url(self) -> str:
        """``grpc://127.0.0.1:<port>``."""
        return f"grpc://127.0.0.1:{self.port}"

    def call(self, method: str, request: bytes, context: Any) -> bytes:
        """Forwards one call; cuts the raw outputs of an inference answer when due."""
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

        answer = self._channel.unary_unary(method)(request, timeout=context.time_remaining())
        if not method.endswith("/ModelInfer"):
            return answer
        with self._lock:
            self.infer_calls += 1
            if self.infer_calls <= self.after:
                return answer
            if self.times is not None and self.tampered >= self.times:
                return answer
            self.tampered += 1
        message = pb.ModelInferResponse.FromString(answer)
        if self.tamper is not None:
            return _tampered(message, self.tamper).SerializeToString()
        if self.pad_bytes:
            cut = [raw + bytes(self.pad_bytes) for raw in message.raw_output_contents]
        else:
            cut = [raw[: max(0, len(raw) - self.cut_bytes)] for raw in message.raw_output_contents]
        del message.raw_output_contents[:]
        message.raw_output_contents.extend(cut)
        return message.SerializeToString()

    def stop(self) -> None:
        """Stops serving; closes the upstream channel."""
        self._server.stop(grace=None)
        self._channel.close()

    def __enter__(self) -> BadGrpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _AllUnary:
    """A gRPC generic handler: every unary-unary method, bytes in and out, to ``fake.call``."""

    def __init__(self, fake: BadGrpcServer):
        self._fake = fake

    def service(self, details: Any) -> Any:
        import grpc

        method = details.method
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self._fake.call(method, request, context)
        )


def _tampered(message: Any, kind: str) -> Any:
    """``message`` (a ``ModelInferResponse`` with raw outputs) changed as ``kind`` says."""
    outputs = {
        out.name: np.frombuffer(raw, wire.DATATYPES[out.datatype]).reshape(tuple(out.shape))
        for out, raw in zip(message.outputs, message.raw_output_contents, strict=True)
    }
    changed = tamper_outputs(kind, outputs)
    del message.outputs[:]
    del message.raw_output_contents[:]
    for name, values in changed.items():
        copies = [tamper_outputs("nan", {name: values})[name]] if kind == "twice" else []
        for copy in [*copies, values]:  # twice: first with NaNs, then right
            entry = message.outputs.add()
            entry.name, entry.datatype = name, wire.datatype_of(copy)
            entry.shape.extend(copy.shape)
            message.raw_output_contents.append(np.ascontiguousarray(copy).tobytes())
    if kind == "model":
        message.model_name = "another-model"
    if kind == "package":
        message.parameters["package_sha256"].string_param = OTHER_PACKAGE
    return message
