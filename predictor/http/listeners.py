"""Listening sockets bound once, before anything heavy: a taken port is a start-up error.

One process binds the HTTP socket itself (:func:`bind_http`) and hands it to
uvicorn; under ``--frontends N`` the supervisor binds it and every front end
inherits it (as gunicorn's and uvicorn's worker processes do), so the kernel spreads
connections over the processes that accept on it and no other server can
bind the port while any of them lives. Neither sets ``SO_REUSEPORT``.

gRPC cannot serve an inherited socket (grpcio binds its own), so front ends
bind the gRPC port with ``SO_REUSEPORT``, the mechanism gRPC documents for
several processes. The supervisor first reserves it exclusively
(:func:`reserve_shared_port`): the bind fails if any socket holds the port,
and only then is the reservation opened to its own front ends. A second
histoserve on that port, or any server binding it without ``SO_REUSEPORT``,
is refused at its start; a process of the same user that asks for
``SO_REUSEPORT`` itself can still join (the kernel's rule, not ours).
"""

from __future__ import annotations

import errno
import socket

from predictor.errors import StartupError

BACKLOG = 2048


def bind_http(host: str | None, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (``None``: every IPv4 interface).

    Created with an explicit ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on
    an accepted connection only when its socket says so, and without it a
    response written in two parts waits on the client's delayed ACK (~40 ms).

    Raises:
        StartupError: The port is taken or the address is not this host's.
    """
    sock = _bound(host, port, "HTTP")
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def reserve_shared_port(host: str | None, port: int) -> socket.socket:
    """Reserves ``port`` for this pod's front ends: bound exclusively, then opened to them.

    Bound without ``SO_REUSEADDR`` (it never listens, so there is no
    TIME_WAIT to step over, and two non-listening ``SO_REUSEADDR`` sockets
    may share a port) and without ``SO_REUSEPORT``: the bind fails if any
    socket holds the port. Unset ``host`` reserves both IPv4 and IPv6 (a
    dual-stack ``[::]``, where gRPC listens). Keep it open for the pod's life.

    Raises:
        StartupError: The port is taken or the address is not this host's.
    """
    sock = _bound(host, port, "gRPC", reuse_addr=False, dual_stack=host is None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def inherited(fd: int) -> socket.socket:
    """The listening socket a front end inherited as file descriptor ``fd``."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def _bound(
    host: str | None, port: int, what: str, *, reuse_addr: bool = True, dual_stack: bool = False
) -> socket.socket:
    if dual_stack and socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        except OSError:  # IPv6 switched off on this host
            return _bound("0.0.0.0", port, what, reuse_addr=reuse_addr)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple[str, int] = ("::", port)
    else:
        host = "0.0.0.0" if host is None else host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        address = (host, port)
    if reuse_addr:  # steps over TIME_WAIT only, never over a listener
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise StartupError(f"{what} port {address[0]}:{port}: {reason}") from exc
    return sock


def open_listeners(
    host: str | None,
    http_port: int,
    grpc_port: int,
    *,
    shared: bool,
    grpc: bool,
    inherited_http_fd: int | None = None,
) -> tuple[socket.socket, socket.socket | None]:
    """This process's HTTP socket and, for a pod of front ends, its gRPC reservation.

    Args:
        host: ``--bind_address`` (``None``: every interface).
        http_port: ``--http_port``.
        grpc_port: ``--grpc_port``.
        shared: The supervisor of several front ends (reserve the gRPC port).
        grpc: gRPC is served (``--enable_grpc``).
        inherited_http_fd: A front end's inherited HTTP socket (nothing is bound then).

    Raises:
        StartupError: A port is taken or the address is not this host's.
    """
    if inherited_http_fd is not None:
        return inherited(inherited_http_fd), None
    http = bind_http(host, http_port)
    if not (shared and grpc):
        return http, None
    try:
        return http, reserve_shared_port(host, grpc_port)
    except StartupError:
        http.close()
        raise
