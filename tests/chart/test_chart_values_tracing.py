"""``tracing.*``: the server's OpenTelemetry flags, only when an endpoint is set."""

from __future__ import annotations

from tests.chart.helpers import args_of, isvc_container


def test_tracing_passes_the_otel_flags_only_with_an_endpoint(render, render_error):
    assert not {"otel_endpoint", "otel_protocol", "otel_sample_ratio"} & set(
        args_of(isvc_container(render(set_json={"tracing.sampleRatio": 0.5})))
    )
    objs = render(
        set_json={
            "tracing.endpoint": "http://otel-collector.observability:4318",
            "tracing.protocol": "grpc",
            "tracing.sampleRatio": 0.25,
        }
    )
    args = args_of(isvc_container(objs))
    assert args["otel_endpoint"] == "http://otel-collector.observability:4318"
    assert args["otel_protocol"] == "grpc"
    assert args["otel_sample_ratio"] == "0.25"
    assert "sampleRatio" in render_error(set_json={"tracing.sampleRatio": 2})
