"""Credentials: where the token comes from, header parsing, and secrets kept out of reprs."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.client.embed.auth import Credentials, load_credentials, parse_header
from predictor.client.embed.cli import build_parser, config_from_args
from predictor.client.embed.errors import UsageError

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
