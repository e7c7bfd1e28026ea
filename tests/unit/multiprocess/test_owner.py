"""The device owner's side of the link: one answer per submit whatever fails, depth never stale.

The model here is a stand-in with a scripted batcher (the owner only calls
``submit`` and reads ``queue_depth``, ``live`` and ``name``); the slab, the
Unix socket and the frames are the real ones.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from harness.waiting import wait_until
from predictor.errors import ForwardError, Overloaded
from predictor.multiprocess.messages import frame, read_frame, rebuild_error
from predictor.multiprocess.owner import DeviceOwner
from predictor.multiprocess.shm import Slab, layout_for


class ScriptedBatcher:
    """Hands out futures the test settles; ``refuse`` makes the next submit raise."""

    def __init__(self) -> None:
        self.queue_depth = 0
        self.refuse: Exception | None = None
        self.futures: list[asyncio.Future[Any]] = []

    def submit(
        self, items: list[Any], key: Any = None, priority: int = 1, deadline: Any = None
    ) -> list[asyncio.Future[Any]]:
        if self.refuse is not None:
            raise self.refuse
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self.futures += futures
        return futures


async def _connected(tmp_path: Path, batcher: ScriptedBatcher):
    model = SimpleNamespace(batcher=batcher, live=True, name="m")
    layout = layout_for(tile_size=4, extra_bytes=0, output_bytes=64, slots=4)
    slab = Slab.create(layout)
    info = {"models": [{"name": "m", "spec": "{}"}], "index": None}
    owner = DeviceOwner({"m": model}, [{"m": slab}], tmp_path / "owner.sock", info)  # type: ignore[dict-item]
    await owner.start()
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "owner.sock"))
    writer.write(frame(("hello", 0, 1234)))
    welcome = await read_frame(reader)
    assert welcome is not None and welcome[0] == "welcome"
    (described,) = welcome[1]["models"]
    assert (described["name"], described["slab"]) == ("m", slab.name)
    return owner, slab, reader, writer


def _submit(writer: asyncio.StreamWriter, slab: Slab, rid: int, n: int) -> None:
    items = []
    for slot in range(n):
        descs = slab.write_inputs(slot, np.full((4, 4, 3), slot, np.uint8), {})
        items.append((slot, slot, descs))
    writer.write(frame(("submit", rid, "m", "embedding", 2, None, items)))


async def _next(reader: asyncio.StreamReader, kind: str, timeout_s: float = 30.0) -> tuple:
    """The next message of ``kind`` (a generous bound: a missing message fails, a slow one not)."""
    while True:
        message = await asyncio.wait_for(read_frame(reader), timeout_s)
        assert message is not None, "the owner closed the link"
        if message[0] == kind:
            return message


def test_a_refusal_on_a_full_queue_is_followed_by_the_fresh_depth(tmp_path: Path) -> None:
    """Without the refresh a front end that saw a full queue refused everything, forever."""

    async def scenario() -> tuple[tuple, tuple]:
        batcher = ScriptedBatcher()
        owner, slab, reader, writer = await _connected(tmp_path, batcher)
        batcher.queue_depth, batcher.refuse = 64, Overloaded("queue full", retry_after_s=1)
        _submit(writer, slab, 1, 2)
        refused = await _next(reader, "done")
        batcher.queue_depth, batcher.refuse = 0, None  # the queue drained; nothing else asked
        fresh = await _next(reader, "state")  # owner.STATE_REFRESH_S on an idle machine
        writer.close()
        await owner.close()
        return refused, fresh

    refused, fresh = asyncio.run(scenario())
    assert refused[2] == 64 and {o[1] for o in refused[4]} == {"Overloaded"}
    assert fresh == ("state", "m", 0, True)


def test_outputs_that_cannot_be_written_fail_their_tile_and_the_rest_is_answered(
    tmp_path: Path,
) -> None:
    async def scenario() -> tuple:
        batcher = ScriptedBatcher()
        owner, slab, reader, writer = await _connected(tmp_path, batcher)
        _submit(writer, slab, 7, 3)
        submitted = lambda: len(batcher.futures) >= 3  # noqa: E731
        await asyncio.to_thread(wait_until, submitted, "the owner to submit the 3 tiles")
        good = SimpleNamespace(outputs={"embedding": np.ones(4, np.float32)})
        pointers = SimpleNamespace(outputs={"labels": np.array(["a", None], dtype=object)})
        broken = SimpleNamespace(outputs=None)  # .items() raises AttributeError
        for future, result in zip(batcher.futures, (good, pointers, broken), strict=True):
            future.set_result(result)
        done = await _next(reader, "done")
        writer.close()
        await owner.close()
        return done

    done = asyncio.run(scenario())
    assert done[1] == 7
    kinds = [o[0] if o[0] == "ok" else rebuild_error(*o[1:]) for o in done[4]]
    assert kinds[0] == "ok"
    assert isinstance(kinds[1], ForwardError) and "only numbers cross" in str(kinds[1])
    assert isinstance(kinds[2], ForwardError)


def test_a_submit_whose_samples_cannot_be_viewed_is_answered_with_its_failure(
    tmp_path: Path,
) -> None:
    async def scenario() -> tuple:
        owner, _, reader, writer = await _connected(tmp_path, ScriptedBatcher())
        bad = [(0, 0, [("", "|O", (4, 4, 3), 0)])]  # object dtype: never viewed
        writer.write(frame(("submit", 3, "m", "embedding", 2, None, bad)))
        done = await _next(reader, "done")
        writer.close()
        await owner.close()
        return done

    done = asyncio.run(scenario())
    assert done[1] == 3 and done[4][0][:2] == ("error", "ForwardError")


def test_the_welcome_names_each_model_s_slab_and_a_submit_to_another_model_fails_alone(
    tmp_path: Path,
) -> None:
    """Several models over one link: each submit names its model; one the owner does not
    serve is answered with its own failure and the link goes on."""

    async def scenario() -> tuple:
        batcher = ScriptedBatcher()
        owner, slab, reader, writer = await _connected(tmp_path, batcher)
        descs = slab.write_inputs(0, np.zeros((4, 4, 3), np.uint8), {})
        writer.write(frame(("submit", 5, "absent", "embedding", 1, None, [(0, 0, descs)])))
        refused = await _next(reader, "done")
        _submit(writer, slab, 6, 1)
        await asyncio.to_thread(wait_until, lambda: batcher.futures, "the owner to submit")
        batcher.futures[0].set_result(SimpleNamespace(outputs={"e": np.ones(2, np.float32)}))
        served = await _next(reader, "done")
        writer.close()
        await owner.close()
        return refused, served

    refused, served = asyncio.run(scenario())
    assert refused[1] == 5 and refused[4][0][:2] == ("error", "ModelNotReady")
    assert "'absent'" in refused[4][0][2]
    assert served[1] == 6 and served[4][0][0] == "ok"
