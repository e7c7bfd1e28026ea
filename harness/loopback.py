"""A plain HTTP server on a free loopback port, serving from a thread: for test fakes.

The fakes that stand in for a misbehaving server (:mod:`harness.bad_server`,
the dispatcher's scripted server) differ only in their handler; starting,
addressing and stopping one is here once.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackHTTP:
    """``handler`` served on ``127.0.0.1:<free port>`` until :meth:`stop`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        """Stops serving and closes the listening socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
