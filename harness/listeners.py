"""Which addresses listen on a TCP port of this host: what a bind-address test checks.

Read from the kernel's socket tables (``psutil``, as ``ss -ltn`` shows them),
so a test sees every listener of a port, the server's front ends and gRPC's
IPv6 socket included, not only the one it connected to.
"""

from __future__ import annotations

import ipaddress

import psutil


def listening_addresses(port: int) -> list[str]:
    """The local address of every TCP socket listening on ``port``, sorted."""
    return sorted(
        conn.laddr.ip
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    )


def is_loopback(address: str) -> bool:
    """Whether ``address`` answers this host only (``127.0.0.0/8``, ``::1``, ``::ffff:127.x``)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
