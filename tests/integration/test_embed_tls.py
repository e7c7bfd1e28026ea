"""``histoserve embed`` against endpoints that demand TLS and a token (``harness.tls``).

Real parts: a real histoserve server on loopback, behind an HTTPS reverse
proxy and a gRPC TLS proxy with a test CA made in the test; the CLI in its own
interpreter. The proxies refuse requests without the bearer token and the
extra header, and answer the first inference calls 503 / ``UNAVAILABLE`` so
that retries are exercised too. The token must appear in no output: stdout,
stderr (where warnings and logs go), ``status.csv`` or any file written.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import h5py
import pytest

from harness import slides
from harness.bad_server import BadServer
from harness.embed import by_status, run_embed, status_rows
from harness.server import Server
from harness.tls import GrpcTlsProxy, HttpsProxy, Pki, make_pki

pytestmark = pytest.mark.integration
HEADER = ("X-Lab", "pathology-7")
RETRIES = 2


@pytest.fixture(scope="module")
def token() -> str:
    return "tok-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    return slides.generic_tiff(tmp_path_factory.mktemp("tls-slides") / "tls.tiff")


@pytest.fixture()
def https(embedding_server: Server, pki: Pki, token: str) -> Iterator[HttpsProxy]:
    proxy = HttpsProxy(embedding_server.base, pki, token, dict([HEADER]), fail_first=RETRIES)
    yield proxy
    proxy.stop()


@pytest.fixture()
def grpcs(embedding_server: Server, pki: Pki, token: str) -> Iterator[GrpcTlsProxy]:
    proxy = GrpcTlsProxy(embedding_server.grpc_url, pki, token, dict([HEADER]), fail_first=RETRIES)
    yield proxy
    proxy.stop()


def _no_token_anywhere(token: str, result: object, out: Path) -> None:
    assert token not in result.stdout and token not in result.stderr  # type: ignore[attr-defined]
    for path in out.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HISTOSERVE_TOKEN"}
    if token is not None:
        env["HISTOSERVE_TOKEN"] = token
    return env


def test_https_with_ca_token_file_and_header(
    https: HttpsProxy, pki: Pki, token: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", https.url, "--out", out, "--ca-cert", pki.ca_cert,
        "--token-file", token_file, "--header", f"{HEADER[0]}: {HEADER[1]}",
        "--batch-size", "8", "--progress", "plain", env=_env(None),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(out)) == {"done": ["tls"]}
    with h5py.File(out / "tls.h5", "r") as f:
        assert f["features"].shape[0] > 0
    seen = https.seen.requests
    assert https.seen.failed_on_purpose == RETRIES
    assert any(path.endswith("/config") for path, _ in seen)
    assert sum(path.endswith("/infer") for path, _ in seen) > RETRIES
    assert all(ok for _, ok in seen), seen  # every request and retry carried the token
    _no_token_anywhere(token, result, out)


def test_grpcs_with_token_from_the_environment(
    grpcs: GrpcTlsProxy, pki: Pki, token: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", grpcs.url, "--out", out, "--ca-cert", pki.ca_cert,
        "--header", f"{HEADER[0]}: {HEADER[1]}", "--model", "h0-mini", "--target-mpp", "0.5",
        "--batch-size", "8", env=_env(token),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(out)) == {"done": ["tls"]}
    seen = grpcs.seen.requests
    assert grpcs.seen.failed_on_purpose == RETRIES
    assert any(m.endswith("/ModelConfig") for m, _ in seen)  # described over gRPC too
    assert sum(m.endswith("/ModelInfer") for m, _ in seen) > RETRIES
    assert all(ok for _, ok in seen), seen
    _no_token_anywhere(token, result, out)


def test_refused_without_token_or_ca(
    https: HttpsProxy, grpcs: GrpcTlsProxy, pki: Pki, token: str, slide: slides.GeneratedSlide,
    tmp_path: Path,
) -> None:  # fmt: skip
    no_token = run_embed(
        slide.path, "--url", https.url, "--out", tmp_path / "a", "--ca-cert", pki.ca_cert,
        env=_env(None),
    )  # fmt: skip
    assert no_token.returncode == 1 and "401" in no_token.stderr
    no_ca = run_embed(slide.path, "--url", https.url, "--out", tmp_path / "b", env=_env(token))
    assert no_ca.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in no_ca.stderr
    _no_token_anywhere(token, no_ca, tmp_path / "b")
    grpc_no_token = run_embed(
        slide.path, "--url", grpcs.url, "--out", tmp_path / "c", "--ca-cert", pki.ca_cert,
        "--model", "h0-mini", "--target-mpp", "0.5", env=_env(None),
    )  # fmt: skip
    assert grpc_no_token.returncode == 1 and "UNAUTHENTICATED" in grpc_no_token.stderr


def test_a_token_over_plain_http_gives_one_warning_and_is_never_shown(
    embedding_server: Server, token: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", embedding_server.base, "--url", embedding_server.base + "/",
        "--out", out, "--header", f"{HEADER[0]}: {HEADER[1]}", env=_env(token),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "unencrypted" in line]
    assert len(warnings) == 1, result.stderr
    assert f"go unencrypted to {embedding_server.base}" in warnings[0]
    assert HEADER[1] not in warnings[0]
    _no_token_anywhere(token, result, out)


def test_a_server_quoting_the_refused_token_in_an_answer_does_not_leak_it(
    embedding_server: Server, token: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """Its 401 fails the slide: the message in status.csv and report.html has *** instead."""
    out = tmp_path / "out"
    with BadServer(embedding_server.base, echo_credentials={"POST"}) as fake:
        result = run_embed(slide.path, "--url", fake.url, "--out", out, env=_env(token))
        assert fake.seen_headers[-1]["Authorization"] == f"Bearer {token}"  # it was sent
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed"
    assert "HTTP 401: invalid credentials Bearer ***" in row["error"], row["error"]
    assert (out / "report.html").is_file()
    _no_token_anywhere(token, result, out)
