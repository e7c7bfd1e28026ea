"""Unit tests of :mod:`predictor.batching.batcher`, through its public API only.

The fake ``run_batch`` records each call and can be held on a
``threading.Event`` so a test controls exactly what arrives while the worker
is busy; waits on events are bounded so a bug fails fast instead of hanging.
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import pytest

from predictor.batching.batcher import (
    BatchObserver,
    DynamicBatcher,
    ErrorKind,
    NullObserver,
    WorkerState,
)
from predictor.batching.worker import HOOKS
from predictor.config import BatchingConfig
from predictor.errors import (
    DeviceLost,
    ForwardError,
    ModelNotReady,
    NonFiniteOutput,
    Overloaded,
)
from tests.unit.batching.fakes import WAIT_S, Fake, busy, outcomes, run, started


class FakeOOM(RuntimeError):
    """Stands in for ``torch.cuda.OutOfMemoryError``."""


class FakeDeviceError(RuntimeError):
    """Stands in for a sticky CUDA error."""


class Boom(BaseException):
    """A non-Exception escaping ``run_batch``."""


def classify(exc: BaseException) -> ErrorKind:
    if isinstance(exc, FakeOOM):
        return ErrorKind.OOM
    if isinstance(exc, FakeDeviceError):
        return ErrorKind.FATAL
    return ErrorKind.BATCH


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None:
        self.events.append(("enqueue", n_items, queue_depth))

    def on_reject(self, n_items: int) -> None:
        self.events.append(("reject", n_items))

    def on_dispatch(
        self,
        batch_size: int,
        queue_wait_s: Mapping[int, Sequence[float]],
        queue_depth: Mapping[int, int],
    ) -> None:
        waits = [w for per_class in queue_wait_s.values() for w in per_class]
        self.events.append(("dispatch", batch_size, waits, sum(queue_depth.values())))

    def on_forward(self, batch_size: int, seconds: float, ok: bool) -> None:
        self.events.append(("forward", batch_size, seconds, ok))

    def on_worker_forward(self, worker: str, batch_size: int, seconds: float, ok: bool) -> None:
        self.events.append(("worker_forward", worker, batch_size, ok))

    def on_worker_lost(self, worker: str, workers_left: int) -> None:
        self.events.append(("worker_lost", worker, workers_left))

    def on_oom_split(self, batch_size: int) -> None:
        self.events.append(("oom_split", batch_size))


def cfg(batch: int = 4, latency_ms: float = 10_000, queue_size: int = 64) -> BatchingConfig:
    return BatchingConfig(
        max_batch_size=batch, max_latency_ms=latency_ms, max_queue_size=queue_size
    )


def still_alive(threads: Sequence[threading.Thread], timeout_s: float = 60.0) -> list[str]:
    """Joins ``threads`` (a generous bound: they end at once when the code works); the names
    of those still running."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def test_runs_in_one_worker_thread_off_the_loop() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1))
        results = [await f for f in b.submit(list(range(5)))]
        assert results == [f"r{i}" for i in range(5)]
        assert fake.threads and threading.get_ident() not in fake.threads
        assert len(fake.threads) == 1
        await b.close()

    run(body)


def test_size_cap_and_full_batch_dispatches_before_latency() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=4, latency_ms=10_000))
        first = await busy(fake, b)
        futures = b.submit(list(range(8)))
        fake.release()
        t0 = time.monotonic()
        assert await outcomes([first, *futures]) == ["rbusy"] + [f"r{i}" for i in range(8)]
        assert time.monotonic() - t0 < 2.0  # full batches never wait for the latency
        assert fake.sizes == [1, 4, 4]
        await b.close()

    run(body)


def test_latency_cap_from_oldest_waiting_item() -> None:
    fake = Fake()
    latency_s = 1.0

    async def body() -> None:
        b = await started(fake, cfg(batch=8, latency_ms=latency_s * 1000))
        first = await busy(fake, b)
        t0 = time.monotonic()
        early = b.submit(["a", "b"])
        await asyncio.sleep(0.6)  # let time pass: the batch must still go at t0 + latency
        fake.release()
        await outcomes([first])
        t1 = time.monotonic()
        late = b.submit(["c"])  # arrives while the worker waits for the batch to fill
        assert await outcomes(early + late) == ["ra", "rb", "rc"]
        assert fake.calls[1][0] == ["a", "b", "c"]
        dispatched = fake.times[1]
        assert dispatched - t0 >= latency_s
        # From the oldest: about t1 + 0.4 s; from the newest it would be t1 + 1 s or later.
        assert dispatched < t1 + latency_s - 0.3
        await b.close()

    run(body)


def test_items_past_their_deadline_go_as_soon_as_the_worker_is_free() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=8, latency_ms=300))
        first = await busy(fake, b)
        waiting = b.submit(["a"])
        await asyncio.sleep(0.4)  # the busy batch outlasts the waiting item's deadline
        released = time.monotonic()
        fake.release()
        assert await outcomes([first, *waiting]) == ["rbusy", "ra"]
        # A fresh latency wait after the batch would take 0.3 s; a loaded machine far less.
        assert fake.times[1] - released < 0.25
        await b.close()

    run(body)


def test_idle_lone_item_dispatched_at_once() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=32, latency_ms=10_000))
        for i in range(3):  # each time the worker is idle again
            t0 = time.monotonic()
            assert await asyncio.wait_for(b.submit([i])[0], WAIT_S) == f"r{i}"
            assert time.monotonic() - t0 < 1.0
        assert fake.sizes == [1, 1, 1]
        await b.close()

    run(body)


def test_big_request_split_in_order_and_requests_share_batches() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=4, latency_ms=5))
        first = await busy(fake, b)
        a = b.submit([f"a{i}" for i in range(6)])
        c = b.submit(["c0", "c1"])
        fake.release()
        assert await outcomes(a) == [f"ra{i}" for i in range(6)]
        assert await outcomes(c) == ["rc0", "rc1"]
        await first
        assert [items for items, _ in fake.calls[1:]] == [
            ["a0", "a1", "a2", "a3"],
            ["a4", "a5", "c0", "c1"],
        ]
        await b.close()

    run(body)


def test_batches_are_homogeneous_in_key_and_fifo() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=8, latency_ms=20))
        first = await busy(fake, b)
        futures = b.submit(["x0", "x1"], key="x") + b.submit(["y0"], key="y")
        futures += b.submit(["x2"], key="x") + b.submit(["y1", "y2"], key="y")
        fake.release()
        assert await outcomes(futures) == ["rx0", "rx1", "ry0", "rx2", "ry1", "ry2"]
        await first
        assert fake.calls[1:] == [
            (["x0", "x1"], "x"),
            (["y0"], "y"),
            (["x2"], "x"),
            (["y1", "y2"], "y"),
        ]
        await b.close()

    run(body)


def test_bounded_queue_overload_is_all_or_nothing() -> None:
    fake = Fake()
    rec = Recorder()

    async def body() -> None:
        config = BatchingConfig(
            max_batch_size=2, max_latency_ms=1, max_queue_size=4, retry_after_s=3.5
        )
        b = await started(fake, config, observer=rec)
        first = await busy(fake, b)
        ok = b.submit([1, 2, 3])
        with pytest.raises(Overloaded) as info:
            b.submit([4, 5])
        assert info.value.retry_after_s == 3.5
        assert b.queue_depth == 3
        assert ("reject", 2) in rec.events
        ok += b.submit([6])  # exactly fills the bound
        assert b.queue_depth == 4
        with pytest.raises(Overloaded):
            b.submit([7])
        assert b.submit([]) == []
        fake.release()
        assert await outcomes([first, *ok]) == ["rbusy", "r1", "r2", "r3", "r6"]
        assert not any(x in items for items, _ in fake.calls for x in (4, 5, 7))
        await b.close()

    run(body)


def test_cancelled_items_are_dropped_before_forward() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=8, latency_ms=1))
        first = await busy(fake, b)
        futures = b.submit(["a", "b", "c"])
        futures[1].cancel()
        gone = b.submit(["d", "e"])
        for f in gone:
            f.cancel()
        fake.release()
        assert await outcomes([futures[0], futures[2]]) == ["ra", "rc"]
        await first
        assert [items for items, _ in fake.calls] == [["busy"], ["a", "c"]]
        await b.close()

    run(body)


def test_oom_splits_and_retries_halves() -> None:
    def fail(items: list[Any], key: Hashable) -> None:
        if len(items) > 2 or (len(items) > 0 and "bad" in items):
            raise FakeOOM(f"CUDA out of memory ({len(items)})")

    fake = Fake(fail)
    recorder = Recorder()

    async def body() -> None:
        b = await started(
            fake, cfg(batch=8, latency_ms=1), classify_error=classify, observer=recorder
        )
        results = await outcomes(b.submit(list(range(8))))
        assert results == [f"r{i}" for i in range(8)]
        assert fake.sizes == [8, 4, 2, 2, 4, 2, 2]
        # each split batch is counted once (histoserve_oom_splits_total), the ones that ran not
        assert [e for e in recorder.events if e[0] == "oom_split"] == [
            ("oom_split", 8),
            ("oom_split", 4),
            ("oom_split", 4),
        ]
        fake.calls.clear()
        results = await outcomes(b.submit([0, 1, "bad", 3]))
        assert [r for i, r in enumerate(results) if i != 2] == ["r0", "r1", "r3"]
        assert isinstance(results[2], ForwardError)
        assert isinstance(results[2].__cause__, FakeOOM)
        assert "batch of 1" in str(results[2])
        assert b.healthy
        await b.close()

    run(body)


class DeviceBuffer:
    """Stands in for a batch's device tensors (only a GPU holds real ones): weak-referenceable."""


def test_oom_retry_frees_the_failed_batch_before_its_halves_run() -> None:
    """The failed batch's tensors, held by its exception's traceback, are gone when a half starts."""
    buffers: list[weakref.ref[DeviceBuffer]] = []
    alive_at_halves: list[bool] = []

    def run_batch(items: list[Any], key: Hashable) -> list[Any]:
        if buffers:
            alive_at_halves.append(buffers[0]() is not None)
        activations = DeviceBuffer()  # held by this frame, so by the traceback
        buffers.append(weakref.ref(activations))
        if len(items) > 2:
            raise FakeOOM(f"CUDA out of memory ({len(items)})")
        return [f"r{x}" for x in items]

    async def body() -> None:
        b = await started(run_batch, cfg(batch=4, latency_ms=1), classify_error=classify)  # type: ignore[arg-type]
        assert await outcomes(b.submit([0, 1, 2, 3])) == ["r0", "r1", "r2", "r3"]
        await b.close()

    gc.disable()  # reference counting alone must free it
    try:
        run(body)
    finally:
        gc.enable()
    assert alive_at_halves == [False, False]


def test_a_fatal_error_takes_out_every_worker_of_that_device() -> None:
    """Instances of one GPU share its context: one sticky error and none of them can run."""
    names = ("cuda:0#0", "cuda:0#1", "cuda:1#0")

    def fail(items: list[Any], key: Hashable) -> None:
        raise FakeDeviceError("CUDA error: an illegal memory access was encountered")

    workers = {name: Fake(fail if name == "cuda:0#0" else None) for name in names}
    rec = Recorder()

    async def body() -> None:
        b = await started(  # type: ignore[arg-type]
            workers, cfg(batch=1, latency_ms=1), classify_error=classify, observer=rec
        )
        (lost,) = await outcomes(b.submit(["x"]))  # cuda:0#0 is first free
        assert isinstance(lost, DeviceLost)
        assert [(w.name, w.alive) for w in b.workers] == [
            ("cuda:0#0", False),
            ("cuda:0#1", False),
            ("cuda:1#0", True),
        ]
        assert b.healthy
        assert await outcomes(b.submit(["y", "z"])) == ["ry", "rz"]
        await b.close()

    run(body)
    assert workers["cuda:0#1"].calls == []  # its sibling never failed a batch of its own
    assert workers["cuda:1#0"].sizes == [1, 1]
    assert [e for e in rec.events if e[0] == "worker_lost"] == [
        ("worker_lost", "cuda:0#0", 1),
        ("worker_lost", "cuda:0#1", 1),
    ]


def test_fatal_error_marks_unhealthy_and_fails_queued() -> None:
    def fail(items: list[Any], key: Hashable) -> None:
        raise FakeDeviceError("illegal memory access")

    fake = Fake(fail)

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1), classify_error=classify)
        first = await busy(fake, b)
        queued = b.submit([1, 2, 3])
        fake.release()
        results = await outcomes([first, *queued])
        assert all(isinstance(r, DeviceLost) for r in results), results
        assert isinstance(results[0].__cause__, FakeDeviceError)
        assert not b.healthy and not b.accepting
        assert fake.sizes == [1]  # nothing else ran on the lost device
        with pytest.raises(ModelNotReady):
            b.submit([4])
        assert await b.drain(1.0)
        await b.close()

    run(body)


def test_batch_error_isolated_to_its_batch() -> None:
    def fail(items: list[Any], key: Hashable) -> None:
        if "bad" in items:
            raise ValueError("kaput")

    fake = Fake(fail)

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1), classify_error=classify)
        fake.hold()
        bad = b.submit(["bad", "x"])
        assert await fake.next_call() == ["bad", "x"]
        good = b.submit(["y", "z"])
        fake.release()
        results = await outcomes(bad)
        assert all(isinstance(r, ForwardError) for r in results)
        assert results[0] is results[1]
        assert isinstance(results[0].__cause__, ValueError)
        assert "batch of 2" in str(results[0]) and "kaput" in str(results[0])
        assert await outcomes(good) == ["ry", "rz"]
        assert b.healthy and b.accepting
        await b.close()

    run(body)


def test_histoserve_errors_pass_through_and_wrong_length_fails() -> None:
    injected = ForwardError("injected fault")
    mode = {"n": 0}

    def run_batch(items: list[Any], key: Hashable) -> list[Any]:
        mode["n"] += 1
        if mode["n"] == 1:
            raise injected
        if mode["n"] == 2:
            return items[:-1]
        if mode["n"] == 3:
            raise Boom()
        return items

    async def body() -> None:
        b: DynamicBatcher[Any, Any] = DynamicBatcher(run_batch, cfg())
        await b.start()
        assert await outcomes(b.submit([1, 2])) == [injected, injected]
        short = await outcomes(b.submit([1, 2]))
        assert isinstance(short[0], ForwardError) and "returned 1 results" in str(short[0])
        boom = await outcomes(b.submit([1]))
        assert isinstance(boom[0], ForwardError) and isinstance(boom[0].__cause__, Boom)
        assert await outcomes(b.submit([5])) == [5]
        await b.close()

    run(body)


def test_drain_finishes_admitted_work_and_refuses_new() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1))
        first = await busy(fake, b)
        queued = b.submit([1, 2, 3])
        drain = asyncio.ensure_future(b.drain(WAIT_S))
        await asyncio.sleep(0)
        assert not b.accepting
        with pytest.raises(ModelNotReady, match="draining"):
            b.submit([4])
        assert not drain.done()
        fake.release()
        assert await drain is True
        assert [f.result() for f in [first, *queued]] == ["rbusy", "r1", "r2", "r3"]
        await b.close()

    run(body)


def test_drain_timeout_fails_leftover_queued_items() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1))
        first = await busy(fake, b)
        queued = b.submit([1, 2, 3])
        assert await b.drain(0.05) is False
        for f in queued:
            with pytest.raises(ModelNotReady, match="draining deadline passed"):
                f.result()
        assert b.queue_depth == 0
        fake.release()
        assert await asyncio.wait_for(first, WAIT_S) == "rbusy"  # the running batch finishes
        await b.close()

    run(body)


def test_a_batch_closed_after_the_drain_deadline_names_the_deadline() -> None:
    """The server closes the batcher once its drain times out: the batch still running
    then is lost to the deadline, and its answer says so (as the queued ones' do)."""
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1))
        first = await busy(fake, b)
        assert await b.drain(0.05) is False
        await b.close()
        with pytest.raises(ModelNotReady, match="draining deadline passed while the batch ran"):
            first.result()
        fake.release()
        await asyncio.to_thread(time.sleep, 0.05)  # the worker thread returns into nothing

    run(body)


def test_close_mid_batch_settles_everything_once() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1))
        first = await busy(fake, b)
        queued = b.submit([1, 2, 3])
        await b.close()
        results = await outcomes([first, *queued])
        assert all(isinstance(r, ModelNotReady) for r in results), results
        with pytest.raises(ModelNotReady, match="closed"):
            b.submit([4])
        fake.release()
        await asyncio.to_thread(time.sleep, 0.05)  # the worker thread returns into nothing

    run(body)


def test_not_started_refuses_and_start_twice_fails() -> None:
    async def body() -> None:
        b: DynamicBatcher[Any, Any] = DynamicBatcher(Fake(), cfg())
        assert not b.accepting and b.healthy
        with pytest.raises(ModelNotReady, match="not started"):
            b.submit([1])
        await b.start()
        with pytest.raises(RuntimeError):
            await b.start()
        await b.close()

    run(body)


def test_observer_sees_depth_waits_and_forward_and_its_bugs_are_contained() -> None:
    def fail(items: list[Any], key: Hashable) -> None:
        if 9 in items:
            raise ValueError("nine")

    fake = Fake(fail)
    rec = Recorder()

    async def body() -> None:
        b = await started(fake, cfg(batch=2, latency_ms=1), observer=rec)
        first = await busy(fake, b)
        queued = b.submit([1, 9])
        fake.release()
        await outcomes([first, *queued])
        assert rec.events[0] == ("enqueue", 1, 1)
        assert rec.events[1] == ("dispatch", 1, rec.events[1][2], 0)
        assert ("enqueue", 2, 2) in rec.events
        dispatches = [e for e in rec.events if e[0] == "dispatch"]
        assert [d[1] for d in dispatches] == [1, 2]
        assert all(len(d[2]) == d[1] and min(d[2]) >= 0 for d in dispatches)
        forwards = [(e[1], e[3]) for e in rec.events if e[0] == "forward"]
        assert forwards == [(1, True), (2, False)]
        await b.close()

        class Broken(NullObserver):
            def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None:
                raise RuntimeError("observer bug")

        observer: BatchObserver = Broken()
        b2 = await started(Fake(), cfg(), observer=observer)
        assert await outcomes(b2.submit([1])) == ["r1"]
        await b2.close()

    run(body)


def test_an_observer_missing_a_declared_hook_is_refused_by_name() -> None:
    """The batcher calls BatchObserver's declared hooks, typed: a misspelt hook is a
    TypeError at construction, not a metric that silently never moves."""

    class Misspelt:
        def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None: ...

        def on_rejected(self, n_items: int) -> None: ...  # not a hook

    with pytest.raises(TypeError, match="on_reject"):
        DynamicBatcher(Fake(), cfg(), observer=Misspelt())  # type: ignore[arg-type]
    assert set(HOOKS) == {
        "on_enqueue", "on_reject", "on_dispatch", "on_forward", "on_worker_forward",
        "on_worker_lost", "on_oom_split",
    }  # fmt: skip


def test_close_nowait_stops_workers_and_fails_the_queue_from_sync_code() -> None:
    fake = Fake()
    workers: list[threading.Thread] = []  # this batcher's worker threads, by identity

    async def body() -> None:
        b = await started(fake, cfg(batch=1), name="sync-close")
        running = await busy(fake, b)
        workers.extend(t for t in threading.enumerate() if t.name.startswith("batcher-sync-close"))
        assert workers
        queued = b.submit([2, 3])
        tasks = b.close_nowait()  # no await: what a synchronous stop() can do
        assert tasks and all(t.cancelled() or t.cancelling() for t in tasks)
        assert not b.accepting
        fake.release()
        results = await outcomes([running, *queued])
        assert all(isinstance(r, ModelNotReady) for r in results), results

    run(body)
    assert not still_alive(workers), "worker threads outlived close_nowait"


@pytest.mark.parametrize(("seed", "workers"), [(1, 1), (2, 1), (3, 1), (4, 3), (5, 3)])
def test_exactly_once_under_concurrent_submits_and_cancellations(seed: int, workers: int) -> None:
    rng = random.Random(seed)

    def fail(items: list[Any], key: Hashable) -> None:
        if len(items) > 6:
            raise FakeOOM("oom")
        if any(x % 97 == 0 for x in items):
            raise ValueError("poison")
        time.sleep(0.0002)  # a batch takes a moment, so some cancellations land mid-batch

    fake = Fake(fail)
    rec = Recorder()

    async def client(b: DynamicBatcher[Any, Any], start: int, n: int) -> list[tuple[int, Any]]:
        await asyncio.sleep(rng.random() * 0.05)
        items = list(range(start, start + n))
        try:
            futures = b.submit(items, key=n % 2)
        except Overloaded:
            return []
        for f in futures:
            if rng.random() < 0.2:
                f.cancel()
        if rng.random() < 0.3:
            await asyncio.sleep(0)
            futures[-1].cancel()
        results = await outcomes(futures)
        return list(zip(items, results, strict=True))

    async def body() -> None:
        # Several workers share one fake: stand-ins for several GPUs (none here).
        run_batch = fake if workers == 1 else {f"cuda:{i}": fake for i in range(workers)}
        b = await started(
            run_batch,  # type: ignore[arg-type]
            cfg(batch=8, latency_ms=2, queue_size=512),
            classify_error=classify,
            observer=rec,
        )
        sizes = [rng.randint(1, 20) for _ in range(150)]
        starts = [sum(sizes[:i]) + 1 for i in range(len(sizes))]
        done = await asyncio.gather(*(client(b, s, n) for s, n in zip(starts, sizes, strict=True)))
        pairs = [p for chunk in done for p in chunk]
        for item, result in pairs:
            if isinstance(result, BaseException):
                assert isinstance(result, (asyncio.CancelledError, ForwardError)), result
            else:
                assert result == f"r{item}"
        key_of = {x: n % 2 for s, n in zip(starts, sizes, strict=True) for x in range(s, s + n)}
        assert all(0 < len(items) <= 8 for items, _ in fake.calls)
        assert all({key_of[x] for x in items} == {key} for items, key in fake.calls)
        ran_ok = [
            x
            for items, _ in fake.calls
            if len(items) <= 6 and not any(x % 97 == 0 for x in items)
            for x in items
        ]
        assert len(ran_ok) == len(set(ran_ok))  # no item succeeded twice
        served = {item for item, r in pairs if isinstance(r, str)}
        assert served <= set(ran_ok)
        assert b.queue_depth == 0 and b.healthy
        assert await b.drain(1.0)
        admitted = sum(e[1] for e in rec.events if e[0] == "enqueue")
        assert admitted == len(pairs)
        await b.close()

    run(body)


# -- several workers ------------------------------------------------------------------------
# Each worker's ``run_batch`` is a Fake standing in for one GPU: this machine has none.


def test_batch_goes_to_the_first_free_worker_each_in_its_own_thread() -> None:
    gpus = {"cuda:0": Fake(), "cuda:1": Fake()}

    async def body() -> None:
        b = await started(gpus, cfg(batch=4, latency_ms=10_000))  # type: ignore[arg-type]
        assert [w.name for w in b.workers] == ["cuda:0", "cuda:1"]
        for fake in gpus.values():
            fake.hold()
        a = b.submit(["a"])  # both idle: the first worker takes it at once
        assert await gpus["cuda:0"].next_call() == ["a"]
        c = b.submit(["c"])  # cuda:0 busy, cuda:1 idle: dispatched at once to cuda:1
        assert await gpus["cuda:1"].next_call() == ["c"]
        assert [w.busy for w in b.workers] == [True, True]
        queued = b.submit(["q0", "q1", "q2", "q3"])  # every worker busy: they wait for one
        assert b.queue_depth == 4
        gpus["cuda:1"].release()
        assert await outcomes(c + queued) == ["rc", "rq0", "rq1", "rq2", "rq3"]
        assert gpus["cuda:1"].calls[1] == (["q0", "q1", "q2", "q3"], None)
        assert not a[0].done()  # cuda:0 is still inside its batch
        gpus["cuda:0"].release()
        assert await outcomes(a) == ["ra"]
        assert gpus["cuda:0"].sizes == [1]
        threads = [fake.threads for fake in gpus.values()]
        assert len(threads[0]) == len(threads[1]) == 1 and not threads[0] & threads[1]
        assert [w.batches for w in b.workers] == [1, 2]
        await b.close()

    run(body)


def test_two_workers_overlap_their_forwards() -> None:
    # Each fake blocks until the other has started too: this only finishes if
    # two batches run at the same time.
    barrier = threading.Barrier(2, timeout=WAIT_S)

    def meet(items: list[Any], key: Hashable) -> None:
        barrier.wait()

    gpus = {"cuda:0": Fake(meet), "cuda:1": Fake(meet)}

    async def body() -> None:
        b = await started(gpus, cfg(batch=2, latency_ms=1))  # type: ignore[arg-type]
        first = b.submit([1])
        await gpus["cuda:0"].next_call()
        second = b.submit([2])
        assert await outcomes(first + second) == ["r1", "r2"]
        await b.close()

    run(body)


def test_a_lost_worker_leaves_the_others_serving() -> None:
    lost = {"cuda:0": True, "cuda:1": False}

    def fail_on(name: str) -> Callable[[list[Any], Hashable], None]:
        def fail(items: list[Any], key: Hashable) -> None:
            if lost[name]:
                raise FakeDeviceError(f"{name}: illegal memory access")

        return fail

    gpus = {name: Fake(fail_on(name)) for name in lost}
    rec = Recorder()

    async def body() -> None:
        b = await started(  # type: ignore[arg-type]
            gpus, cfg(batch=4, latency_ms=1), classify_error=classify, observer=rec
        )
        for fake in gpus.values():
            fake.hold()
        on_0 = b.submit(["x"])
        await gpus["cuda:0"].next_call()
        on_1 = b.submit(["y"])
        await gpus["cuda:1"].next_call()
        queued = b.submit(["z0", "z1"])
        gpus["cuda:0"].release()
        (failed,) = await outcomes(on_0)
        assert isinstance(failed, DeviceLost) and isinstance(failed.__cause__, FakeDeviceError)
        assert b.healthy and b.accepting  # one device left: still live
        assert b.workers[0] == WorkerState("cuda:0", alive=False, busy=False, batches=1)
        assert not any(f.done() for f in queued)  # the queue waits for the other worker
        gpus["cuda:1"].release()
        assert await outcomes(on_1 + queued) == ["ry", "rz0", "rz1"]
        assert await outcomes(b.submit(["w"])) == ["rw"]
        assert gpus["cuda:0"].sizes == [1]  # nothing more went to the lost device
        assert ("worker_lost", "cuda:0", 1) in rec.events
        assert ("worker_forward", "cuda:1", 2, True) in rec.events
        # The last worker lost: unhealthy (liveness fails), the queue fails at once.
        lost["cuda:1"] = True
        gpus["cuda:1"].hold()
        last = b.submit(["v"])
        await gpus["cuda:1"].next_call()
        behind = b.submit(["u"])
        gpus["cuda:1"].release()
        results = await outcomes(last + behind)
        assert all(isinstance(r, DeviceLost) for r in results), results
        assert not b.healthy and not b.accepting
        assert ("worker_lost", "cuda:1", 0) in rec.events
        with pytest.raises(ModelNotReady, match="device lost"):
            b.submit(["t"])
        await b.close()

    run(body)


def test_close_with_several_busy_workers_settles_everything_once() -> None:
    gpus = {"cuda:0": Fake(), "cuda:1": Fake()}

    async def body() -> None:
        b = await started(gpus, cfg(batch=2, latency_ms=1))  # type: ignore[arg-type]
        for fake in gpus.values():
            fake.hold()
        running = b.submit(["a"])
        await gpus["cuda:0"].next_call()
        running += b.submit(["b"])
        await gpus["cuda:1"].next_call()
        queued = b.submit([1, 2, 3])
        await b.close()
        results = await outcomes(running + queued)
        assert all(isinstance(r, ModelNotReady) for r in results), results
        ran = set().union(*(fake.threads for fake in gpus.values()))
        workers = [t for t in threading.enumerate() if t.ident in ran]
        assert len(workers) == 2
        for fake in gpus.values():
            fake.release()
        # The worker threads return into nothing while the loop still runs (run() fails on
        # any error the loop sees): wait until they have ended, not for a fixed 50 ms.
        assert not await asyncio.to_thread(still_alive, workers)

    run(body)


def test_drain_waits_for_every_worker() -> None:
    gpus = {"cuda:0": Fake(), "cuda:1": Fake()}

    async def body() -> None:
        b = await started(gpus, cfg(batch=2, latency_ms=1))  # type: ignore[arg-type]
        for fake in gpus.values():
            fake.hold()
        futures = b.submit(["a"])
        await gpus["cuda:0"].next_call()
        futures += b.submit(["b"])
        await gpus["cuda:1"].next_call()
        drain = asyncio.ensure_future(b.drain(WAIT_S))
        gpus["cuda:0"].release()
        assert await outcomes(futures[:1]) == ["ra"]
        await asyncio.sleep(0.02)
        assert not drain.done()  # cuda:1 still runs its batch
        gpus["cuda:1"].release()
        assert await drain is True
        assert futures[1].result() == "rb"
        await b.close()

    run(body)


def test_workers_are_validated() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        DynamicBatcher({}, cfg())
    with pytest.raises(ValueError, match="worker 'cuda:1' is not callable: 3"):
        DynamicBatcher({"cuda:0": Fake(), "cuda:1": 3}, cfg())  # type: ignore[dict-item]


def test_a_result_that_is_an_error_fails_its_item_alone() -> None:
    """A forward that went well for the batch but not for one item (its row non-finite)."""

    class OneBad(Fake):
        def __call__(self, items: list[Any], key: Hashable) -> list[Any]:
            results = super().__call__(items, key)
            return [
                NonFiniteOutput(f"item {x}") if x == "b1" else r
                for x, r in zip(items, results, strict=True)
            ]

    fake = OneBad()

    async def body() -> None:
        b = await started(fake, cfg(batch=5))  # full once both are in: no latency wait
        first = await busy(fake, b)
        a, other = b.submit(["a0", "a1"]), b.submit(["b0", "b1", "b2"])
        fake.release()
        got = await outcomes([first, *a, *other])
        assert fake.sizes == [1, 5]  # both requests in one batch
        assert got[:4] == ["rbusy", "ra0", "ra1", "rb0"] and got[5] == "rb2"
        assert isinstance(other[1].exception(), NonFiniteOutput)  # raised, not a result
        assert str(got[4]) == "item b1" and other[0].exception() is None
        assert b.healthy
        await b.close()

    run(body)
