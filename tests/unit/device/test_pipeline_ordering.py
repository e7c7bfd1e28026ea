"""The GPU path's orderings (issue 38), shown on the CPU with fake streams and events.

No GPU here: the fakes of :mod:`tests.unit.device.fakes` record
which stream each step ran on and every event and wait; the lanes, the
turn, the normaliser, the worker wrapper and the model's ``forward_batch``
are the real ones. Shown: a lane gives the turn back before it builds its
answers (and only then waits for its event); a staging buffer is never
rewritten before its copy's event; a warm-up failure other than an OOM
fails start-up, after a device sync, and a warm-up OOM is not counted
against the next batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from predictor.codecs.samples import ModelResponse, PreparedSample
from predictor.device.failures import classify_error
from predictor.device.normalizer import Normalizer, fused_normalise
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from predictor.errors import ErrorKind, StartupError
from predictor.model.options import ServingOptions
from predictor.model.served_package import ServedPackage
from predictor.model.tiles import TileFamily
from predictor.runtime.device_context import use_device_context
from tests.unit.device.fakes import (
    SHIM,
    SPEC,
    STICKY,
    FakeGpuPackage,
    Log,
    Nowhere,
    Stats,
    pipelined,
    tiles,
)


class Hooks(TileFamily):
    """The tile family's hooks; building the answers logs whether the instance's turn is held."""

    log: Log
    devices: DeviceWorkers

    def build_responses(self, outputs: Sequence[np.ndarray], mode: str) -> list[ModelResponse]:
        turn = self.devices.current().lane.turn  # type: ignore[union-attr]
        self.log.add(f"build responses, turn {'held' if turn.held else 'free'}")
        return super().build_responses(outputs, mode)


def test_a_lane_gives_the_turn_back_before_it_waits_and_builds_the_answers() -> None:
    log = Log()
    workers, slot = pipelined(log)
    hooks = Hooks(SPEC, ServingOptions(), ServedPackage(slot.package))  # type: ignore[arg-type]
    hooks.log, hooks.devices = log, workers

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        active = workers.current()
        assert active is not None
        return hooks.forward_batch(samples, [None] * len(samples), mode, active)  # type: ignore[arg-type]

    runs = workers.runs("cpu", slot, forward, instances=1, max_batch=4)
    log.local.label = "a"
    answers = runs["cpu#a"]([PreparedSample(tile=t) for t in tiles(3)], "embedding")
    assert len(answers) == 3 and answers[2].outputs["embedding"].shape == (4,)
    steps = [s[1] for s in log.steps]
    keep = next(s for s in steps if s.startswith("keep on "))
    compute = keep.removeprefix("keep on ")
    done = steps.index(f"record {compute}")
    waited = steps.index(f"host waits for event of {compute}")
    built = steps.index("build responses, turn free")
    assert steps.index(keep) < done < waited < built  # queued, event, turn back, wait, answers
    assert f"sync {compute}" not in steps  # the compute stream is never drained for it


def test_a_batch_that_never_releases_keeps_the_turn_until_its_stream_is_synchronised() -> None:
    """A family without :meth:`DeviceSlot.settle` (or a ``.cpu()`` override): the serial order."""
    log = Log()
    workers, slot = pipelined(log)

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        x = workers.current().normalizer(samples)  # type: ignore[union-attr]
        turn = workers.current().lane.turn  # type: ignore[union-attr]
        log.add(f"answers, turn {'held' if turn.held else 'free'}")
        return list(x)

    runs = workers.runs("cpu", slot, forward, instances=1, max_batch=2)
    runs["cpu#b"](tiles(2), None)
    steps = [s[1] for s in log.steps]
    compute = next(s for s in steps if s.startswith("keep on ")).removeprefix("keep on ")
    assert steps.index("answers, turn held") < steps.index(f"sync {compute}")


def test_a_batch_moved_to_the_device_by_the_family_takes_the_turn_too() -> None:
    """The slide family stages its features itself: :meth:`DeviceSlot.staged`, then settle."""
    log = Log()
    workers, slot = pipelined(log)
    seen: list[str] = []

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        own = workers.current()
        assert own is not None and own.lane is not None
        for _ in range(2):  # two slides in one batch: each computes in turn, then releases
            own.staged(torch.zeros(3, 8))
            seen.append("held" if own.lane.turn.held else "free")
            own.settle()
            seen.append("held" if own.lane.turn.held else "free")
        return samples

    workers.runs("cpu", slot, forward, instances=1, max_batch=2)["cpu#a"]([1], None)
    assert seen == ["held", "free", "held", "free"]
    steps = [s[1] for s in log.steps]
    assert sum(s.startswith("keep on ") for s in steps) == 2


class Fence:
    """A fake copy stream for one normaliser: events stay pending until waited for."""

    def __init__(self, normalizer: Normalizer) -> None:
        self.normalizer = normalizer
        self.recorded: list[int] = []
        self.waited: list[tuple[int, int]] = []  # (event, the buffer's first value then)

    def record(self) -> int:
        self.recorded.append(len(self.recorded) + 1)
        return self.recorded[-1]

    def wait_host(self, event: int) -> None:
        self.waited.append((event, int(self.normalizer.host_buffer[0, 0, 0, 0])))


def test_a_staging_buffer_is_never_rewritten_before_its_copy_event() -> None:
    normalizer = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    normalizer.reserve(4)
    fence = normalizer.fence = Fence(normalizer)
    handed: list[Any] = []
    normalizer.handoff = lambda staged, copied: handed.append(copied)
    first = [np.full((224, 224, 3), 7, dtype=np.uint8)] * 2
    second = [np.full((224, 224, 3), 9, dtype=np.uint8)] * 2
    normalizer(first)
    assert fence.recorded == [1] and fence.waited == [] and handed == [1]
    normalizer.stage(second)  # an OOM retry's second staging in one batch, say
    assert fence.waited == [(1, 7)]  # waited for copy 1 while the buffer still held batch 1
    normalizer(second)
    assert fence.waited == [(1, 7), (2, 9)] and handed == [1, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_fused_normalisation_has_the_bits_of_the_four_step_one(dtype: torch.dtype) -> None:
    """One ``addcmul`` from the permuted uint8 view into a buffer of the package's dtype."""
    normalizer = Normalizer(SPEC, torch.device("cpu"), dtype)
    batch = torch.from_numpy(np.stack(tiles(3))) + torch.arange(224, dtype=torch.uint8)[:, None]
    x = batch.permute(0, 3, 1, 2).contiguous().to(torch.float32)
    want = torch.addcmul(normalizer.shift, x, normalizer.scale).to(dtype)
    out = torch.empty((3, 3, 224, 224), dtype=dtype)
    got = fused_normalise(batch, normalizer.scale, normalizer.shift, out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, want)


def test_another_workers_normaliser_shares_the_constants_made_before_any_stream() -> None:
    first = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    twin = first.for_another_worker()
    assert twin.scale is first.scale and twin.shift is first.shift  # read only, never re-made
    twin(tiles(1))
    assert twin.host_buffer is not None and first.host_buffer is None


def _warm(failure: Exception | None, sync_error: str | None = None, stats: Stats | None = None):
    synced: list[str] = []

    def sync(device: torch.device) -> None:
        synced.append(str(device))
        if sync_error:
            raise RuntimeError(sync_error)

    def warm_up(slot: DeviceSlot, batch: int) -> None:
        if stats is not None and failure is not None:
            stats.num_ooms += 1  # the allocator counted it; the shim says only "API call failed"
        if failure is not None:
            raise failure

    workers = DeviceWorkers(
        memory_stats=stats or Stats(), pipeline=False, warm_up=warm_up, device_sync=sync
    )
    normalizer = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    slot = DeviceSlot(FakeGpuPackage(), normalizer)  # type: ignore[arg-type]

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        raise RuntimeError(SHIM)  # the first real batch fails, not for memory

    with use_device_context(Nowhere()):
        run = workers.runs("cuda:0", slot, forward, instances=1, max_batch=8)
    return run, synced


def test_a_warm_up_that_fails_fails_start_up() -> None:
    with pytest.raises(StartupError, match=r"warm-up of worker cuda:0 at batch 8 failed \(every"):
        _warm(RuntimeError(SHIM))


def test_a_warm_up_error_found_sticky_by_the_sync_says_the_device_is_unusable() -> None:
    with pytest.raises(StartupError, match="the device is unusable") as caught:
        _warm(RuntimeError(SHIM), sync_error=STICKY)
    assert STICKY in str(caught.value)


def test_a_successful_warm_up_ends_with_a_device_sync() -> None:
    _, synced = _warm(None)
    assert synced == ["cuda:0"]


def test_a_warm_up_oom_is_logged_and_not_counted_against_the_next_batch(caplog: Any) -> None:
    stats = Stats()
    run, _ = _warm(RuntimeError(SHIM), stats=stats)  # the allocator counted an OOM: split later
    assert "warm-up of worker cuda:0 at batch 8 ran out of memory" in caplog.text
    with use_device_context(Nowhere()), pytest.raises(RuntimeError) as caught:
        run([1], None)  # no OOM since the warm-up
    assert classify_error(caught.value) is ErrorKind.BATCH
