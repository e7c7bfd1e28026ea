"""Prometheus metrics: the ``histoserve_*`` series of the interface contract.

Nothing registers at import: :func:`create_metrics` builds the collectors on
a registry (KServe's global one by default, so they appear on ``/metrics``
beside KServe's own). :class:`Metrics` is also the batcher's observer, so the
batcher stays free of any metrics library. Every series labelled by the model
alone, and each outcome of ``histoserve_tiles_total``, is created with the
collectors (at zero): a query the chart or a dashboard runs against a server
that has not answered yet finds a series, not nothing. The device series
(``histoserve_device_memory_bytes``, ``histoserve_device_utilization_ratio``)
are set by :class:`DeviceSampler`, once a second, in the process that owns the
devices. A model unloaded from a model repository takes its series with it
(:func:`series_remover`): a stale queue depth would go on counting in every
sum over the pod's models, the autoscaling presets' included.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from predictor.kserve.compat import forget_stage_histograms
from predictor.model.device_stats import DeviceStatsReader

logger = logging.getLogger(__name__)

_SUMMED = "livesum"
"""Gauges under ``--frontends N``: one series summed over live processes (each gauge is
set by one kind of process: the queue and devices by the owner, requests by front ends)."""
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
OUTCOMES = ("ok", "invalid", "failed", "rejected")
"""The values of ``histoserve_tiles_total{outcome}``, each created at start."""
MEMORY_KINDS = ("allocated", "reserved", "total")
"""The values of ``histoserve_device_memory_bytes{kind}``."""
SAMPLE_INTERVAL_S = 1.0
"""How often :class:`DeviceSampler` reads the devices (a scrape is every 15-30 s)."""
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class Metrics:
    """The histoserve collectors, labelled for one model.

    Build with :func:`create_metrics`; pass to the model, which hands it to
    the batcher as its observer.

    Every labelled child this model uses is bound once and kept:
    ``.labels(...)`` validates and hashes the label values and takes the
    collector's lock on every call, which was most of prometheus_client's
    share of the event loop's CPU per request (``docs/performance.md``,
    "The request path (null model)"). :func:`create_metrics` binds the
    model's own series and every outcome at once (:meth:`bind_at_start`), so
    they exist, at zero, before the first request; the workers' series
    appear when the workers start.
    """

    model: str
    batch_size: Histogram
    queue_depth: Gauge
    inflight_requests: Gauge
    tiles_total: Counter
    queue_wait_seconds: Histogram
    forward_seconds: Histogram
    preprocess_seconds: Histogram
    request_seconds: Histogram
    device_forwards_total: Counter
    device_up: Gauge
    oom_splits_total: Counter
    device_memory_bytes: Gauge
    device_utilization_ratio: Gauge
    _children: dict[tuple[Any, tuple[str, ...]], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def _child(self, collector: Any, *labels: str) -> Any:
        """``collector.labels(self.model, *labels)``, bound on first use and kept."""
        key = (collector, labels)
        child = self._children.get(key)
        if child is None:
            child = collector.labels(self.model, *labels)
            self._children[key] = child
        return child

    def forget(self) -> None:
        """Removes every series this model bound from its collectors (its unload).

        Not under ``PROMETHEUS_MULTIPROC_DIR`` (several front ends): there each
        process's values live in its files, which prometheus_client cannot
        remove a series from.
        """
        if _multiprocess():
            return
        for collector, labels in list(self._children):
            with contextlib.suppress(KeyError):
                collector.remove(self.model, *labels)
        self._children.clear()

    def bind_at_start(self) -> None:
        """Creates every series labelled by the model alone, and each outcome, at zero
        (the queue's, labelled by class too, are :meth:`classes_started`'s)."""
        for collector in (
            self.batch_size,
            self.inflight_requests,
            self.forward_seconds,
            self.preprocess_seconds,
            self.request_seconds,
            self.oom_splits_total,
        ):
            self._child(collector)
        for outcome in OUTCOMES:
            self._child(self.tiles_total, outcome)

    # -- the model's calls --
    def count_tiles(self, outcome: str, n: int) -> None:
        """Adds ``n`` tiles to ``histoserve_tiles_total{outcome}``."""
        if n > 0:
            self._child(self.tiles_total, outcome).inc(n)

    @contextmanager
    def inflight(self) -> Iterator[None]:
        """Counts a request in ``histoserve_inflight_requests`` while it runs, and its time
        (any outcome) in ``histoserve_request_seconds``."""
        gauge = self._child(self.inflight_requests)
        gauge.inc()
        start = time.monotonic()
        try:
            yield
        finally:
            gauge.dec()
            self._child(self.request_seconds).observe(time.monotonic() - start)

    def observe_preprocess(self, seconds: float) -> None:
        """Records one request's stage-1 time."""
        self._child(self.preprocess_seconds).observe(seconds)

    # BatchObserver protocol (see predictor.batching.batcher)
    def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None:
        self._child(self.queue_depth, str(priority)).set(queue_depth)

    def on_reject(self, n_items: int) -> None:
        self.count_tiles("rejected", n_items)

    def on_dispatch(
        self,
        batch_size: int,
        queue_wait_s: Mapping[int, Sequence[float]],
        queue_depth: Mapping[int, int],
    ) -> None:
        for priority, depth in queue_depth.items():
            self._child(self.queue_depth, str(priority)).set(depth)
        self._child(self.batch_size).observe(batch_size)
        for priority, waits in queue_wait_s.items():
            wait = self._child(self.queue_wait_seconds, str(priority))
            for seconds in waits:
                wait.observe(seconds)

    def classes_started(self, priority_levels: int) -> None:
        """Makes every class's queue depth (0) and queue wait series exist from start-up."""
        for priority in range(1, priority_levels + 1):
            self._child(self.queue_depth, str(priority)).set(0)
            self._child(self.queue_wait_seconds, str(priority))

    def on_forward(self, batch_size: int, seconds: float, ok: bool) -> None:
        self._child(self.forward_seconds).observe(seconds)

    def on_worker_forward(self, worker: str, batch_size: int, seconds: float, ok: bool) -> None:
        self._child(self.device_forwards_total, worker, "ok" if ok else "failed").inc()

    def on_worker_lost(self, worker: str, workers_left: int) -> None:
        self._child(self.device_up, worker).set(0)

    def on_oom_split(self, batch_size: int) -> None:
        self._child(self.oom_splits_total).inc()

    def workers_started(self, workers: Sequence[str]) -> None:
        """Sets ``histoserve_device_up{worker}`` to 1 for each device worker."""
        for worker in workers:
            self._child(self.device_up, worker).set(1)

    def watch_devices(self, devices: Sequence[str]) -> DeviceSampler:
        """Starts the sampler of ``histoserve_device_*`` for ``devices`` (read once before it returns)."""
        sampler = DeviceSampler(self, [DeviceStatsReader(d) for d in dict.fromkeys(devices)])
        sampler.start()
        return sampler


class DeviceSampler:
    """Sets the device series from each device's reader every :data:`SAMPLE_INTERVAL_S`.

    A daemon thread, so it goes with the process; the first read happens in
    :meth:`start`, so the series exist before the server answers. A read that
    fails is logged once and the sampler goes on (serving never depends on it).
    """

    def __init__(
        self,
        metrics: Metrics,
        readers: Sequence[DeviceStatsReader],
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self._metrics = metrics
        self._readers = list(readers)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-sampler", daemon=True)
        self._failed = False

    def start(self) -> None:
        """Reads once, then every interval on the thread."""
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread (tests; a server's ends with the process)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def sample(self) -> None:
        """One read of every device into the series."""
        memory = self._metrics.device_memory_bytes
        busy = self._metrics.device_utilization_ratio
        for reader in self._readers:
            try:
                stats = reader.read()
            except Exception:
                if not self._failed:
                    logger.exception("device sampler: reading %s failed", reader.name)
                    self._failed = True
                continue
            memory.labels(stats.device, "allocated").set(stats.allocated_bytes)
            memory.labels(stats.device, "reserved").set(stats.reserved_bytes)
            memory.labels(stats.device, "total").set(stats.total_bytes)
            if stats.utilization_ratio is not None:
                busy.labels(stats.device).set(stats.utilization_ratio)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()


def create_metrics(model: str, registry: CollectorRegistry | None = None) -> Metrics:
    """Registers the histoserve collectors for ``model`` on ``registry``.

    Args:
        model: Value of the ``model`` label.
        registry: Where to register; KServe's global registry when ``None``
            (that is what its ``/metrics`` endpoint exposes).
    """
    reg = REGISTRY if registry is None else registry
    collectors = _REGISTERED.get(reg)
    if collectors is None:  # once per registry: every model's series share the collectors
        collectors = _REGISTERED[reg] = _collectors(reg)
    metrics = Metrics(model=model, **collectors)
    metrics.bind_at_start()
    _MODELS.setdefault(reg, {})[model] = metrics
    return metrics


def series_remover(registry: CollectorRegistry | None = None) -> Callable[[str], None]:
    """``forget(model)``: removes every series of ``model`` from ``/metrics``, for a
    model repository's unload (and a load undone).

    The ``histoserve_*`` series :func:`create_metrics` made for it (queue
    depth and wait of every class, tiles by outcome, forwards per worker, ...)
    and KServe's stage histograms (``request_*_seconds{model_name}``); the
    other models' series, the device series and the memory budget stay. A
    later load of the same name starts its series again from zero, which
    ``rate()`` reads as a counter reset.
    """
    reg = REGISTRY if registry is None else registry

    def forget(model: str) -> None:
        metrics = _MODELS.get(reg, {}).pop(model, None)
        if metrics is not None:
            metrics.forget()
        if reg is REGISTRY and not _multiprocess():
            forget_stage_histograms(model)

    return forget


def _multiprocess() -> bool:
    """prometheus_client's multiprocess mode (``--frontends``): its env variable, as it reads it."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)
"""Each registry's histoserve collectors (a registry refuses a name registered twice)."""
_MEMORY_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()
_MODELS: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Metrics]] = (
    weakref.WeakKeyDictionary()
)
"""Each registry's models' :class:`Metrics`, by model name (the last made for a name)."""


def _collectors(reg: CollectorRegistry) -> dict[str, Any]:
    """The histoserve collectors, registered on ``reg``, by :class:`Metrics` field."""
    labels = ("model",)
    return dict(
        batch_size=Histogram(
            "histoserve_batch_size",
            "Tiles per forward call.",
            labels,
            buckets=_BATCH_BUCKETS,
            registry=reg,
        ),
        queue_depth=Gauge(
            "histoserve_queue_depth",
            "Tiles waiting for a batch.",
            ("model", "priority"),
            registry=reg,
            multiprocess_mode=_SUMMED,
        ),
        inflight_requests=Gauge(
            "histoserve_inflight_requests",
            "Requests being served.",
            labels,
            registry=reg,
            multiprocess_mode=_SUMMED,
        ),
        tiles_total=Counter(
            "histoserve_tiles_total", "Tiles by outcome.", ("model", "outcome"), registry=reg
        ),
        queue_wait_seconds=Histogram(
            "histoserve_queue_wait_seconds",
            "Enqueue to dispatch, per tile.",
            ("model", "priority"),
            buckets=_SECONDS_BUCKETS,
            registry=reg,
        ),
        forward_seconds=Histogram(
            "histoserve_forward_seconds",
            "Forward pass per batch (incl. copies).",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=reg,
        ),
        preprocess_seconds=Histogram(
            "histoserve_preprocess_seconds",
            "Stage 1 (decode, validate) per request.",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=reg,
        ),
        request_seconds=Histogram(
            "histoserve_request_seconds",
            "A request in the model, admitted to answered (decode, queue, batch, forward).",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=reg,
        ),
        device_forwards_total=Counter(
            "histoserve_device_forwards_total",
            "Forward calls per device worker, by outcome (ok, failed).",
            ("model", "worker", "outcome"),
            registry=reg,
        ),
        device_up=Gauge(
            "histoserve_device_up",
            "1 while a device worker serves; 0 once a fatal device error took it out.",
            ("model", "worker"),
            registry=reg,
            multiprocess_mode=_SUMMED,
        ),
        oom_splits_total=Counter(
            "histoserve_oom_splits_total",
            "Batches split in halves after the device ran out of memory.",
            labels,
            registry=reg,
        ),
        device_memory_bytes=Gauge(
            "histoserve_device_memory_bytes",
            "Device memory by kind: allocated (live tensors), reserved (held by the "
            "allocator), total; on the CPU the process's resident set and the usable memory.",
            ("device", "kind"),
            registry=reg,
            multiprocess_mode=_SUMMED,
        ),
        device_utilization_ratio=Gauge(
            "histoserve_device_utilization_ratio",
            "Device busy 0..1 (NVML's GPU utilisation; on the CPU this process's share "
            "of its CPUs); absent on a GPU without NVML.",
            ("device",),
            registry=reg,
            multiprocess_mode=_SUMMED,
        ),
    )


def model_memory_gauge(
    registry: CollectorRegistry | None = None,
) -> Callable[[str, int | None], None]:
    """``histoserve_model_memory_bytes{model}``'s setter: bytes, or None to remove the series.

    What each loaded model of a model repository was measured to hold when it
    loaded (:mod:`predictor.repository.memory`), and the budget beside it
    (``histoserve_memory_budget_bytes``, set by :func:`memory_budget_gauge`).
    """
    reg = REGISTRY if registry is None else registry
    gauge = _MEMORY_GAUGES.get(reg)
    if gauge is None:
        gauge = _MEMORY_GAUGES[reg] = Gauge(
            "histoserve_model_memory_bytes",
            "Memory each loaded model holds, measured at its load (device memory; on the "
            "CPU the resident set's growth); a model unloaded has no series.",
            ("model",),
            registry=reg,
            multiprocess_mode=_SUMMED,
        )

    def set_memory(model: str, n: int | None) -> None:
        if n is None:
            with contextlib.suppress(KeyError):
                gauge.remove(model)
        else:
            gauge.labels(model).set(n)

    return set_memory


def memory_budget_gauge(budget_bytes: int, registry: CollectorRegistry | None = None) -> None:
    """``histoserve_memory_budget_bytes``: ``--memory_budget`` in bytes (a model repository)."""
    reg = REGISTRY if registry is None else registry
    Gauge(
        "histoserve_memory_budget_bytes",
        "The memory the loaded models may hold together (--memory_budget).",
        registry=reg,
        multiprocess_mode=_SUMMED,
    ).set(budget_bytes)
