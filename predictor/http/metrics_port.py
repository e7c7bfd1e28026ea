"""``--metrics_port``: the Prometheus ``/metrics`` on a port of its own.

``/metrics`` is always served on the HTTP inference port as well (KServe's
route); a port that carries nothing else lets a NetworkPolicy admit the
scraper to the metrics without admitting it to the model. The listener is a
small threaded WSGI server on a daemon thread, started by the process that
owns the model (the only process, or under ``--frontends N`` the device
owner: the front ends never start one), so it answers while the model loads,
serves and drains, and goes with the process.

What it serves is what the inference port's ``/metrics`` serves: the global
registry, or with ``PROMETHEUS_MULTIPROC_DIR`` set (several front ends) the
series of every process of the pod summed, as the front ends' route does.
Any other path is a 404.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from predictor.errors import ConfigError

METRICS_PATH = "/metrics"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class MetricsPortConfig:
    """Where the metrics listener listens.

    Attributes:
        port: TCP port; 0 means no listener (``/metrics`` on the HTTP port only).
        host: Address to bind; ``None``: every interface (as the HTTP port).
    """

    port: int = 0
    host: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--metrics_port must be 0 (off) or a TCP port, got {self.port}")

    @property
    def enabled(self) -> bool:
        """Whether a listener is wanted."""
        return self.port != 0


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape, none outliving the process."""

    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    """No access-log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def registry() -> Any:
    """The registry the inference port's ``/metrics`` exposes (summed over processes if several)."""
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

    if not os.environ.get(MULTIPROC_ENV):
        return REGISTRY
    summed = CollectorRegistry()
    multiprocess.MultiProcessCollector(summed)
    return summed


def metrics_app(source: Any) -> Callable[[dict, Callable], Iterable[bytes]]:
    """A WSGI app answering ``GET /metrics`` from ``source`` and 404 elsewhere."""
    from prometheus_client import make_wsgi_app

    metrics = make_wsgi_app(source)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are at /metrics\n"]
        return metrics(environ, start_response)

    return app


class MetricsListener:
    """A running metrics listener; :meth:`close` stops it (the process exit does too)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread):
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The bound port (the asked one, or the kernel's pick for 0 in tests)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stops serving and closes the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_metrics_listener(config: MetricsPortConfig) -> MetricsListener:
    """Binds ``config.port`` and serves ``/metrics`` on a daemon thread.

    Raises:
        ConfigError: The port cannot be bound (in use, no permission): a
            start-up error, one line, exit 2.
    """
    host = config.host if config.host is not None else "0.0.0.0"
    server_class = _server_class(host)
    try:
        server = make_server(
            host, config.port, metrics_app(registry()), server_class, _QuietHandler
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on --metrics_port {config.port}: {exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="metrics-port", daemon=True)
    thread.start()
    return MetricsListener(server, thread)


def _server_class(host: str) -> type[WSGIServer]:
    """The threading server for ``host``'s address family (IPv6 for an address with a colon)."""
    import socket

    if ":" not in host:
        return _ThreadingServer
    return type("_ThreadingServer6", (_ThreadingServer,), {"address_family": socket.AF_INET6})


def maybe_start(port: int, host: str | None) -> MetricsListener | None:
    """The listener for ``--metrics_port``/``--bind_address``, or None when the port is 0."""
    config = MetricsPortConfig(port=port, host=host)
    return start_metrics_listener(config) if config.enabled else None
