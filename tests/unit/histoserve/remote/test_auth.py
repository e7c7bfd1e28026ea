"""Credentials: where the token comes from, header parsing, and secrets kept out of reprs."""

from __future__ import annotations

from pathlib import Path

import pytest

from histoserve.commands.embed import build_parser, config_from_args
from histoserve.errors import UsageError
from histoserve.remote.auth import Credentials, load_credentials, parse_header

SECRET = "s3cr3t-token-value"


def test_token_file_wins_over_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  {SECRET}\n")
    creds = load_credentials(None, token_file, [], {"HISTOSERVE_TOKEN": "other"})
    assert creds.token == SECRET
    assert load_credentials(None, None, [], {"HISTOSERVE_TOKEN": "other"}).token == "other"
    assert load_credentials(None, None, [], {}).http_headers() == {}


def test_headers_and_metadata() -> None:
    creds = Credentials(None, SECRET, (parse_header("X-Lab:  a: b "),))
    assert creds.http_headers() == {"Authorization": f"Bearer {SECRET}", "X-Lab": "a: b"}
    assert creds.grpc_metadata() == {"authorization": f"Bearer {SECRET}", "x-lab": "a: b"}


@pytest.mark.parametrize("text", ["no colon", ": value", "Bad Name: v", "Host: x"])
def test_bad_headers_are_usage_errors_that_never_show_the_value(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_header(text + SECRET)
    assert SECRET not in str(info.value)


def test_bad_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--ca-cert"):
        load_credentials(tmp_path / "missing.pem", None, [], {})
    with pytest.raises(UsageError, match="--token-file"):
        load_credentials(None, tmp_path / "missing", [], {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match="empty"):
        load_credentials(None, tmp_path / "empty", [], {})


def test_no_secret_in_any_repr(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET)
    args = build_parser().parse_args(
        ["s.svs", "--url", "https://h:1", "--out", str(tmp_path), "--token-file", str(token_file),
         "--header", f"X-Key: {SECRET}-2"]
    )  # fmt: skip
    config = config_from_args(args, {})
    assert config.credentials is not None and config.credentials.token == SECRET
    assert SECRET not in repr(config) and SECRET not in repr(config.credentials)
    assert SECRET not in str(config)


def test_grpcs_urls_are_accepted(tmp_path: Path) -> None:
    args = build_parser().parse_args(["s.svs", "--url", "grpcs://h:443", "--out", str(tmp_path)])
    assert config_from_args(args, {}).urls == ("grpcs://h:443",)


HOSTILE = {
    "crlf": "\r\nX-Injected: 1",
    "nul": "\x00tail",
    "tab": "\ttail",
    "del": "\x7ftail",
    "c1": "\x85tail",
    "zero-width-space": "\u200btail",
    "non-latin-1": "-пароль",
    "very-long": "a" * 100_000,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_header_values_name_the_header_never_the_value(kind: str) -> None:
    with pytest.raises(UsageError) as info:
        load_credentials(None, None, ["X-Lab: fine", f"X-Key: {SECRET}{HOSTILE[kind]}"], {})
    message = str(info.value)
    assert message.startswith("--header 'X-Key': ") and SECRET not in message


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_tokens_name_where_the_token_came_from(kind: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{SECRET}{HOSTILE[kind]}\n", encoding="utf-8")
    with pytest.raises(UsageError) as from_file:
        load_credentials(None, token_file, [], {})
    assert str(from_file.value).startswith(f"the token from --token-file {token_file}: ")
    with pytest.raises(UsageError) as from_env:
        load_credentials(None, None, [], {"HISTOSERVE_TOKEN": f"{SECRET}{HOSTILE[kind]}"})
    assert str(from_env.value).startswith("the token from $HISTOSERVE_TOKEN: ")
    assert SECRET not in str(from_file.value) + str(from_env.value)


def test_the_python_api_gets_the_same_checks() -> None:
    with pytest.raises(UsageError, match=r"^the token: character 4 is a control"):
        Credentials(token="abc\ndef")
    with pytest.raises(UsageError, match=r"^--header 'X-Key': character 1 is outside latin-1"):
        Credentials(headers=(("X-Key", "\u200b"),))
    with pytest.raises(UsageError, match="ASCII letters"):
        Credentials(headers=(("X-Kéy", "v"),))  # httpx would raise UnicodeEncodeError


def test_names_are_ascii_and_a_header_without_colon_is_not_echoed() -> None:
    with pytest.raises(UsageError) as info:
        parse_header(f"X-Kéy: {SECRET}")
    assert "ASCII letters" in str(info.value) and SECRET not in str(info.value)
    with pytest.raises(UsageError) as info:
        load_credentials(None, None, ["X-A: 1", f"Authorization{SECRET}"], {})
    assert "--header number 2 has no ':'" in str(info.value) and SECRET not in str(info.value)


def test_a_byte_order_mark_and_line_ends_around_the_token_are_dropped(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(b"\xef\xbb\xbf" + SECRET.encode() + b"\r\n")
    assert load_credentials(None, token_file, [], {}).token == SECRET


def _urls_config(urls: tuple[str, ...], creds: Credentials, **extra: object) -> object:
    from histoserve.embedding.config import EmbedConfig

    return EmbedConfig(urls=urls, out_dir=Path("o"), slides=(Path("a.svs"),), credentials=creds,
                       **extra)  # fmt: skip


def test_grpc_needs_printable_ascii_and_its_own_names() -> None:
    latin = Credentials(headers=(("X-Site", "café"),))
    _urls_config(("http://h:1",), latin)  # latin-1 is fine over HTTP
    with pytest.raises(UsageError, match=r"^--header 'X-Site': character 4 is not printable ASCII"):
        _urls_config(("http://h:1", "grpc://h:2"), latin)
    with pytest.raises(UsageError, match="the token from x: character 2 is not printable ASCII"):
        _urls_config(
            ("grpcs://h:2",), Credentials(token="t\xe9st", token_source="the token from x")
        )
    for name in ("grpc-timeout", "X-Trace-Bin"):
        with pytest.raises(UsageError, match=f"--header '{name}': gRPC reserves"):
            _urls_config(("grpc://h:2",), Credentials(headers=((name, "v"),)))
    grpc_x = Credentials(headers=(("grpc-x", "v"),))
    _urls_config(("http://h:1",), grpc_x)  # a name of its own only for gRPC
    with pytest.raises(UsageError, match="gRPC reserves"):  # a gRPC tissue URL counts too
        _urls_config(("http://h:1",), grpc_x, tissue_urls=("grpc://seg:2",), tissue="seg")


def test_ca_cert_needs_a_tls_url(tmp_path: Path) -> None:
    from harness.tls import make_pki

    ca = make_pki(tmp_path).ca_cert
    with pytest.raises(UsageError, match=r"--ca-cert .*\.pem: no https:// or grpcs:// URL"):
        _urls_config(("http://h:1", "grpc://h:2"), Credentials(ca_cert=ca))
    _urls_config(("http://h:1", "grpcs://h:2"), Credentials(ca_cert=ca))
    _urls_config(("http://h:1",), Credentials(ca_cert=ca), tissue_urls=("https://seg:3",))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://user:{SECRET}@h:8080", "'http://***@h:8080'"),
        (f"grpcs://{SECRET}@h:443/", "'grpcs://***@h:443/'"),
        (f"https://h:443/?token={SECRET}", "'https://h:443/***'"),
        (f"http://h:1#{SECRET}", "'http://h:1***'"),
        (f"user:{SECRET}@h:8080", "'***@h:8080'"),  # no scheme: refused, still redacted
        (f"http:/alice:{SECRET}@h:8000", "'http:/***@h:8000'"),  # a mistyped scheme
        (f"htp://alice:{SECRET}@h:8000", "'htp://***@h:8000'"),
        (f"http:alice:{SECRET}@h:8000", "'***@h:8000'"),
        (f"http://alice:a/{SECRET}@h:8000", "'http://***@h:8000'"),  # a '/' in the password
        (f"http://alice:a?{SECRET}@h:8000", "'http://***@h:8000'"),  # a '?' in the password
    ],
)
def test_urls_carrying_secrets_are_refused_redacted(url: str, shown: str) -> None:
    for field in ("urls", "tissue_urls"):
        urls = {"urls": ("http://ok:1",), "tissue_urls": ()} | {field: (url,)}
        with pytest.raises(UsageError) as info:
            _urls_config(urls["urls"], Credentials(), tissue_urls=urls["tissue_urls"])
        assert shown in str(info.value) and SECRET not in str(info.value)
        assert ("--tissue-url" if field == "tissue_urls" else "--url ") in str(info.value)


def test_a_ca_cert_that_is_not_pem_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    from harness.tls import make_pki

    bad = tmp_path / "ca.der"
    bad.write_bytes(b"\x30\x82\x01\x0a not PEM at all")
    with pytest.raises(UsageError) as info:
        _urls_config(("https://h:1",), load_credentials(bad, None, [], {}))
    assert f"--ca-cert {bad}: not a PEM CA bundle" in str(info.value)
    good = load_credentials(make_pki(tmp_path / "pki").ca_cert, None, [], {})
    _urls_config(("https://h:1",), good)
    assert good.httpx_verify() is good.httpx_verify()  # built once, shared by every client


def test_server_messages_are_scrubbed_of_every_secret() -> None:
    creds = Credentials(token=SECRET, headers=(("X-Key", "k3y-value"), ("X-N", "7")))
    text = f"refused Bearer {SECRET} with X-Key k3y-value (7 tries)"
    assert creds.scrub(text) == "refused Bearer *** with X-Key *** (7 tries)"


def test_one_warning_for_credentials_over_plain_urls(caplog: pytest.LogCaptureFixture) -> None:
    from histoserve.remote.auth import warn_if_plaintext

    creds = Credentials(token=SECRET, headers=(("X-Key", "k3y-value"),))
    with caplog.at_level("WARNING", logger="histoserve.embed"):
        warn_if_plaintext(creds, ("http://a:1", "grpc://b:2", "https://c:3", "http://a:1"))
        warn_if_plaintext(creds, ("https://c:3", "grpcs://d:4"))
        warn_if_plaintext(Credentials(), ("http://a:1",))
    (record,) = caplog.records
    message = record.getMessage()
    assert "bearer token and --header values go unencrypted to grpc://b:2" in message
    assert "1 other plain URL" in message
    assert SECRET not in message and "k3y-value" not in message


def test_latin1_values_go_on_the_wire_as_latin1() -> None:
    from harness.bad_server import BadServer
    from histoserve.remote.http import new_client

    creds = load_credentials(None, None, ["X-Site: Zürich"], {"HISTOSERVE_TOKEN": "tök"})
    with BadServer(config={"name": "m"}) as fake, new_client(fake.url, 5.0, creds) as client:
        assert client.get("/v1/models").status_code == 200
        seen = fake.seen_headers[0]
    assert (seen["X-Site"], seen["Authorization"]) == ("Zürich", "Bearer tök")
