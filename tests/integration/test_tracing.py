"""OpenTelemetry traces from a real server, received by a loopback OTLP/HTTP endpoint.

One server (``--otel_endpoint`` at :class:`harness.otlp.OtlpReceiver`, batches
of 8, ``--max_latency_ms 2000`` so queued tiles wait for a full batch) for the
module. Each request carries the client's W3C ``traceparent``: the server's
``infer`` span must be its child, with ``receive``, ``decode``,
``queue_wait``, ``batch`` and ``answer`` under it and ``h2d`` and ``forward``
under the batch; eight requests queued together are one batch linked to all
eight.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from harness import slides
from harness.embed import run_embed
from harness.grpc_client import GrpcClient
from harness.otlp import OtlpReceiver, Span
from harness.server import Server, free_port, predictor_command, spawn
from harness.tiles import random_tiles

pytestmark = pytest.mark.integration

REQUEST_CHILDREN = {"receive", "decode", "queue_wait", "batch", "answer"}
BATCH_CHILDREN = {"h2d", "forward"}
ALLOWED_ATTRIBUTES = {
    "rpc.system",
    "histoserve.model",
    "histoserve.batch.tiles",
    "histoserve.batch.requests",
    "histoserve.mode",
    "http.response.status_code",
    "error.type",
}


def start_traced(model_dir: Path, log_dir: Path, endpoint: str, *flags: str) -> Server:
    ports = (free_port(), free_port())
    args = predictor_command(
        model_dir, ports, "--device", "cpu", "--preprocess_workers", "2",
        "--instances_per_device", "1", "--otel_endpoint", endpoint, *flags,
    )  # fmt: skip
    # export every 50 ms, not every 5 s (the SDK's standard variable)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2", OTEL_BSP_SCHEDULE_DELAY="50")
    server = spawn(args, ports=ports, log_dir=log_dir, env=env, kind="server")
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def server(embedding_package_dir, tmp_path_factory, receiver) -> Iterator[Server]:
    server = start_traced(
        embedding_package_dir, tmp_path_factory.mktemp("traced"), receiver.url,
        "--max_batch_size", "8", "--max_latency_ms", "2000",
    )  # fmt: skip
    yield server
    server.stop()


def client_parent() -> tuple[str, str, str]:
    """A client's ``(trace id, span id, traceparent)``, sampled."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def rest_infer(server: Server, tiles, traceparent: str) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
        inp.set_data_from_numpy(tiles, binary_data=True)
        client.infer(server.model_name, [inp], headers={"traceparent": traceparent})
    finally:
        client.close()


def grpc_infer(server: Server, tiles, traceparent: str) -> None:
    client = GrpcClient(
        f"127.0.0.1:{server.grpc_port}"
    )  # tritonclient.grpc can't share kserve's process
    try:
        client.answer(
            server.model_name, {"pixels": ("UINT8", tiles)}, headers={"traceparent": traceparent}
        )
    finally:
        client.close()


def request_tree(receiver: OtlpReceiver, trace_id: str, parent: str) -> dict[str, list[Span]]:
    """The server's spans of one request: its ``infer`` span and each stage under it, by name."""

    def complete(spans: list[Span]) -> bool:
        mine = [s for s in spans if s.trace_id == trace_id]
        return REQUEST_CHILDREN | BATCH_CHILDREN | {"infer"} <= {s.name for s in mine}

    spans = [s for s in receiver.wait_for(complete) if s.trace_id == trace_id]
    by_name: dict[str, list[Span]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert "infer" in by_name, f"no request span in {sorted(by_name)}"
    (request,) = by_name["infer"]
    assert request.parent == parent, "the server's request span is not the client's child"
    for name in REQUEST_CHILDREN:
        assert [s.parent for s in by_name.get(name, [])] == [request.span_id], name
    (batch,) = by_name["batch"]
    assert request.span_id in batch.links
    for name in BATCH_CHILDREN:
        assert [s.parent for s in by_name.get(name, [])] == [batch.span_id], name
    return by_name


def test_rest_request_span_tree_under_the_clients_trace(server, receiver):
    trace_id, span_id, traceparent = client_parent()
    rest_infer(server, random_tiles(2, seed=1), traceparent)
    spans = request_tree(receiver, trace_id, span_id)
    request = spans["infer"][0]
    assert request.attributes["rpc.system"] == "http"
    assert request.attributes["histoserve.model"] == server.model_name
    assert request.attributes["http.response.status_code"] == 200
    assert spans["batch"][0].attributes["histoserve.batch.tiles"] == 2


def test_grpc_request_span_tree_under_the_clients_trace(server, receiver):
    trace_id, span_id, traceparent = client_parent()
    grpc_infer(server, random_tiles(1, seed=2), traceparent)
    spans = request_tree(receiver, trace_id, span_id)
    assert spans["infer"][0].attributes["rpc.system"] == "grpc"


def test_eight_queued_requests_are_one_batch_linked_to_all_eight(server, receiver):
    # A long request first keeps the one worker busy; the eight single tiles
    # queue behind it and leave as one full batch of 8.
    blocker = client_parent()
    singles = [client_parent() for _ in range(8)]
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(rest_infer, server, random_tiles(160, seed=3), blocker[2])
        receiver.wait_for(
            lambda spans: any(s.trace_id == blocker[0] and s.name == "batch" for s in spans)
        )
        tile = random_tiles(1, seed=4)
        sent = [pool.submit(rest_infer, server, tile, tp) for _, _, tp in singles]
        for future in [first, *sent]:
            future.result()
    ids = {trace_id for trace_id, _, _ in singles}

    def all_eight(spans: list[Span]) -> bool:
        return len({s.trace_id for s in spans if s.name == "infer" and s.trace_id in ids}) == 8

    spans = receiver.wait_for(all_eight)
    requests = {s.span_id for s in spans if s.name == "infer" and s.trace_id in ids}
    assert len(requests) == 8
    batches = [s for s in spans if s.name == "batch" and requests & set(s.links)]
    assert len(batches) == 1, [(b.links, b.attributes) for b in batches]
    assert set(batches[0].links) == requests
    assert batches[0].attributes["histoserve.batch.requests"] == 8


def test_attributes_hold_only_small_scalars_and_names(server, receiver):
    _, _, traceparent = client_parent()
    rest_infer(server, random_tiles(1, seed=5), traceparent)
    spans = receiver.wait_for(lambda spans: len(spans) > 0)
    assert spans
    for span in spans:
        assert set(span.attributes) <= ALLOWED_ATTRIBUTES, span
        for value in span.attributes.values():
            assert isinstance(value, (int, float, bool)) or (
                isinstance(value, str) and len(value) <= 128
            )
    assert all(s.resource["service.name"] == "histoserve" for s in spans)


def test_embed_traces_a_slide_with_the_servers_spans_under_each_send(server, receiver, tmp_path):
    slide = slides.generic_tiff(tmp_path / "traced.tiff").path
    flags = ("--tissue", "none", "--batch-size", "8", "--otel-endpoint", receiver.url)
    result = run_embed(slide, "--url", server.base, "--out", tmp_path / "out", *flags)
    assert result.returncode == 0, result.stderr

    def slide_and_server(spans: list[Span]) -> bool:
        roots = [s for s in spans if s.name == "slide"]
        return bool(roots) and any(
            s.name == "infer" and s.trace_id == roots[0].trace_id for s in spans
        )

    spans = receiver.wait_for(slide_and_server)
    (root,) = [s for s in spans if s.name == "slide"]
    assert root.resource["service.name"] == "histoserve-embed"
    mine = [s for s in spans if s.trace_id == root.trace_id]
    names = {s.name for s in mine if s.parent == root.span_id}
    assert {"read", "wait", "send", "write"} <= names, names
    sends = {s.span_id for s in mine if s.name == "send"}
    served = [s for s in mine if s.name == "infer"]
    assert served and all(s.parent in sends for s in served)
    assert not [
        s
        for s in mine
        if s.name in ("read", "wait", "send", "write")
        and s.attributes.keys() - {"histoserve.batch", "histoserve.tiles"}
    ]


@pytest.mark.slow  # a pod of three processes each importing torch: ~30 s on 2 cores
def test_the_trace_crosses_from_a_front_end_to_the_device_owner(
    embedding_package_dir, tmp_path, receiver
):
    server = start_traced(
        embedding_package_dir, tmp_path, receiver.url, "--frontends", "2", "--max_batch_size", "8"
    )
    try:
        trace_id, span_id, traceparent = client_parent()
        rest_infer(server, random_tiles(1, seed=6), traceparent)
        spans = request_tree(receiver, trace_id, span_id)
    finally:
        server.stop()
    assert spans["infer"][0].resource["histoserve.process"].startswith("frontend-")
    assert spans["batch"][0].resource["histoserve.process"] == "owner"
    assert spans["queue_wait"][0].resource["histoserve.process"] == "owner"
