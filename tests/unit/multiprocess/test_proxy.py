"""A front end's batcher proxies over one link: every future settled once, each model its own."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from predictor.errors import ForwardError, ModelNotReady, Overloaded
from predictor.multiprocess.messages import frame, read_frame
from predictor.multiprocess.proxy import OwnerLink
from predictor.multiprocess.shm import Slab, layout_for


def _item(seed: int) -> SimpleNamespace:
    tile = np.full((8, 8, 3), seed, dtype=np.uint8)
    return SimpleNamespace(sample=SimpleNamespace(tile=tile, extra_tensors={}),
                           request=SimpleNamespace(index=0), trace=None)  # fmt: skip


def _slab(slots: int = 4) -> Slab:
    return Slab.create(layout_for(tile_size=8, extra_bytes=0, output_bytes=16, slots=slots))


async def _submit_then_stop() -> tuple[list[BaseException | None], list[str], bool]:
    slab = _slab()
    ours, owner_end = socket.socketpair()
    gone: list[str] = []
    link = OwnerLink(ours, on_owner_gone=lambda: gone.append("gone"))
    proxy = link.proxy("m", slab, 1.0)
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
    slab = _slab(1)
    try:
        proxy = OwnerLink(ours).proxy("m", slab, 1.0)
        assert proxy.close_nowait() == []
        with pytest.raises(OSError):
            ours.send(b"x")
    finally:
        other.close()
        slab.close()


async def _answered_badly_then_well() -> tuple[list[BaseException | None], list[Any], int]:
    slab = _slab()
    ours, owner_end = socket.socketpair()
    rejected: list[int] = []
    proxy = OwnerLink(ours).proxy("m", slab, 1.0, on_reject=rejected.append)
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


async def _two_models_on_one_link() -> dict[str, Any]:
    slabs = {"a": _slab(), "b": _slab()}
    ours, owner_end = socket.socketpair()
    link = OwnerLink(ours)
    proxies = {name: link.proxy(name, slab, 1.0) for name, slab in slabs.items()}
    try:
        for proxy in proxies.values():
            await proxy.start()  # the link starts once
        reader, writer = await asyncio.open_unix_connection(sock=owner_end)
        a = proxies["a"].submit([_item(1)])
        b = proxies["b"].submit([_item(2)], key="embedding", priority=2)
        sent = [await read_frame(reader), await read_frame(reader)]
        out = slabs["b"].write_outputs(0, {"embedding": np.full(4, 2, np.float32)})
        writer.write(frame(("state", "a", 7, False)))  # model a's device is lost
        writer.write(frame(("done", 1, 3, True, [("ok", out)])))
        (answer,) = await asyncio.gather(*b)
        health = {name: (p.healthy, p.queue_depth) for name, p in proxies.items()}
        first_close = proxies["a"].close_nowait()  # b still open: the link stays
        last_close = proxies["b"].close_nowait()
        await asyncio.gather(*last_close)
        writer.close()
        return {
            "sent": [(m[0], m[1], m[2], m[3], m[4]) for m in sent if m is not None],
            "answer": answer.outputs["embedding"],
            "health": health,
            "a_failed": type(a[0].exception()),
            "closes": (first_close, len(last_close)),
        }
    finally:
        for slab in slabs.values():
            slab.close()


def test_each_model_s_submit_names_it_and_its_answer_and_state_reach_its_proxy():
    got = asyncio.run(_two_models_on_one_link())
    assert got["sent"] == [("submit", 0, "a", None, 1), ("submit", 1, "b", "embedding", 2)]
    np.testing.assert_array_equal(got["answer"], np.full(4, 2, np.float32))
    assert got["health"] == {"a": (False, 7), "b": (True, 3)}
    assert got["a_failed"] is ModelNotReady  # unanswered when the link closed with the last
    assert got["closes"] == ([], 1)
