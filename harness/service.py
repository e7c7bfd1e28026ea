"""A FAKE Kubernetes Service on loopback: a TCP proxy over real replicas' ports.

The stand-in for a ClusterIP Service (kube-proxy): connections, not requests,
are balanced, round robin over the ready endpoints, skipping one that refuses
connections (as kube-proxy skips endpoints that are not ready). Endpoints are
added when a replica becomes ready and removed when it is told to stop
(Kubernetes takes a terminating pod out of the endpoints while it drains), so
an autoscaler stand-in can change them under load. With ``hold_s`` > 0 a
connection that finds no endpoint waits up to that long for one, as Knative's
activator buffers requests while a revision scales from zero; :attr:`waiting`
counts those held connections (the activator's demand signal).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class LoopbackService:
    """``127.0.0.1:<port>`` piping each connection to one of ``backends`` (see the module docstring)."""

    def __init__(self, backends: list[int], hold_s: float = 0.0) -> None:
        self.backends = list(backends)
        self.connections = {port: 0 for port in backends}
        self.waiting = 0
        self.hold_s = hold_s
        self._next = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def add(self, port: int) -> None:
        """A replica became ready: new connections may go to ``port``."""
        with self._changed:
            self.backends.append(port)
            self.connections.setdefault(port, 0)
            self._changed.notify_all()

    def remove(self, port: int) -> None:
        """A replica is terminating: no new connection goes to ``port`` (open ones stay)."""
        with self._lock:
            if port in self.backends:
                self.backends.remove(port)

    def close(self) -> None:
        """Stops accepting; piped connections run until either side closes."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _hold(self) -> list[int]:
        """The endpoints now; with none, waits up to ``hold_s`` for one (the activator)."""
        with self._changed:
            if not self.backends and self.hold_s > 0:
                self.waiting += 1
                try:
                    self._changed.wait_for(lambda: bool(self.backends), timeout=self.hold_s)
                finally:
                    self.waiting -= 1
            start, self._next = self._next, self._next + 1
            ports = list(self.backends)
        return ports[start % len(ports) :] + ports[: start % len(ports)] if ports else []

    def _connect(self) -> socket.socket | None:
        for port in self._hold():
            with contextlib.suppress(OSError):
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
                upstream.settimeout(None)
                with self._lock:
                    self.connections[port] += 1
                return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(1 << 16):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
