"""Metrics: the contract's series exist and move as the observer is called."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from predictor.model.metrics import create_metrics, series_remover


def _value(registry, name, labels):
    return registry.get_sample_value(name, labels)


def test_observer_calls_move_the_series():
    registry = CollectorRegistry()
    metrics = create_metrics("m", registry)
    bulk, interactive = {"model": "m", "priority": "2"}, {"model": "m", "priority": "1"}
    metrics.on_enqueue(3, 3, 2)
    assert _value(registry, "histoserve_queue_depth", bulk) == 3
    metrics.on_dispatch(3, {1: [0.001], 2: [0.002, 0.003]}, {1: 0, 2: 0})
    assert _value(registry, "histoserve_queue_depth", bulk) == 0
    assert _value(registry, "histoserve_batch_size_sum", {"model": "m"}) == 3
    assert _value(registry, "histoserve_queue_wait_seconds_count", bulk) == 2
    assert _value(registry, "histoserve_queue_wait_seconds_count", interactive) == 1
    metrics.on_forward(3, 0.01, ok=True)
    assert _value(registry, "histoserve_forward_seconds_count", {"model": "m"}) == 1
    metrics.on_reject(5)
    assert _value(registry, "histoserve_tiles_total", {"model": "m", "outcome": "rejected"}) == 5
    metrics.count_tiles("ok", 2)
    assert _value(registry, "histoserve_tiles_total", {"model": "m", "outcome": "ok"}) == 2


def test_inflight_gauge_returns_to_zero_even_on_error():
    registry = CollectorRegistry()
    metrics = create_metrics("m", registry)
    try:
        with metrics.inflight():
            assert _value(registry, "histoserve_inflight_requests", {"model": "m"}) == 1
            raise RuntimeError
    except RuntimeError:
        pass
    assert _value(registry, "histoserve_inflight_requests", {"model": "m"}) == 0


def test_nothing_registered_until_the_factory_runs():
    registry = CollectorRegistry()
    assert b"histoserve_" not in generate_latest(registry)
    create_metrics("m", registry)
    text = generate_latest(registry).decode()
    assert "histoserve_preprocess_seconds" in text


def test_every_model_series_and_outcome_exists_before_any_request():
    """A query of the chart or the dashboard finds a series on a server that answered nothing."""
    registry = CollectorRegistry()
    create_metrics("m", registry)
    for outcome in ("ok", "invalid", "failed", "rejected"):
        assert _value(registry, "histoserve_tiles_total", {"model": "m", "outcome": outcome}) == 0
    for name in (
        "histoserve_inflight_requests",
        "histoserve_oom_splits_total",
        "histoserve_batch_size_count",
        "histoserve_forward_seconds_count",
        "histoserve_request_seconds_count",
    ):
        assert _value(registry, name, {"model": "m"}) == 0, name


def test_oom_splits_and_request_time_are_counted():
    registry = CollectorRegistry()
    metrics = create_metrics("m", registry)
    metrics.on_oom_split(8)
    metrics.on_oom_split(4)
    assert _value(registry, "histoserve_oom_splits_total", {"model": "m"}) == 2
    with metrics.inflight():
        pass
    assert _value(registry, "histoserve_request_seconds_count", {"model": "m"}) == 1


def test_the_cpu_device_series_are_the_process_memory():
    """On the CPU: resident memory as allocated and reserved, the usable memory as total."""
    from predictor.model.device_stats import resident_bytes

    registry = CollectorRegistry()
    sampler = create_metrics("m", registry).watch_devices(["cpu", "cpu"])
    try:
        allocated = _value(
            registry, "histoserve_device_memory_bytes", {"device": "cpu", "kind": "allocated"}
        )
        reserved = _value(
            registry, "histoserve_device_memory_bytes", {"device": "cpu", "kind": "reserved"}
        )
        total = _value(
            registry, "histoserve_device_memory_bytes", {"device": "cpu", "kind": "total"}
        )
        assert allocated == reserved > 0
        assert 0.5 * allocated < resident_bytes() < 2 * allocated
        assert total > allocated
        busy = _value(registry, "histoserve_device_utilization_ratio", {"device": "cpu"})
        assert 0 <= busy <= 1
        sampler.sample()
        assert 0 <= _value(registry, "histoserve_device_utilization_ratio", {"device": "cpu"}) <= 1
    finally:
        sampler.stop()


def test_every_class_has_its_queue_series_from_start_up():
    """A class nobody has used yet still shows depth 0 and an empty wait histogram,
    so a dashboard or an autoscaler query on the interactive class has a series."""
    registry = CollectorRegistry()
    metrics = create_metrics("m", registry)
    metrics.classes_started(3)
    for priority in "123":
        labels = {"model": "m", "priority": priority}
        assert _value(registry, "histoserve_queue_depth", labels) == 0
        assert _value(registry, "histoserve_queue_wait_seconds_count", labels) == 0


def test_forgetting_a_model_removes_its_every_series_and_keeps_the_others():
    """An unloaded model's series leave /metrics; another model's, and a forgotten name
    made again (a reload), are there from zero."""
    registry = CollectorRegistry()
    a, b = create_metrics("a", registry), create_metrics("b", registry)
    for metrics in (a, b):
        metrics.classes_started(2)
        metrics.workers_started(["cpu"])
        metrics.on_enqueue(3, 3, 2)
        metrics.on_worker_forward("cpu", 3, 0.01, ok=True)
        metrics.count_tiles("ok", 3)
    forget = series_remover(registry)
    forget("a")
    page = generate_latest(registry).decode()
    assert 'model="a"' not in page
    assert 'histoserve_queue_depth{model="b",priority="2"} 3.0' in page
    assert 'histoserve_device_forwards_total{model="b",outcome="ok",worker="cpu"} 1.0' in page
    forget("a")  # twice: nothing left to remove
    create_metrics("a", registry).classes_started(2)
    assert _value(registry, "histoserve_queue_depth", {"model": "a", "priority": "2"}) == 0
