"""A FAKE front for two real servers: one URL whose package changes mid-run.

What a user sees when the package behind a URL is swapped while a run goes
on (a redeploy, a Service whose replicas are upgraded one by one): the
config said one package, later answers come from another. Two real
``python -m predictor`` servers serve the two packages; this stand-in, the
only fake part, forwards every request as raw bytes (status, the V2 headers
and body unchanged) to the first until ``switch_after`` inference requests
were forwarded, then to the second, and back to the first after
``switch_back_after`` more (None: never). Chosen over restarting one server
on the same port with another package: the switch happens at a known
request, not at whatever point a restart lands, so the test needs no timing.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler

import httpx

from harness.loopback import LoopbackHTTP
from histoserve import wire

_KEEP = ("content-type", wire.HEADER.lower(), "retry-after")


class SwitchingProxy:
    """``http://127.0.0.1:<port>`` forwarding to ``first``, then ``second`` (see the module docstring)."""

    def __init__(
        self, first: str, second: str, switch_after: int, switch_back_after: int | None = None
    ):
        self.switch_after, self.switch_back_after = switch_after, switch_back_after
        self.forwarded = [0, 0]  # inference requests each upstream got
        self._clients = [httpx.Client(base_url=u, timeout=120) for u in (first, second)]
        self._lock = threading.Lock()
        self._http = LoopbackHTTP(type("Handler", (_Handler,), {"proxy": self}))

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self._http.url

    def upstream(self, infer: bool) -> httpx.Client:
        """The server this request goes to (GETs: the one inference goes to now)."""
        with self._lock:
            done = sum(self.forwarded)
            back = self.switch_back_after
            second = done >= self.switch_after and (back is None or done < self.switch_after + back)
            if infer:
                self.forwarded[int(second)] += 1
        return self._clients[int(second)]

    def stop(self) -> None:
        """Stops serving; closes the upstream clients."""
        self._http.stop()
        for client in self._clients:
            client.close()

    def __enter__(self) -> SwitchingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    proxy: SwitchingProxy
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: object) -> None:
        return

    def _forward(self, body: bytes | None) -> None:
        client = self.proxy.upstream(infer=body is not None and self.path.endswith("/infer"))
        headers = {k: v for k, v in self.headers.items() if k.lower() in _KEEP}
        up = client.request(self.command, self.path, content=body, headers=headers)
        self.send_response(up.status_code)
        for key in _KEEP:
            if key in up.headers:
                self.send_header(key, up.headers[key])
        self.send_header("content-length", str(len(up.content)))
        self.end_headers()
        self.wfile.write(up.content)

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers.get("content-length") or 0)))
