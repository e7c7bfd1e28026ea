"""A protected endpoint on loopback: a test CA, and TLS proxies that demand a token.

What a lab meets in front of a cluster (an ingress with TLS and a bearer
token) built from real parts in front of a real histoserve server:

- :func:`make_pki`: a CA and a server certificate for ``127.0.0.1``/``localhost``
  (``cryptography``), written as PEM files;
- :class:`HttpsProxy`: HTTPS (``ssl``) reverse proxy to the server's REST port;
- :class:`GrpcTlsProxy`: gRPC server with ``ssl_server_credentials`` forwarding
  every unary call, as raw bytes, to the server's gRPC port.

Both refuse a request without ``Authorization: Bearer <token>`` and every
required extra header (401 / ``UNAUTHENTICATED``), can answer the first
``fail_first`` inference calls with 503 / ``UNAVAILABLE`` (so the client
retries), and record, per request, what was asked and whether it carried the
credentials: a test checks that every request, retries included, did.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "content-encoding",
}


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA's certificate, the server's certificate chain and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _certificate(subject: Any, issuer: Any, public_key: Any, signer: Any, extension: Any) -> Any:
    """An X.509 certificate valid from five minutes ago for a day, signed by ``signer``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
        .public_key(public_key).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )  # fmt: skip
    critical = isinstance(extension, x509.BasicConstraints)
    return builder.add_extension(extension, critical=critical).sign(signer, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    """A fresh CA and a server certificate for 127.0.0.1 and localhost, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "histoserve test CA")])
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    ca_ext = x509.BasicConstraints(ca=True, path_length=None)
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca_ext)
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = _certificate(server_name, ca_name, key.public_key(), ca_key, san)
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.server_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pki


@dataclass
class Seen:
    """What a proxy saw: one ``(path, authorized)`` per request, and refusals sent."""

    requests: list[tuple[str, bool]] = field(default_factory=list)
    failed_on_purpose: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, authorized: bool) -> None:
        with self.lock:
            self.requests.append((path, authorized))


class _Gate:
    """What both proxies demand and do: the credentials, then the first N refusals on purpose."""

    def __init__(self, token: str, required: Mapping[str, str] | None, fail_first: int):
        self.seen = Seen()
        self._token, self._required, self._budget = token, dict(required or {}), fail_first

    def admit(self, path: str, headers: Mapping[str, str]) -> bool:
        """Whether ``headers`` carry the token and the required headers; recorded in ``seen``."""
        lower = {k.lower(): v for k, v in headers.items()}
        ok = lower.get("authorization") == f"Bearer {self._token}" and all(
            lower.get(k.lower()) == v for k, v in self._required.items()
        )
        self.seen.add(path, ok)
        return ok

    def fail_now(self, inference: bool) -> bool:
        """Whether this inference call is one of the first ``fail_first``, refused on purpose."""
        with self.seen.lock:
            if inference and self._budget > 0:
                self._budget -= 1
                self.seen.failed_on_purpose += 1
                return True
        return False


class HttpsProxy:
    """``https://127.0.0.1:<port>`` in front of ``upstream`` (a histoserve REST base URL).

    Args:
        upstream: ``http://127.0.0.1:<port>`` of the real server.
        pki: Certificates (the server's chain and key are used here).
        token: The bearer token demanded.
        required: Extra headers demanded (name -> value).
        fail_first: Inference POSTs answered 503 (after the credentials check).
    """

    def __init__(
        self,
        upstream: str,
        pki: Pki,
        token: str,
        required: Mapping[str, str] | None = None,
        fail_first: int = 0,
    ):
        self._gate = _Gate(token, required, fail_first)
        self.seen = self._gate.seen
        self._client = httpx.Client(base_url=upstream, timeout=120)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.proxy = self  # type: ignore[attr-defined]
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pki.server_cert, pki.server_key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict, bytes]:
        """One request: 401 without the credentials, 503 on purpose, else the upstream answer."""
        if not self._gate.admit(handler.path, dict(handler.headers)):
            return 401, {"content-type": "application/json"}, b'{"error": "unauthorized"}'
        if self._gate.fail_now(handler.command == "POST" and handler.path.endswith("/infer")):
            return 503, {"retry-after": "0"}, b'{"error": "busy"}'
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        headers.pop("Authorization", None)
        up = self._client.request(handler.command, handler.path, content=body, headers=headers)
        return (
            up.status_code,
            {k: v for k, v in up.headers.items() if k.lower() not in _HOP},
            up.content,
        )

    def stop(self) -> None:
        """Stops serving and closes the upstream client."""
        self._server.shutdown()
        self._server.server_close()
        self._client.close()


class _ProxyHandler(BaseHTTPRequestHandler):
    """Hands every GET/POST to the server's :class:`HttpsProxy` (``server.proxy``)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: tests read the proxy's records
        return

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        status, headers, content = self.server.proxy.forward(self, body)  # type: ignore[attr-defined]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = _handle


class GrpcTlsProxy:
    """``grpcs://127.0.0.1:<port>`` in front of ``upstream`` (``host:port``, plain gRPC).

    Args: as :class:`HttpsProxy`; the token and headers are checked in the
    call's metadata, ``fail_first`` applies to ``ModelInfer`` calls.
    """

    def __init__(
        self,
        upstream: str,
        pki: Pki,
        token: str,
        required: Mapping[str, str] | None = None,
        fail_first: int = 0,
    ):
        import grpc

        self._gate = _Gate(token, required, fail_first)
        self.seen = self._gate.seen
        self._channel = grpc.insecure_channel(
            upstream,
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            handlers=[_Forwarder(self)],
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        creds = grpc.ssl_server_credentials(
            [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())]
        )
        self.port = self._server.add_secure_port("127.0.0.1:0", creds)
        self._server.start()

    @property
    def url(self) -> str:
        """``grpcs://127.0.0.1:<port>``."""
        return f"grpcs://127.0.0.1:{self.port}"

    def call(self, method: str, request: bytes, context: Any) -> bytes:
        """Checks the metadata, maybe fails on purpose, forwards the raw request upstream."""
        import grpc

        if not self._gate.admit(method, dict(context.invocation_metadata())):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unauthorized")
        if self._gate.fail_now(method.endswith("/ModelInfer")):
            context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
        forward = self._channel.unary_unary(method)
        try:
            return forward(request, timeout=context.time_remaining())
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
            raise  # abort raises; kept for type checkers

    def stop(self) -> None:
        """Stops the server and closes the upstream channel."""
        self._server.stop(grace=None)
        self._channel.close()


class _Forwarder:
    """A generic handler: every unary-unary method, bytes in, bytes out."""

    def __init__(self, proxy: GrpcTlsProxy):
        self._proxy = proxy

    def service(self, details: Any) -> Any:
        import grpc

        method = details.method

        def handle(request: bytes, context: Any) -> bytes:
            return self._proxy.call(method, request, context)

        return grpc.unary_unary_rpc_method_handler(handle)
