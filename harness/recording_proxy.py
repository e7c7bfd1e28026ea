"""A FAKE forward HTTP proxy on loopback that records what crosses it.

A fake because a hospital's proxy cannot be had here; everything else is real:
stdlib ``http.server`` on a real socket, forwarding absolute-URI requests
(``GET http://host:port/path``) with httpx. Each request's method, URL and
headers are kept in :attr:`RecordingProxy.seen`, so a test can say whether a
token ever reached it.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from harness.loopback import LoopbackHTTP


class RecordingProxy:
    """``http://127.0.0.1:<port>``: forwards every request, records it first."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=120, trust_env=False)
        self._http = LoopbackHTTP(type("Handler", (_Handler,), {"proxy": self}))

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self._http.url

    def stop(self) -> None:
        """Stops serving."""
        self._http.stop()
        self._client.close()

    def __enter__(self) -> RecordingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    proxy: RecordingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.proxy._lock:
            self.proxy.seen.append(
                {"method": self.command, "url": self.path, "headers": dict(self.headers)}
            )
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")
        }
        up = self.proxy._client.request(self.command, self.path, content=body, headers=headers)
        self.send_response(up.status_code)
        for key, value in up.headers.items():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("content-length", str(len(up.content)))
        self.end_headers()
        self.wfile.write(up.content)

    do_GET = do_POST = _forward
