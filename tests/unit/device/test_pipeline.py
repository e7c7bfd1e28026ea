"""The CUDA worker's pipeline, warm-up and failure handling (issue 28), shown on the CPU.

No GPU here: fake streams record which stream was current for each step and
every event and wait; the normaliser, the lanes, the turn and the worker
wrapper are the real ones. What only a GPU can show (the overlap's gain) is
measured by ``make gpu-check``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from harness.waiting import wait_until
from predictor.device.normalizer import Normalizer
from predictor.device.pipeline import Turn
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from tests.unit.device.fakes import SPEC, FakePackage, FakeStream, Log, pipelined, tiles, waits_in


def test_the_next_batch_stages_and_copies_while_the_current_one_computes() -> None:
    """Lane b stacks its tiles and queues its copy during lane a's forward; forwards take turns."""
    log = Log()
    workers, slot = pipelined(log)
    in_forward, b_staged = threading.Event(), threading.Event()

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        own = workers.current()
        x = own.normalizer(samples)  # stage (copy stream), hand over, normalise (compute stream)
        log.add("forward start")
        if mode == "a":
            in_forward.set()
            assert b_staged.wait(60), "lane b did not stage during lane a's forward"
            # a's forward ends only once b waits for the turn (or, were there no turn, has
            # started its own forward: the order checked below), not after a fixed 50 ms.
            wait_until(
                lambda: waits_in(b, Turn.taken.__wrapped__) or ("b", "forward start") in log,
                "lane b to wait for the turn",
            )
        log.add("forward end")
        return list(own.package(x)[0])

    runs = workers.runs("cpu", slot, forward, instances=1, max_batch=4)
    assert list(runs) == ["cpu#a", "cpu#b"]

    def run(name: str, label: str) -> None:
        log.local.label = label
        if label == "b":
            b_done = runs[name](tiles(2), label)
            assert len(b_done) == 2
        else:
            assert len(runs[name](tiles(3), label)) == 3

    a = threading.Thread(target=run, args=("cpu#a", "a"))
    a.start()
    assert in_forward.wait(10)
    original_record = FakeStream.record

    def record_then_tell(self: FakeStream) -> str:
        event = original_record(self)
        if getattr(log.local, "label", "") == "b":
            b_staged.set()
        return event

    FakeStream.record = record_then_tell  # type: ignore[method-assign]
    try:
        b = threading.Thread(target=run, args=("cpu#b", "b"))
        b.start()
        a.join(60)
        b.join(60)
    finally:
        FakeStream.record = original_record  # type: ignore[method-assign]
    steps = log.steps
    record_a = next(s for s in steps if s[0] == "a" and s[1].startswith("record"))
    copy = record_a[1].split()[1]
    compute = steps[log.index("a", "forward start")][2]
    assert copy != compute
    # a: staged on the copy stream, compute waits for that event (no host wait), then runs.
    assert record_a[2] == copy
    assert log.index("a", f"{compute} waits for event of {copy}") < log.index("a", "forward start")
    # b staged (on the copy stream) while a's forward ran ...
    assert log.index("b", f"record {copy}") < log.index("a", "forward end")
    # ... and b's forward only started after a's ended and was synchronised.
    assert log.index("a", f"sync {compute}") < log.index("b", "forward start")
    assert steps[log.index("b", "forward start")][2] == compute
    assert ("b", f"keep on {compute}", compute) in steps  # the copied batch, for the allocator


def test_each_lane_has_its_own_staging_buffer() -> None:
    log = Log()
    workers, slot = pipelined(log)
    lanes = workers.worker_slots("cpu", slot, 2) or {}
    assert list(lanes) == ["cpu#0a", "cpu#0b", "cpu#1a", "cpu#1b"]
    normalizers = {id(s.normalizer) for s in lanes.values()}
    assert len(normalizers) == 4
    assert lanes["cpu#0a"].lane.turn is lanes["cpu#0b"].lane.turn
    assert lanes["cpu#0a"].lane.turn is not lanes["cpu#1a"].lane.turn


def test_a_normaliser_used_off_its_worker_does_not_take_the_turn() -> None:
    log = Log()
    workers, slot = pipelined(log)
    workers.runs("cpu", slot, lambda s, m: [], instances=1, max_batch=2)
    slot.normalizer(tiles(1))  # the model's own, outside any batch: no handoff
    assert not [s for s in log.steps if s[1].startswith("record")]


def test_every_worker_is_warmed_up_at_the_largest_batch_on_its_own_stream() -> None:
    log = Log()
    seen: list[tuple[str, int, str, int]] = []

    def warm(slot: DeviceSlot, batch: int) -> None:
        x = slot.normalizer(tiles(batch))
        seen.append((slot.lane.stream.name, batch, log.local.stream, threading.get_ident()))
        slot.package(x)

    workers, slot = pipelined(log, warm_up=warm, warm_types=("cpu",))
    workers.runs("cpu", slot, lambda s, m: [], instances=1, max_batch=8)
    assert [(s[1]) for s in seen] == [8, 8]
    assert all(lane_stream == current for lane_stream, _, current, _ in seen)  # in turn, on it
    assert threading.get_ident() not in {s[3] for s in seen}  # each in a thread of its own


def test_warm_up_is_for_gpus_only_by_default() -> None:
    calls: list[int] = []
    workers = DeviceWorkers(warm_up=lambda slot, batch: calls.append(batch))
    slot = DeviceSlot(FakePackage(), Normalizer(SPEC, torch.device("cpu"), torch.float32))
    run = workers.runs("cpu", slot, lambda s, m: ["ok"] * len(s), instances=1, max_batch=8)
    assert callable(run) and calls == []  # the CPU's lone worker: no lanes, no warm-up


@pytest.mark.parametrize("fails", [False, True])
def test_a_warm_up_out_of_memory_is_logged_not_fatal(fails: bool, caplog: Any) -> None:
    """The batcher splits such batches at run time; other warm-up failures stop start-up
    (``test_pipeline_ordering``)."""

    def warm(slot: DeviceSlot, batch: int) -> None:
        if fails:
            raise torch.OutOfMemoryError("CUDA out of memory (the warm-up)")

    workers, slot = pipelined(Log(), warm_up=warm, warm_types=("cpu",))
    workers.runs("cpu", slot, lambda s, m: [], instances=1, max_batch=4)
    assert ("warm-up of worker cpu#a" in caplog.text) is fails


def test_the_models_warm_up_forward_runs_the_real_package_at_the_batch() -> None:
    """``TileFamily.warm_worker`` on the tiny demo package (the CPU build): staged and run at 5."""
    from harness.packages import demo_package
    from predictor.device.slot import build_slot
    from predictor.model.options import ServingOptions
    from predictor.model.served_package import ServedPackage
    from predictor.model.tiles import TileFamily
    from predictor.runtime.loader import load_package

    package = load_package(demo_package("h0-mini"), torch.device("cpu"))
    family = TileFamily(SPEC, ServingOptions(), ServedPackage(package))
    ran: list[int] = []
    slot = build_slot(package, SPEC)
    inner = slot.package

    class Counting:
        device, input_dtype = inner.device, inner.input_dtype
        metadata, path = inner.metadata, inner.path

        def __call__(self, *inputs: torch.Tensor) -> Any:
            ran.append(inputs[0].shape[0])
            return inner(*inputs)

    with torch.inference_mode():
        family.warm_worker(DeviceSlot(Counting(), slot.normalizer), 5)  # type: ignore[arg-type]
    assert ran == [5] and slot.normalizer.host_buffer.shape[0] == 5


def test_gpu_instances_are_pipelined_by_default_and_cpus_not() -> None:
    log = Log()
    workers = DeviceWorkers(stream_factory=lambda d: FakeStream(log))
    normalizer = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    gpu = DeviceSlot(FakePackage("cuda:0"), normalizer)  # type: ignore[arg-type]
    assert list(workers.worker_slots("cuda:0", gpu, 1) or {}) == ["cuda:0#a", "cuda:0#b"]
    cpu = DeviceSlot(FakePackage("cpu"), normalizer)
    assert workers.worker_slots("cpu", cpu, 1) is None  # the lone CPU worker, as before
    workers.pipeline = False  # the GPU check's serial side
    assert workers.worker_slots("cuda:0", gpu, 1) is None
