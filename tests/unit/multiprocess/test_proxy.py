"""The front end's batcher proxy: its stop settles every future it handed out."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from predictor.errors import ForwardError, ModelNotReady, Overloaded
from predictor.multiprocess.messages import frame
from predictor.multiprocess.proxy import BatcherProxy
from predictor.multiprocess.shm import Slab, layout_for


def _item(seed: int) -> SimpleNamespace:
    tile = np.full((8, 8, 3), seed, dtype=np.uint8)
    return SimpleNamespace(sample=SimpleNamespace(tile=tile, extra_tensors={}),
                           request=SimpleNamespace(index=0))  # fmt: skip


async def _submit_then_stop() -> tuple[list[BaseException | None], list[str], bool]:
    layout = layout_for(tile_size=8, extra_bytes=0, output_bytes=16, slots=4)
    slab = Slab.create(layout)
    ours, owner_end = socket.socketpair()
    gone: list[str] = []
    proxy = BatcherProxy(ours, slab, "m", 1.0, on_owner_gone=lambda: gone.append("gone"))
    try:
        await proxy.start()
        futures = proxy.submit([_item(1), _item(2)])
        tasks = proxy.close_nowait()  # as ``BaseServerModel.stop`` calls it, no answer came
        await asyncio.gather(*tasks)
        errors = [f.exception() if f.done() else None for f in futures]
        return errors, gone, proxy.healthy
    finally:
        owner_end.close()
        slab.close()


def test_close_nowait_fails_what_is_unanswered_and_raises_no_alarm():
    errors, gone, healthy = asyncio.run(_submit_then_stop())
    assert [type(e) for e in errors] == [ModelNotReady, ModelNotReady]
    assert gone == [] and healthy is False


def test_close_nowait_after_the_loop_closed_only_closes_the_socket():
    ours, other = socket.socketpair()
    layout = layout_for(tile_size=8, extra_bytes=0, output_bytes=16, slots=1)
    slab = Slab.create(layout)
    try:
        proxy = BatcherProxy(ours, slab, "m", 1.0)
        assert proxy.close_nowait() == []
        with pytest.raises(OSError):
            ours.send(b"x")
    finally:
        other.close()
        slab.close()


async def _answered_badly_then_well() -> tuple[list[BaseException | None], list[Any], int]:
    layout = layout_for(tile_size=8, extra_bytes=0, output_bytes=16, slots=4)
    slab = Slab.create(layout)
    ours, owner_end = socket.socketpair()
    rejected: list[int] = []
    proxy = BatcherProxy(ours, slab, "m", 1.0, on_reject=rejected.append)
    try:
        await proxy.start()
        first = proxy.submit([_item(1), _item(2)])
        second = proxy.submit([_item(3)])
        with pytest.raises(Overloaded):
            proxy.submit([_item(4), _item(5)])  # one slot left: refused for want of slots
        _, writer = await asyncio.open_unix_connection(sock=owner_end)
        pointer = ("embedding", "|O", (2,), 0)
        writer.write(frame(("done", 0, 0, True, [("ok", [pointer]), ("ok", [pointer])])))
        out = slab.write_outputs(3, {"embedding": np.arange(4, dtype=np.float32)})
        writer.write(frame(("done", 1, 0, True, [("ok", out)])))
        results = await asyncio.gather(*first, *second, return_exceptions=True)
        writer.close()
        return results[:2], [results[2]], slab.free_slots + sum(rejected)
    finally:
        slab.close()


def test_an_answer_that_cannot_be_read_fails_its_request_and_the_reader_goes_on():
    failed, served, slots_and_rejected = asyncio.run(_answered_badly_then_well())
    assert all(isinstance(e, ForwardError) for e in failed)
    assert np.array_equal(served[0].outputs["embedding"], np.arange(4, dtype=np.float32))
    assert slots_and_rejected == 4 + 2  # every slot given back; the refused tiles counted
