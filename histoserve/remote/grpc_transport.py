"""One server URL over V2 gRPC (``grpc://host:port``), through ``tritonclient.grpc``.

``tritonclient.grpc`` is imported only when a ``grpc://`` URL is used, and
never beside ``kserve``: both register the same protobuf symbols. Status codes
map like HTTP statuses (see :mod:`histoserve.remote.transport`): ``UNAVAILABLE``,
``RESOURCE_EXHAUSTED``, ``CANCELLED`` (a call that reached a draining server
before dispatch), ``DEADLINE_EXCEEDED``, ``ABORTED`` and ``INTERNAL`` are
retried; anything else (``INVALID_ARGUMENT``, ``NOT_FOUND``, ``FAILED_PRECONDITION``
for an output that overflowed, ...) fails the slide with the server's message.
gRPC carries no ``Retry-After``, so retries back off with jitter. Channels are
recycled like HTTP pools, so new replicas behind a Service get traffic. An
answer whose tensors cannot be decoded (a raw buffer shorter than its shape)
is a :class:`~histoserve.errors.BadAnswer`: retried, preferably
on another URL, like a wrong answer over HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from typing import Any

import numpy as np

from histoserve import jsonsafe
from histoserve.errors import BadAnswer, RemoteError, RetryableError, ServerRefused
from histoserve.remote.auth import MESSAGE_MAX_CHARS, Credentials
from histoserve.remote.http import HEADER_HEADROOM_BYTES
from histoserve.remote.request import Request
from histoserve.remote.transport import (
    DECODE_ERRORS,
    Answer,
    RecyclePolicy,
    Recycler,
)
from histoserve.tracecontext import trace_headers

RETRY_CODES = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "CANCELLED",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "INTERNAL",
        "UNKNOWN",
    }
)
_DATATYPES = {
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float16): "FP16",  # a slide head's features as stored
    np.dtype(np.int64): "INT64",  # a slide head's coords
    np.dtype(np.int32): "INT32",  # jpeg_layout, jpeg_boxes
    np.dtype(np.object_): "BYTES",  # jpeg_tiles
}
# What a request may send: 64 raw 224px tiles are ~9.6 MB; a slide head's features more.
_MAX_SEND = 2**31 - 1


def host_port(url: str) -> str:
    """``host:port`` of a ``grpc(s)://host:port`` URL."""
    return url.split("://", 1)[1].rstrip("/")


def receive_bound(max_receive_bytes: int) -> int:
    """The channel argument a receive bound of ``max_receive_bytes`` becomes."""
    return min(max_receive_bytes, 2**31 - 1)


def _client(url: str, credentials: Credentials, max_receive_bytes: int) -> Any:
    """A channel that receives at most ``max_receive_bytes`` a message and uses the
    environment's proxy only when the credentials say so (gRPC's default is to use it)."""
    import tritonclient.grpc as grpcclient

    ca = credentials.ca_cert
    return grpcclient.InferenceServerClient(
        host_port(url),
        ssl=url.startswith("grpcs://"),
        root_certificates=str(ca) if ca is not None else None,
        channel_args=[
            ("grpc.max_send_message_length", _MAX_SEND),
            ("grpc.max_receive_message_length", receive_bound(max_receive_bytes)),
            ("grpc.enable_http_proxy", int(credentials.trust_env)),
        ],
    )


def _status(exc: Exception) -> str:
    status = str(getattr(exc, "status", lambda: "")() or "")
    return status.rsplit(".", 1)[-1]


_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


def _wrap(
    url: str, exc: Exception, credentials: Credentials, own_bounds: Container[int] = ()
) -> RemoteError:
    """The error tree's member for a failed call.

    gRPC words a message over a receive bound the same way on either side
    ("larger than max (N vs. M)"): when ``M`` is one of this client's own
    receive bounds (``own_bounds``) the server's answer was too large (a wrong
    answer, retried); otherwise the server refused the request's size, which
    no retry changes (a :class:`ServerRefused`, as HTTP 413 is).
    """
    code = _status(exc)
    message = exc.message() if hasattr(exc, "message") else str(exc)
    message = credentials.scrub(str(message), MESSAGE_MAX_CHARS)
    too_large = _TOO_LARGE.search(message) if code == "RESOURCE_EXHAUSTED" else None
    if too_large and int(too_large.group(2)) in own_bounds:
        return BadAnswer(f"{url}: an answer larger than this request can need ({message})")
    if too_large:
        return ServerRefused(
            f"gRPC {code}", f"the request is larger than the server accepts: {message}", code
        )
    if code in RETRY_CODES or not code:
        return RetryableError(f"{url}: gRPC {code or 'error'}: {message}", status=code or None)
    return ServerRefused(f"gRPC {code}", message, code)


class GrpcTransport:
    """V2 gRPC inference to one ``grpc://host:port``.

    Args:
        url: ``grpc://host:port``, or ``grpcs://host:port`` for TLS.
        timeout_s: Per-call deadline.
        policy: Channel recycling.
        credentials: CA bundle and metadata (token) for every call.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float,
        policy: RecyclePolicy,
        credentials: Credentials | None = None,
    ):
        self.url = url
        self._timeout_s = timeout_s
        creds = self._credentials = credentials or Credentials()
        self._max_receive = HEADER_HEADROOM_BYTES
        """The largest answer any request so far could need: the channels' receive bound."""
        self._own_bounds = {receive_bound(self._max_receive)}
        """Every receive bound a channel of this transport was opened with."""
        self._recycler = Recycler(
            lambda: _client(url, creds, self._max_receive), lambda c: c.close(), policy
        )

    @property
    def pools_opened(self) -> int:
        """Channels opened so far."""
        return self._recycler.pools_opened

    def send(self, request: Request) -> Any:
        """The answer to ``request`` (as :class:`~histoserve.remote.transport.HttpTransport`'s).

        ``config`` is the ``ModelConfig`` call (tritonclient's ``get_model_config``):
        a histoserve server answers its config's keys as the config's
        parameters, each a JSON text; ``models`` is ``RepositoryIndex``.
        """
        if request.kind == "infer":
            return self._infer(request)
        return self._call(request)

    def _call(self, request: Request) -> Any:
        """A describing call (every kind but ``infer``) over the current channel."""
        from tritonclient.utils import InferenceServerException

        self._fit_receive(request.max_answer_bytes)
        pool = self._recycler.acquire()
        kwargs = {
            "headers": self._credentials.grpc_metadata() or None,
            "client_timeout": self._timeout_s,
        }
        try:
            client = pool.client
            if request.kind == "ready":
                return bool(client.is_server_ready(**kwargs))
            if request.kind == "models":
                index = client.get_model_repository_index(as_json=True, **kwargs)
                return [str(m["name"]) for m in index.get("models", ()) if "name" in m]
            if request.kind == "metadata":
                return dict(client.get_model_metadata(request.model, as_json=True, **kwargs))
            answer = client.get_model_config(request.model, as_json=True, **kwargs)
            return config_of_parameters(self.url, request.model, answer)
        except InferenceServerException as exc:
            error = _wrap(self.url, exc, self._credentials, self._own_bounds)
            if isinstance(error, RetryableError):
                self._recycler.discard(pool)
            raise error from exc
        except DECODE_ERRORS as exc:
            message = self._credentials.scrub(str(exc), MESSAGE_MAX_CHARS)
            raise BadAnswer(f"{self.url}: malformed {request.kind} answer: {message}") from exc
        finally:
            self._recycler.release(pool)

    def _fit_receive(self, max_answer_bytes: int) -> None:
        """A new channel when this call may need a larger answer than the current one takes."""
        if max_answer_bytes > self._max_receive:
            self._max_receive = max_answer_bytes
            self._own_bounds.add(receive_bound(max_answer_bytes))
            self._recycler.retire_current()

    def _infer(self, request: Request) -> Answer:
        """One ``ModelInfer`` call; returns ``{output: array}`` (same errors as HTTP).

        The call's deadline is ``timeout_s``; the channel refuses an answer
        larger than the largest any request so far could need (a new channel
        is opened when this request may need more).
        """
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        model, inputs, parameters = request.model, request.inputs, request.parameters
        infer_inputs = []
        for name, array in inputs.items():
            array = np.ascontiguousarray(array)
            item = grpcclient.InferInput(name, list(array.shape), _DATATYPES[array.dtype])
            item.set_data_from_numpy(array)
            infer_inputs.append(item)
        self._fit_receive(request.max_answer_bytes)
        asked = dict(parameters)
        # tritonclient reserves these names: it sends them in their own fields, as Triton reads them
        reserved = {k: asked.pop(k) for k in ("priority", "timeout") if k in asked}
        pool = self._recycler.acquire()
        try:
            result = pool.client.infer(
                model,
                infer_inputs,
                parameters=asked or None,
                **reserved,
                client_timeout=self._timeout_s,
                headers={**self._credentials.grpc_metadata(), **trace_headers()} or None,
            )
        except InferenceServerException as exc:
            error = _wrap(self.url, exc, self._credentials, self._own_bounds)
            if isinstance(error, RetryableError):
                self._recycler.discard(pool)
            raise error from exc
        finally:
            self._recycler.release(pool)
        return self._decode(result)

    def _decode(self, result: Any) -> Answer:
        """The outputs and identity of an ``InferResult``; BadAnswer when they do not decode."""
        try:
            response = result.get_response()
            outputs = {}
            for out in response.outputs:
                if out.name in outputs:
                    raise ValueError(f"output {out.name!r} is answered twice")
                values = result.as_numpy(out.name)
                if out.datatype != "BYTES" and values.dtype.kind not in "biuf":
                    raise ValueError(
                        f"output {out.name!r}: {out.datatype} data that are not numbers"
                    )
                outputs[out.name] = values
            identity = {
                "model_name": response.model_name,
                "model_version": response.model_version,
                "parameters": {
                    k: getattr(v, v.WhichOneof("parameter_choice") or "string_param")
                    for k, v in response.parameters.items()
                },
            }
        except DECODE_ERRORS as exc:
            message = self._credentials.scrub(str(exc), MESSAGE_MAX_CHARS)
            raise BadAnswer(f"{self.url}: malformed answer: {message}") from exc
        return Answer(outputs, identity)

    def close(self) -> None:
        """Closes the channel."""
        self._recycler.close()


def config_of_parameters(url: str, model: str, answer: Any) -> dict[str, Any]:
    """The config a ``ModelConfig`` answer carries: its parameters, each a JSON text.

    Raises:
        BadAnswer: A parameter that is no JSON text, or none at all (a server
            that answers ``ModelConfig`` but not with histoserve's config).
    """
    config = answer.get("config") if isinstance(answer, Mapping) else None
    parameters = config.get("parameters") if isinstance(config, Mapping) else None
    if not isinstance(parameters, Mapping) or not parameters:
        raise BadAnswer(
            f"{url}: the ModelConfig of {model!r} carries no parameters (histoserve's server "
            "answers its config there: spec, package_sha256, outputs)"
        )
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        text = value.get("string_value") if isinstance(value, Mapping) else None
        if not isinstance(text, str):
            raise BadAnswer(f"{url}: ModelConfig parameter {key!r} of {model!r} is no string")
        try:
            out[str(key)] = jsonsafe.loads(text, f"{url} ModelConfig {key}")
        except ValueError as exc:
            raise BadAnswer(f"{url}: ModelConfig parameter {key!r} of {model!r}: {exc}") from exc
    return out
