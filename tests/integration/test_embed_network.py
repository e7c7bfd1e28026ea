"""``histoserve embed`` against a network that misbehaves: bounded answers, real deadlines, no proxy.

The misbehaving server is :class:`harness.bad_server.BadServer`, a fake (the
real server cannot be made to send a 512 MiB answer, a gzip bomb or a byte a
second) in front of the real ``embedding_server``: model list and config are
the real ones. The proxy is :class:`harness.recording_proxy.RecordingProxy`,
a fake forward proxy that records what reaches it. Every run is the real CLI
in its own process.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import httpx
import pytest

from harness import slides
from harness.bad_server import BadServer
from harness.embed import by_status, run_embed, run_embed_measured, status_rows
from harness.recording_proxy import RecordingProxy
from harness.server import Server

pytestmark = pytest.mark.integration
TOKEN = "n3tw0rk-t0ken-0123456789"
PEAK_RSS_MB = 400


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    return slides.generic_tiff(tmp_path_factory.mktemp("network") / "s.tiff")


def _failed_reason(out: Path) -> str:
    rows = status_rows(out)
    assert by_status(rows) == {"failed": ["s"]}, rows
    return rows[0]["error"]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("huge", r"an answer of 536,870,912 bytes, more than the [\d,]+ this request can need"),
        ("unsized", r"an answer of more than the [\d,]+ bytes this request can need"),
        ("gzip", r"a 'gzip'-encoded answer \(identity was asked for\)"),
    ],
)
def test_an_oversized_answer_fails_the_slide_in_bounded_memory(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path, kind: str, reason: str
) -> None:
    out = tmp_path / "out"
    with BadServer(embedding_server.base, tamper=kind) as fake:
        done, peak_mb = run_embed_measured(
            slide.path, "--url", fake.url, "--out", out, "--max-attempts", "2"
        )
        streamed = fake.bytes_sent
    assert done.returncode == 1, done.stderr
    assert re.search(reason, _failed_reason(out)), _failed_reason(out)
    assert peak_mb < PEAK_RSS_MB, f"peak {peak_mb:.0f} MB"
    assert streamed < 64 << 20, f"{streamed:,} bytes sent before the client stopped reading"
    assert not list(out.glob("*.h5"))


def test_a_byte_a_second_answer_ends_at_the_requests_deadline(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with BadServer(embedding_server.base, tamper="drip", drip_s=0.5) as fake:
        done = run_embed(
            slide.path,
            *("--url", fake.url, "--out", out, "--timeout-s", "3", "--max-attempts", "1"),
            timeout_s=120,  # the whole answer would take hours
        )
    assert done.returncode == 1, done.stderr
    assert "no whole answer within 3 s" in _failed_reason(out)


def _proxied_env(proxy: RecordingProxy) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return {**env, "HTTP_PROXY": proxy.url, "ALL_PROXY": proxy.url, "HISTOSERVE_TOKEN": TOKEN}


def test_the_environments_proxy_never_sees_the_token_unless_trusted(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    with RecordingProxy() as proxy:
        env = _proxied_env(proxy)
        done = run_embed(
            slide.path, "--url", embedding_server.base, "--out", tmp_path / "a", env=env
        )
        assert done.returncode == 0, done.stderr
        assert proxy.seen == []
        trusted = run_embed(
            slide.path, "--url", embedding_server.base, "--out", tmp_path / "b", "--trust-env",
            env=env,
        )  # fmt: skip
        assert proxy.seen == []
    assert trusted.returncode == 2, trusted.stderr
    assert "would reach the proxy in the clear" in trusted.stderr
    assert TOKEN not in trusted.stderr + trusted.stdout + done.stderr + done.stdout


def test_a_trusted_proxy_carries_requests_without_credentials(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    with RecordingProxy() as proxy:
        env = {**_proxied_env(proxy)}
        del env["HISTOSERVE_TOKEN"]
        done = run_embed(
            slide.path, "--url", embedding_server.base, "--out", tmp_path, "--trust-env", env=env
        )
        seen = list(proxy.seen)
    assert done.returncode == 0, done.stderr
    assert {r["method"] for r in seen} == {"GET", "POST"}
    assert all(r["url"].startswith(embedding_server.base) for r in seen)


@pytest.fixture(scope="module")
def real_config(embedding_server: Server) -> dict:
    name = httpx.get(f"{embedding_server.base}/v1/models").json()["models"][0]
    return httpx.get(f"{embedding_server.base}/v2/models/{name}/config").json()


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("mpp", 0.0, "mpp 0.0"),
        ("mpp", math.nan, "mpp nan"),
        ("mpp", math.inf, "mpp inf"),
        ("mpp", -0.5, "mpp -0.5"),
        ("tile_size", 0, "tile_size 0"),
        ("tile_size", 1 << 20, "tile_size 1048576"),
    ],
)
def test_a_served_config_out_of_range_is_one_message_before_any_slide(
    real_config: dict,
    slide: slides.GeneratedSlide,
    tmp_path: Path,
    field: str,
    value: float,
    said: str,
) -> None:
    config = {**real_config, "spec": {**real_config["spec"], field: value}}
    with BadServer(config=config, source="pixels") as fake:
        done = run_embed(slide.path, "--url", fake.url, "--out", tmp_path / "out")
        requests = fake.infer_requests
    assert done.returncode == 2, done.stderr
    assert f"{fake.url}: model {config['name']!r} reports {said}" in done.stderr
    assert "Traceback" not in done.stderr and requests == 0
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.h5"))


def test_an_oversized_grpc_answer_is_refused_by_the_channel(
    embedding_server: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """64 MiB more than a 4-tile answer: the channel's receive bound refuses it, nothing written."""
    from harness.bad_grpc import BadGrpcServer

    flags = (
        "--model",
        "h0-mini",
        "--target-mpp",
        "0.5",
        "--batch-size",
        "4",
        "--max-attempts",
        "2",
    )
    with BadGrpcServer(embedding_server.grpc_url, pad_bytes=64 << 20) as bad:
        done, peak_mb = run_embed_measured(slide.path, "--url", bad.url, "--out", tmp_path, *flags)
        assert bad.tampered >= 1
    assert done.returncode == 1, done.stderr
    reason = _failed_reason(tmp_path)
    assert "an answer larger than this request can need" in reason, reason
    assert "larger than max" in reason and peak_mb < PEAK_RSS_MB
    assert not list(tmp_path.glob("*.h5"))
