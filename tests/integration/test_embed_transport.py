"""``histoserve embed --transport``: the slide's own JPEG tiles on the wire, decoded by the server.

Real parts: Aperio-style SVS with shared JPEG tables (:mod:`harness.jpeg_slides`),
a deflate TIFF (OpenSlide only), the session's embedding server on loopback,
the CLI in its own interpreter, a recording HTTP proxy that counts request
bodies. Slide B has a level at the model's 0.5 um/px; slide A is read at
level 0 (448 px) and resized bicubic, on the server with jpeg transport.

Where the server decodes JPEG tiles (``jpeg_decode``): no GPU here, so a
server that decodes on the device cannot be had. :class:`harness.bad_server.BadServer`
in front of the real server stands in for one (``jpeg_decode="device"``:
its config and answers say ``device``, the real server behind it decodes on
the CPU) and for a replica answering with another decode than its config
(``tamper="decode"``). Everything else is real.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from harness import jpeg_slides
from harness.bad_server import BadServer
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.recording_proxy import RecordingProxy
from harness.server import Server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jpeg_slides.slides_a_and_b(tmp_path_factory.mktemp("transport-slides"))


def _embed(
    server: Server | BadServer, out: Path, *args: str | Path, **kw: object
) -> dict[str, list[str]]:
    url = server.base if isinstance(server, Server) else server.url
    result = run_embed(*args, "--url", url, "--out", out, "--batch-size", "8", **kw)
    assert result.returncode in (0, 1), result.stderr
    return by_status(status_rows(out))


@pytest.mark.parametrize("slide", ["b", "a"])
def test_jpeg_transport_features_equal_the_pixel_path(
    embedding_server: Server, folder: Path, tmp_path: Path, slide: str
) -> None:
    outputs = {}
    for transport in ("jpeg", "pixels"):
        out = tmp_path / transport
        # one request in flight: each request is one server batch of the same tiles either way
        status = _embed(
            embedding_server, out, folder / f"{slide}.svs", "--transport", transport,
            "--concurrency", "1",
        )  # fmt: skip
        assert status["done"] == [slide]
        outputs[transport] = read_output(out / f"{slide}.h5")
    jpeg, pixels = outputs["jpeg"], outputs["pixels"]
    assert jpeg["attrs"]["transport"] == "jpeg" and pixels["attrs"]["transport"] == "pixels"
    assert len(jpeg["coords"]) > 0
    np.testing.assert_array_equal(jpeg["coords"], pixels["coords"])
    np.testing.assert_array_equal(jpeg["features"], pixels["features"])


def test_auto_takes_jpeg_where_it_applies_and_pixels_otherwise(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    paths = (folder / "b.svs", folder / "deflate.tif")
    assert sorted(_embed(embedding_server, tmp_path / "auto", *paths)["done"]) == ["b", "deflate"]
    used = {
        n: read_output(tmp_path / "auto" / f"{n}.h5")["attrs"]["transport"]
        for n in ("b", "deflate")
    }
    assert used == {"b": "jpeg", "deflate": "pixels"}
    area = _embed(embedding_server, tmp_path / "area", folder / "a.svs", "--resize", "area")
    assert area["done"] == ["a"]
    assert read_output(tmp_path / "area" / "a.h5")["attrs"]["transport"] == "pixels"
    forced = _embed(
        embedding_server, tmp_path / "forced", folder / "deflate.tif", "--transport", "jpeg"
    )
    assert forced.get("failed") == ["deflate"]
    error = status_rows(tmp_path / "forced")[-1]["error"]
    assert "--transport jpeg" in error and "natively" in error


def _infer_bytes(proxy: RecordingProxy) -> int:
    posts = [s for s in proxy.seen if s["method"] == "POST" and s["url"].endswith("/infer")]
    assert posts
    return sum(
        int(s["headers"].get("content-length") or s["headers"]["Content-Length"]) for s in posts
    )


def test_jpeg_request_bytes_are_at_most_a_third_of_raw_at_a_matching_level(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    sent = {}
    for transport in ("jpeg", "pixels"):
        with RecordingProxy() as proxy:
            env_t = {**env, "HTTP_PROXY": proxy.url, "ALL_PROXY": proxy.url}
            out = tmp_path / transport
            status = _embed(
                embedding_server, out, folder / "b.svs", "--transport", transport,
                "--trust-env", env=env_t,
            )  # fmt: skip
            assert status["done"] == ["b"]
            sent[transport] = _infer_bytes(proxy)
    assert sent["jpeg"] * 3 <= sent["pixels"], sent


def _error(out: Path) -> str:
    return status_rows(out)[-1]["error"]


def test_jpeg_device_takes_only_a_server_that_says_it_decodes_on_the_device(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """A cohort never mixes device-decoded features with the CPU's, and each file says which.

    The device server is a stand-in (see the module docstring).
    """
    slide = folder / "b.svs"
    with BadServer(embedding_server.base, jpeg_decode="device") as device:
        on_device = _embed(device, tmp_path / "device", slide, "--transport", "jpeg-device")
        auto = _embed(device, tmp_path / "auto", slide)
        jpeg = _embed(device, tmp_path / "jpeg", slide, "--transport", "jpeg")
    assert on_device == {"done": ["b"]} and auto == {"done": ["b"]}
    assert read_output(tmp_path / "device/b.h5")["attrs"]["transport"] == "jpeg-device"
    assert read_output(tmp_path / "auto/b.h5")["attrs"]["transport"] == "pixels"
    assert jpeg == {"failed": ["b"]}
    error = _error(tmp_path / "jpeg")
    assert "--transport jpeg: the server does not decode JPEG tiles on the CPU" in error
    assert "jpeg_decode 'device'" in error and "use --transport jpeg-device" in error
    cpu = _embed(embedding_server, tmp_path / "cpu", slide, "--transport", "jpeg-device")
    assert cpu == {"failed": ["b"]}
    error = _error(tmp_path / "cpu")
    assert (
        "--transport jpeg-device: the server does not say it decodes JPEG tiles on the device"
        in error
    )
    assert "jpeg_decode 'cpu'" in error and "--transport jpeg or auto" in error
    assert not list((tmp_path / "jpeg").rglob("*.h5")) and not list(
        (tmp_path / "cpu").rglob("*.h5")
    )


def test_a_folder_of_device_decoded_features_refuses_another_transport(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """``jpeg-device`` is a recorded setting of its own: a run with another is a settings mismatch."""
    out = tmp_path / "out"
    with BadServer(embedding_server.base, jpeg_decode="device") as device:
        first = _embed(device, out, folder / "b.svs", "--transport", "jpeg-device")
        assert first == {"done": ["b"]}
        for transport in ("auto", "jpeg", "pixels"):
            result = run_embed(
                folder / "b.svs", "--url", device.url, "--out", out, "--transport", transport
            )
            assert result.returncode == 2, result.stderr
            assert f"transport (--transport): jpeg-device -> {transport}" in result.stderr
            assert "Traceback" not in result.stderr
    assert len(status_rows(out)) == 1


@pytest.mark.parametrize(("claim", "transport"), [(None, "jpeg"), ("device", "jpeg-device")])
def test_answers_naming_another_jpeg_decode_are_retried_and_never_written(
    embedding_server: Server, folder: Path, tmp_path: Path, claim: str | None, transport: str
) -> None:
    """A replica decoding elsewhere than the config says (a stand-in: ``tamper="decode"``).

    One such answer is retried; when every answer is one, the slide fails and
    nothing is written. Pixel requests are not asked where tiles were decoded.
    """
    slide, retry = folder / "b.svs", ("--max-attempts", "2")
    want, flag = ("cpu", "jpeg or auto") if transport == "jpeg" else ("device", transport)
    with BadServer(embedding_server.base, jpeg_decode=claim, tamper="decode", times=1) as once:
        assert _embed(once, tmp_path / "once", slide, "--transport", transport) == {"done": ["b"]}
        assert once.tampered == 1
    with BadServer(embedding_server.base, jpeg_decode=claim, tamper="decode") as always:
        failed = _embed(always, tmp_path / "always", slide, "--transport", transport, *retry)
        pixels = _embed(always, tmp_path / "pixels", slide, "--transport", "pixels")
    assert failed == {"failed": ["b"]} and not list((tmp_path / "always").rglob("*.h5"))
    error = _error(tmp_path / "always")
    assert f"{always.url}: decoded the request's JPEG tiles on " in error
    assert f"(parameters.jpeg_decode), not on '{want}' as --transport {flag} asks" in error
    assert pixels == {"done": ["b"]}


def test_a_grpc_only_run_takes_jpeg_and_its_answers_say_cpu(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    """Over gRPC the server's config (``ModelConfig``) says where tiles are decoded: jpeg goes,
    its answers are checked; jpeg-device, the opt-in to device-decoded features, is refused
    by a server that says it decodes on the CPU."""
    url = f"grpc://{embedding_server.grpc_url}"
    flags = ("--model", "h0-mini", "--target-mpp", "0.5", "--batch-size", "8")
    for transport in ("jpeg", "jpeg-device"):
        out = tmp_path / transport
        result = run_embed(
            folder / "b.svs", "--url", url, "--out", out, "--transport", transport, *flags
        )
        assert result.returncode in (0, 1), result.stderr
    assert by_status(status_rows(tmp_path / "jpeg")) == {"done": ["b"]}
    assert read_output(tmp_path / "jpeg/b.h5")["attrs"]["transport"] == "jpeg"
    assert by_status(status_rows(tmp_path / "jpeg-device")) == {"failed": ["b"]}
    assert "its config: jpeg_decode 'cpu'" in _error(tmp_path / "jpeg-device")
