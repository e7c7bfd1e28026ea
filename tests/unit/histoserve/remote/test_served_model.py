"""What the client reads from ``/v2/models/{name}/config``; modes it refuses before any slide."""

from __future__ import annotations

from typing import Any

import pytest

from histoserve.errors import HistoserveError, UsageError
from histoserve.remote.served_model import (
    ServerInfo,
    info_from_config,
    info_from_metadata,
    info_url,
)
from predictor.spec import resolve_spec


def _config(spec_name: str, **extra: object) -> dict:
    return {"spec": resolve_spec(spec_name).to_dict(), "package_metadata": {"a": "1"}, **extra}


def test_embedding_model_info() -> None:
    info = info_from_config("h0-mini", _config("h0-mini"))
    assert (info.family, info.tile_size, info.mpp, info.n_genes) == ("embedding", 224, 0.5, 0)
    assert info.modes == ("embedding",) and info.package_sha256.startswith("metadata:")
    info.check_mode("embedding")
    with pytest.raises(UsageError, match="no mode 'prediction'; it answers embedding"):
        info.check_mode("prediction")


def test_package_digest_is_taken_when_the_server_reports_one() -> None:
    info = info_from_config("h0", _config("h0", package_sha256="ab" * 32))
    assert info.package_sha256 == "ab" * 32
    other = info_from_config("h0", {**_config("h0"), "package_metadata": {"a": "2"}})
    assert other.package_sha256 != info_from_config("h0", _config("h0")).package_sha256


def test_multimodal_gene_count_and_segmentation_refused_as_embedder() -> None:
    info = info_from_config("m-optimus", _config("m-optimus", genes_in=["g"] * 64))
    assert info.n_genes == 64 and "prediction_with_embedding" in info.modes
    seg = info_from_config("tissue-seg", _config("tissue-seg"))
    assert (seg.tile_size, seg.mpp) == (512, 8.0)
    with pytest.raises(UsageError, match="use it with --tissue tissue-seg"):
        seg.check_mode("embedding")


def test_malformed_config_is_a_client_error() -> None:
    with pytest.raises(HistoserveError, match="unexpected config answer"):
        info_from_config("x", {"spec": {"family": "embedding"}})


def test_info_url_prefers_http() -> None:
    assert info_url(["grpc://a:1", "http://b:2", "https://c:3"]) == "http://b:2"
    assert info_url(["grpc://a:1"]) is None
    assert isinstance(ServerInfo("m", "embedding", 224, None, ("embedding",)), ServerInfo)


def test_info_fetch_retries_until_the_server_is_ready() -> None:
    """A Job's pod may start before its InferenceService: 503s and refusals are retried."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from histoserve.remote.dispatch import RetryPolicy

    answers = [503, 503, 200]
    config = json.dumps(_config("h0-mini")).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            status = answers.pop(0) if self.path.endswith("/config") else 200
            body = config if status == 200 else b'{"error": "model not ready"}'
            if self.path == "/v1/models":
                body = b'{"models": ["h0-mini"]}'
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        info = fetch_server_info([url], None, 5.0, RetryPolicy(max_attempts=4, backoff_max_s=0.1))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert info.model == "h0-mini" and info.tile_size == 224
    assert answers == []  # two 503s, then the config


EMBEDDING = {"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}


def fetch_server_info(
    urls: list[str], model: str | None, timeout_s: float, retry: Any, credentials: Any = None
) -> Any:
    """The model as the client core describes it (``HistoserveClient.info``)."""
    from histoserve.remote.client import HistoserveClient

    with HistoserveClient(urls, model, timeout_s, credentials=credentials, retry=retry) as client:
        return client.info


def test_outputs_come_from_the_config_else_from_the_spec() -> None:
    listed = info_from_config("h0-mini", _config("h0-mini", outputs=[EMBEDDING]))
    assert listed.outputs == {"embedding": ("FP32", (-1, 1536))}
    assert info_from_config("h0-mini", _config("h0-mini")).outputs == listed.outputs
    multimodal = info_from_config("m-optimus", _config("m-optimus")).outputs
    assert multimodal == {"embedding": ("FP32", (-1, 1536)), "prediction": ("FP32", (-1, -1))}
    seg = info_from_config("tissue-seg", _config("tissue-seg")).outputs
    assert seg == {"mask": ("UINT8", (-1, 512, 512))}


def test_grpc_metadata_gives_the_outputs_too() -> None:
    pixels = {"name": "pixels", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}
    info = info_from_metadata("grpc://h:1", "h0-mini", [pixels], [EMBEDDING])
    assert (info.family, info.tile_size, info.modes) == ("embedding", 224, ("embedding",))
    assert info.outputs == {"embedding": ("FP32", (-1, 1536))}


def test_a_server_quoting_the_token_it_refused_does_not_leak_it() -> None:
    from harness.bad_server import BadServer
    from histoserve.remote.auth import Credentials
    from histoserve.remote.dispatch import RetryPolicy

    secret = "tok-0123456789abcdef"
    with BadServer(config={"name": "h0-mini"}, echo_credentials={"GET"}) as fake:
        with pytest.raises(HistoserveError) as info:
            fetch_server_info(
                [fake.url], "h0-mini", 5.0, RetryPolicy(max_attempts=1),
                credentials=Credentials(token=secret),
            )  # fmt: skip
        assert fake.seen_headers[0]["Authorization"] == f"Bearer {secret}"  # it was sent
    assert "HTTP 401: invalid credentials Bearer ***" in str(info.value)
    assert secret not in str(info.value)


def _served(package: str, **spec_changes: object) -> dict:
    spec = {**resolve_spec("h0-mini").to_dict(), **spec_changes}
    return {"name": "h0-mini", "spec": spec, "package_sha256": package, "outputs": [EMBEDDING]}


def test_every_http_url_is_asked_and_must_serve_the_first_ones_package() -> None:
    """Requests go to every URL: one serving another package would mix its features in."""
    from harness.bad_server import BadServer
    from histoserve.remote.dispatch import RetryPolicy

    one = RetryPolicy(max_attempts=1)
    a, b = "a" * 64, "b" * 64
    with (
        BadServer(config=_served(a)) as first,
        BadServer(config=_served(a)) as same,
        BadServer(config=_served(b)) as other,
        BadServer(config=_served(a, mpp=0.25)) as respec,
    ):
        info = fetch_server_info([first.url, same.url + "/"], None, 5.0, one)
        assert info.package_sha256 == a and len(same.seen_headers) == 1  # asked too
        with pytest.raises(UsageError) as error:
            fetch_server_info([first.url, same.url, other.url], "h0-mini", 5.0, one)
        message = str(error.value)
        assert f"--url {first.url} and --url {other.url} serve different models" in message
        assert f"package {a} vs package {b}" in message
        with pytest.raises(UsageError, match=f"one package {a}, but specs differing in mpp"):
            fetch_server_info([first.url, respec.url], None, 5.0, one)
        with pytest.raises(HistoserveError, match="every --url is asked before any slide") as down:
            fetch_server_info([first.url, "http://127.0.0.1:9"], None, 5.0, one)
        assert not isinstance(down.value, UsageError)  # exit 1: may be up on the next try


def test_grpc_metadata_is_compared_by_shapes_only() -> None:
    from histoserve.remote.served_model import check_same_model

    pixels = {"name": "pixels", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}
    http = info_from_config("h0-mini", _served("a" * 64))
    grpc = info_from_metadata("grpc://h:1", "h0-mini", [pixels], [EMBEDDING])
    check_same_model([("http://h:2", http), ("grpc://h:1", grpc)])
    check_same_model([("grpc://h:1", grpc), ("grpc://h:3", grpc)])
    wide = {**EMBEDDING, "shape": [-1, 768]}
    other = info_from_metadata("grpc://h:3", "h0-mini", [pixels], [wide])
    with pytest.raises(UsageError) as error:
        check_same_model([("http://h:2", http), ("grpc://h:3", other)])
    assert "--url http://h:2 and --url grpc://h:3 serve different models" in str(error.value)
    assert "output 'embedding' FP32 [-1, 1536] vs FP32 [-1, 768]" in str(error.value)
    assert "gRPC metadata (no package digest: only shapes compared)" in str(error.value)
    big = {**pixels, "shape": [-1, 448, 448, 3]}
    with pytest.raises(UsageError, match="tile size 224 vs 448"):
        check_same_model(
            [("grpc://h:1", grpc), ("grpc://h:4", info_from_metadata("g", "m", [big], [EMBEDDING]))]
        )


def test_where_jpeg_tiles_are_decoded_comes_from_the_config_and_mixed_urls_say_so() -> None:
    """``jpeg_decode``: absent is the CPU, gRPC metadata cannot tell, two URLs differing is mixed."""
    from harness.bad_server import BadServer
    from histoserve.remote.dispatch import RetryPolicy

    assert info_from_config("h0-mini", _config("h0-mini")).jpeg_decode == "cpu"
    device = info_from_config("h0-mini", _config("h0-mini", jpeg_decode="device"))
    assert device.jpeg_decode == "device"
    pixels = {"name": "pixels", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}
    assert info_from_metadata("grpc://h:1", "h0-mini", [pixels], [EMBEDDING]).jpeg_decode == ""
    one, a = RetryPolicy(max_attempts=1), "a" * 64
    with (
        BadServer(config=_served(a)) as cpu,
        BadServer(config={**_served(a), "jpeg_decode": "cpu"}) as also_cpu,
        BadServer(config={**_served(a), "jpeg_decode": "device"}) as on_device,
    ):
        assert fetch_server_info([cpu.url, also_cpu.url], None, 5.0, one).jpeg_decode == "cpu"
        mixed = fetch_server_info([cpu.url, on_device.url], None, 5.0, one)
    assert mixed.jpeg_decode == "mixed" and mixed.package_sha256 == a


def test_with_no_model_named_the_encoder_is_the_one_served_besides_the_runs_others() -> None:
    """One server serving the encoder, the tissue model and the slide head: ``embed`` names
    the last two, so the first needs no ``--model``; two left over is still a usage error."""
    from histoserve.remote.request import Request
    from histoserve.remote.served_model import describe

    def send(url: str, request: Request) -> Any:
        if request.kind == "models":
            return ["abmil-demo", "h0-mini", "tissue-seg"]
        assert request.kind == "config" and request.model == "h0-mini"
        return _served("a" * 64)

    info, _ = describe(["http://h:1"], None, send, besides=("tissue-seg", "abmil-demo"))
    assert info.model == "h0-mini"
    with pytest.raises(UsageError, match=r"serves 2 models besides tissue-seg \(abmil-demo, h0-m"):
        describe(["http://h:1"], None, send, besides=("tissue-seg",))
    with pytest.raises(UsageError, match=r"serves 3 models .*pick one with --model"):
        describe(["http://h:1"], None, send)
