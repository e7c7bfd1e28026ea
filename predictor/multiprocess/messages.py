"""The small messages between a front end and the device owner, and how errors cross.

Frames on a Unix stream socket: a 4-byte big-endian length, then a pickled
tuple of plain values (names, numbers, array descriptors). Pixels and
outputs never travel here: they are in the shared-memory slab
(:mod:`predictor.multiprocess.shm`). Pickle is safe here because both ends are
processes of one pod started by the same supervisor, on a socket in a
private folder.

Messages, ``(kind, ...)``:

- front end -> owner: ``("hello", index, pid)`` once; ``("submit", rid, model,
  mode, priority, deadline, [(slot, request index, [ArrayDesc, ...]), ...],
  traceparent)`` per request (``rid`` unique on the link; ``deadline`` on
  ``time.monotonic()``, one clock for the pod's processes, or None;
  ``traceparent``: the W3C one of a traced request's span, else ``None``);
  ``("ready",)`` once it serves.
- owner -> front end: ``("welcome", info)`` once (every model's description
  and slab, the repository's index); ``("done", rid, queue_depth, live,
  [outcome, ...])`` per submit (the depth and liveness of its model), where an
  outcome is ``("ok", [ArrayDesc, ...])`` or ``("error", class name, message,
  retry_after_s)``; ``("state", model, queue_depth, live)`` when a front end's
  word on a model is stale (a lower depth, another liveness).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import struct
from typing import Any

from predictor import errors

logger = logging.getLogger("histoserve")

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20
"""Descriptors only: far more than any request's; a bigger length is a broken peer."""

_ERRORS = {
    cls.__name__: cls
    for cls in (
        errors.ForwardError,
        errors.DeviceLost,
        errors.ModelNotReady,
        errors.QueueTimeout,
        errors.Unavailable,
        errors.InvalidInput,
        errors.NonFiniteOutput,
    )
}


def frame(message: tuple[Any, ...]) -> bytes:
    """``message`` as one length-prefixed frame."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class FrameWriter:
    """Sends messages on a stream, every message of one loop iteration in one write.

    Under load a front end submits, and the owner answers, many requests per
    event-loop iteration: one ``write`` (one system call, one wake-up of the
    peer) for all of them instead of one each.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._frames: list[bytes] = []

    def send(self, message: tuple[Any, ...]) -> None:
        """Queues ``message``; it leaves at the end of this loop iteration."""
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame(message))

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if not self._writer.is_closing():
            self._writer.write(b"".join(frames))

    def close(self) -> None:
        """Closes the stream (what is queued is dropped)."""
        self._writer.close()

    @property
    def closing(self) -> bool:
        """True once the stream is closing."""
        return self._writer.is_closing()


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None once the peer closed the connection or sent what is not ours.

    A frame that does not unpickle to a tuple ends the link as a closed
    connection would: what the peer still owes is failed by the caller, never
    waited for.
    """
    try:
        head = await reader.readexactly(_LENGTH.size)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_FRAME_BYTES:
            raise ConnectionError(f"frame of {length} bytes from the peer: not ours")
        message = pickle.loads(await reader.readexactly(length))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    except Exception:  # a frame that does not unpickle: a broken peer
        logger.exception("a frame from the peer does not unpickle; closing the link")
        return None
    if not isinstance(message, tuple) or not message:
        logger.error("a frame from the peer is not a message: %r", type(message).__name__)
        return None
    return message


def send_blocking(sock: socket.socket, message: tuple[Any, ...]) -> None:
    """Writes one frame on a blocking socket (the start-up handshake)."""
    sock.sendall(frame(message))


def recv_blocking(sock: socket.socket) -> tuple[Any, ...]:
    """Reads one frame from a blocking socket (the start-up handshake).

    Raises:
        ConnectionError: The peer closed before a whole frame arrived.
    """
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    return pickle.loads(_recv_exactly(sock, length))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("the device owner closed the connection during the handshake")
        chunks += chunk
    return bytes(chunks)


def error_outcome(exc: BaseException) -> tuple[str, str, str, float]:
    """How a tile's failure crosses: its class name, message and ``Retry-After``."""
    retry = float(getattr(exc, "retry_after_s", 0.0) or 0.0)
    return ("error", type(exc).__name__, str(exc), retry)


def rebuild_error(name: str, message: str, retry_after_s: float) -> Exception:
    """The error a front end raises for an outcome: the same class, or a 503 failure.

    Anything the owner raised that is not one of ours is a failed forward
    (a 503 for that batch), as it is in one process.
    """
    if name == "Overloaded":
        return errors.Overloaded(message, retry_after_s=retry_after_s or 1.0)
    cls = _ERRORS.get(name, errors.ForwardError)
    return cls(message)
