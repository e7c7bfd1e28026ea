"""A FAKE V2 gRPC server on loopback whose inference answers do not decode.

The gRPC counterpart of :class:`harness.bad_server.BadServer`, and a fake for
the same reason: the real server never answers wrong. It forwards every
unary call, as raw bytes, to a real server's gRPC port, and cuts the raw
output buffers of its ``ModelInfer`` answers short, so that an answer's shape
says more than its data holds (``tritonclient``'s ``as_numpy`` then raises a
plain ``ValueError``): a client must take that for a wrong answer and retry
it elsewhere. The protobuf messages are kserve's (this runs in the test
process, where kserve is, never beside ``tritonclient.grpc``).
"""

from __future__ import annotations

import threading
from typing import Any


class BadGrpcServer:
    """``grpc://127.0.0.1:<port>`` in front of ``upstream`` (a real server's ``host:port``).

    Every call is forwarded as raw bytes; the answers of the first ``times``
    ``ModelInfer`` calls (None: all) have each raw output buffer cut by
    ``cut_bytes`` (``tampered`` counts them), or, with ``pad_bytes``, grown by
    that many zeros (an answer far larger than its request can need).
    """

    def __init__(
        self, upstream: str, cut_bytes: int = 4, times: int | None = None, pad_bytes: int = 0
    ):
        from concurrent import futures

        import grpc

        self.cut_bytes, self.times, self.tampered = cut_bytes, times, 0
        self.pad_bytes = pad_bytes
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
            if self.times is not None and self.tampered >= self.times:
                return answer
            self.tampered += 1
        message = pb.ModelInferResponse.FromString(answer)
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
