"""``histoserve embed`` given hostile credentials: exit 2 naming the header, the value nowhere.

Outside-in: the CLI in its own interpreter with header values and tokens a
careless user, a broken editor or an attacker would give (a CR/LF that would
split the request, a NUL, an invisible U+200B, a character outside latin-1,
100 KB), from ``--header``, ``--token-file`` and ``$HISTOSERVE_TOKEN``. Each
is a usage error (exit 2) whose message names the header (or where the token
came from) and never the value: the secret is checked to be absent from
stdout, stderr and every file under ``--out``. Then URLs carrying a
password, ``--ca-cert`` with no TLS URL, and refusals (401 /
``UNAUTHENTICATED``) from the token-checking gate of :mod:`harness.tls` and
from a fake server that quotes the token it refused
(:class:`harness.bad_server.BadServer`): the token is never shown.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import slides
from harness.bad_server import BadServer
from harness.embed import run_embed
from harness.tls import GrpcTlsProxy, HttpsProxy, Pki, make_pki

pytestmark = pytest.mark.integration
NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a usage error must come first
EXIT_USAGE = 2
HOSTILE = {
    "crlf": "\r\nX-Injected: 1",
    "zero-width-space": "\u200b-tail",
    "non-latin-1": "-пароль",
    "very-long": "a" * 100_000,
}


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    return slides.generic_tiff(tmp_path_factory.mktemp("cred-slides") / "c.tiff")


@pytest.fixture
def secret() -> str:
    return "s3cr3t-" + secrets.token_hex(12)


def _env(token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HISTOSERVE_TOKEN"}
    if token is not None:
        env["HISTOSERVE_TOKEN"] = token
    return env


def _nowhere(secret: str, result: object, out: Path) -> None:
    """``secret`` in neither stream nor any file under ``out`` (status.csv, report.html, ...)."""
    assert secret not in result.stdout and secret not in result.stderr  # type: ignore[attr-defined]
    for path in out.rglob("*") if out.exists() else ():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def _usage_error(result: object, named: str) -> None:
    assert result.returncode == EXIT_USAGE, result.stderr  # type: ignore[attr-defined]
    assert named in result.stderr, result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in result.stderr  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_header_values(
    kind: str, secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", NOWHERE, "--out", out, "--header", "X-Lab: fine",
        "--header", f"X-Key: {secret}{HOSTILE[kind]}", env=_env(),
    )  # fmt: skip
    _usage_error(result, "--header 'X-Key'")
    _nowhere(secret, result, out)


@pytest.mark.parametrize("kind", [*sorted(HOSTILE), "nul"])
def test_hostile_token_files(
    kind: str, secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(secret + HOSTILE.get(kind, "\x00tail") + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", NOWHERE, "--out", out, "--token-file", token_file, env=_env()
    )
    _usage_error(result, f"the token from --token-file {token_file}")
    _nowhere(secret, result, out)


@pytest.mark.parametrize("kind", ["crlf", "zero-width-space", "non-latin-1"])
def test_hostile_tokens_from_the_environment(
    kind: str, secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(slide.path, "--url", NOWHERE, "--out", out,
                       env=_env(secret + HOSTILE[kind]))  # fmt: skip
    _usage_error(result, "the token from $HISTOSERVE_TOKEN")
    _nowhere(secret, result, out)


def test_grpc_metadata_must_be_printable_ascii(
    secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(
        slide.path, "--url", "grpc://127.0.0.1:9", "--out", out, "--model", "m",
        "--target-mpp", "0.5", "--header", f"X-Site: Zürich-{secret}", env=_env(),
    )  # fmt: skip
    _usage_error(result, "--header 'X-Site': character 2 is not printable ASCII")
    _nowhere(secret, result, out)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://alice:{secret}@127.0.0.1:9", "http://***@127.0.0.1:9"),
        ("http:/alice:{secret}@127.0.0.1:9", "http:/***@127.0.0.1:9"),  # a mistyped scheme
    ],
)
def test_a_password_in_a_url_is_refused_and_never_shown(
    url: str, shown: str, secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_embed(slide.path, "--url", url.format(secret=secret), "--out", out, env=_env())
    _usage_error(result, f"--url '{shown}': a user name or password")
    _nowhere(secret, result, out)
    assert "alice" not in result.stderr


def test_a_ca_cert_that_is_not_pem_is_a_usage_error_naming_it(
    slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.der"
    ca.write_bytes(b"\x30\x82\x03\x1e DER, not PEM")
    result = run_embed(slide.path, "--url", "https://127.0.0.1:9", "--out", tmp_path / "out",
                       "--ca-cert", ca, env=_env())  # fmt: skip
    _usage_error(result, f"--ca-cert {ca}: not a PEM CA bundle")


def test_a_token_straddling_where_a_server_message_is_cut_leaves_no_prefix(
    secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """The message is scrubbed whole, then cut: no first characters of the token survive."""
    out = tmp_path / "out"
    before = 500 - len("Bearer ") - 12  # the client quotes 500 characters: 12 of the token
    fake = BadServer(config={"name": "h0-mini"}, echo_credentials={"GET"}, echo_after_chars=before)
    with fake:
        result = run_embed(slide.path, "--url", fake.url, "--out", out, "--max-attempts", "1",
                           env=_env(secret))  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "HTTP 401: ....." in result.stderr and "Bearer ***" in result.stderr, result.stderr
    assert secret[:12] not in result.stderr and secret[:12] not in result.stdout
    _nowhere(secret, result, out)


def test_ca_cert_with_only_plain_urls_is_a_usage_error(
    slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not needed: refused before it is read\n")
    result = run_embed(slide.path, "--url", NOWHERE, "--out", tmp_path / "out",
                       "--ca-cert", ca, env=_env())  # fmt: skip
    _usage_error(result, "no https:// or grpcs:// URL to verify with it")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("cred-pki"))


@pytest.fixture
def gates(pki: Pki) -> Iterator[tuple[HttpsProxy, GrpcTlsProxy]]:
    """Token-checking gates; nothing behind them (a refused request never gets there)."""
    https = HttpsProxy(NOWHERE, pki, "the-right-token")
    grpcs = GrpcTlsProxy("127.0.0.1:9", pki, "the-right-token")
    yield https, grpcs
    https.stop()
    grpcs.stop()


def test_a_wrong_token_is_refused_and_never_shown(
    gates: tuple[HttpsProxy, GrpcTlsProxy],
    pki: Pki,
    secret: str,
    slide: slides.GeneratedSlide,
    tmp_path: Path,
) -> None:
    https, grpcs = gates
    out = tmp_path / "https"
    result = run_embed(slide.path, "--url", https.url, "--out", out, "--ca-cert", pki.ca_cert,
                       env=_env(secret))  # fmt: skip
    assert result.returncode == 1 and "HTTP 401" in result.stderr, result.stderr
    assert https.seen.requests and not any(ok for _, ok in https.seen.requests)
    _nowhere(secret, result, out)
    out = tmp_path / "grpcs"
    result = run_embed(
        slide.path, "--url", grpcs.url, "--out", out, "--ca-cert", pki.ca_cert,
        "--model", "h0-mini", "--target-mpp", "0.5", env=_env(secret),
    )  # fmt: skip
    assert result.returncode == 1 and "UNAUTHENTICATED" in result.stderr, result.stderr
    _nowhere(secret, result, out)


def test_a_server_quoting_the_refused_token_does_not_leak_it(
    secret: str, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with BadServer(config={"name": "h0-mini"}, echo_credentials={"GET"}) as fake:
        result = run_embed(slide.path, "--url", fake.url, "--out", out, "--max-attempts", "1",
                           env=_env(secret))  # fmt: skip
        assert fake.seen_headers and fake.seen_headers[0]["Authorization"] == f"Bearer {secret}"
    assert result.returncode == 1, result.stderr
    assert "HTTP 401: invalid credentials Bearer ***" in result.stderr
    _nowhere(secret, result, out)
