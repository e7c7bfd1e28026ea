"""predictor.tracing without a server: off costs nothing, the standard variables, sampling.

The span tree of real requests is tests/integration/test_tracing.py's; here
the SDK's in-memory exporter stands in for the OTLP one (no collector).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from predictor import tracing
from predictor.errors import ConfigError

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.fixture
def memory(monkeypatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(tracing, "_exporter", lambda *args: exporter)
    yield exporter
    tracing.shutdown()


def finished(memory: InMemorySpanExporter) -> tuple:
    tracing._provider.force_flush()  # the batch processor exports in its own time
    return memory.get_finished_spans()


def test_off_imports_no_sdk_and_makes_nothing():
    code = (
        "import sys\n"
        "from predictor import tracing\n"
        "import predictor.http.traced, predictor.model.forward\n"
        "assert not tracing.setup(tracing.TracingSettings(), env={})\n"
        "assert tracing.start_request('http', {'traceparent': '" + CLIENT + "'}) is None\n"
        "assert tracing.current_request() is None and tracing.remote_request('"
        + CLIENT
        + "') is None\n"
        "assert tracing.batch([None], 1, 'embedding') is tracing.span('h2d') is tracing._NOOP\n"
        "loaded = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_standard_variables_choose_the_endpoint():
    assert tracing.configured_endpoint(None, {}) is None
    assert tracing.configured_endpoint("http://c:4318", {}) == "http://c:4318"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}
    assert tracing.configured_endpoint(None, env) == "http://env:4318"
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://env:4318/traces"
    assert tracing.configured_endpoint(None, env) == "http://env:4318/traces"
    assert tracing.configured_endpoint("http://c:4318", {"OTEL_SDK_DISABLED": "true"}) is None


def test_an_http_endpoint_gets_v1_traces_appended_a_signals_own_does_not():
    exporter = tracing._exporter("http://c:4318/", "http/protobuf", {})
    assert exporter._endpoint == "http://c:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"}
    assert (
        tracing._exporter("http://c:4318/custom", "http/protobuf", env)._endpoint
        == "http://c:4318/custom"
    )


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="otel_protocol"):
        tracing.setup(tracing.TracingSettings("http://c:4318", "thrift"), env={})
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER_ARG"):
        tracing.setup(
            tracing.TracingSettings("http://c:4318"), env={"OTEL_TRACES_SAMPLER_ARG": "x"}
        )
    assert not tracing.enabled()


def test_ratio_zero_records_no_new_trace_but_follows_a_sampled_client(memory):
    assert tracing.setup(tracing.TracingSettings("http://c:4318", sample_ratio=0.0), env={})
    assert tracing.start_request("http", {}) is None
    assert tracing.start_request("http", {"traceparent": UNSAMPLED}) is None
    trace = tracing.start_request("http", {"traceparent": CLIENT}, "h0-mini")
    assert trace is not None
    trace.end()
    (span,) = finished(memory)
    assert span.parent.span_id == 0xB7AD6B7169203331
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C


def test_the_sampler_arg_alone_sets_the_ratio(memory):
    assert tracing.setup(
        tracing.TracingSettings("http://c:4318"), env={"OTEL_TRACES_SAMPLER_ARG": "0"}
    )
    assert tracing.start_request("grpc", {}) is None


def test_a_batch_links_every_request_and_its_children_nest(memory):
    assert tracing.setup(tracing.TracingSettings("http://c:4318"), env={})
    first, second = (tracing.start_request("http", {}) for _ in range(2))
    remote = tracing.remote_request(second.traceparent())  # as the device owner sees it
    for trace in (first, remote):  # where the real batcher is: a front end times no queue
        trace.queue_wait_started()
    with tracing.batch([first, first, remote], 3, "embedding"), tracing.span("forward"):
        pass
    first.end()
    second.end()
    spans = {s.name: s for s in finished(memory) if s.name != "infer"}
    batch = spans["batch"]
    assert [link.context.span_id for link in batch.links] == [
        first.span_context.span_id,
        second.span_context.span_id,
    ]
    assert batch.parent.span_id == first.span_context.span_id
    assert spans["forward"].parent.span_id == batch.context.span_id
    assert dict(batch.attributes) == {
        "histoserve.batch.tiles": 3,
        "histoserve.batch.requests": 2,
        "histoserve.mode": "embedding",
    }
    waits = [s for s in finished(memory) if s.name == "queue_wait"]
    assert len(waits) == 2 and all(w.end_time <= batch.start_time for w in waits)
