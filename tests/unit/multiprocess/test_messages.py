"""The front end <-> device owner messages: frames, the handshake, and errors crossing."""

from __future__ import annotations

import asyncio
import socket

import pytest

from predictor import errors
from predictor.multiprocess.messages import (
    error_outcome,
    frame,
    read_frame,
    rebuild_error,
    recv_blocking,
    send_blocking,
)


def test_frames_cross_a_socket_whole_and_eof_is_none():
    async def run() -> list:
        reader = asyncio.StreamReader()
        reader.feed_data(frame(("submit", 1, "embedding", [(0, 0, [("", "|u1", (2, 2), 64)])])))
        reader.feed_data(frame(("hello", 0, 42))[:3])  # a peer that died mid-frame
        reader.feed_eof()
        return [await read_frame(reader), await read_frame(reader)]

    first, second = asyncio.run(run())
    assert first == ("submit", 1, "embedding", [(0, 0, [("", "|u1", (2, 2), 64)])])
    assert second is None


def test_the_blocking_handshake_reads_what_was_sent():
    a, b = socket.socketpair()
    with a, b:
        send_blocking(a, ("welcome", {"name": "h0-mini"}))
        assert recv_blocking(b) == ("welcome", {"name": "h0-mini"})
        a.close()
        with pytest.raises(ConnectionError):
            recv_blocking(b)


@pytest.mark.parametrize(
    "error",
    [
        errors.ForwardError("forward of a batch of 4 failed"),
        errors.DeviceLost("illegal memory access"),
        errors.ModelNotReady("draining"),
        errors.Overloaded("queue full", retry_after_s=2.5),
    ],
    ids=lambda e: type(e).__name__,
)
def test_our_errors_cross_as_themselves(error):
    kind, name, message, retry = error_outcome(error)
    rebuilt = rebuild_error(name, message, retry)
    assert kind == "error" and type(rebuilt) is type(error) and str(rebuilt) == str(error)
    assert getattr(rebuilt, "retry_after_s", None) == getattr(error, "retry_after_s", None)


def test_anything_else_is_a_failed_forward():
    rebuilt = rebuild_error(*error_outcome(KeyError("boom"))[1:])
    assert isinstance(rebuilt, errors.ForwardError) and "boom" in str(rebuilt)
